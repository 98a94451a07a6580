"""A model with two instances: a list of callables, each with its own weights copy and thread."""

import logging
import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


class _LinearInstance:
    """One instance: y = x @ W, plus the number of the instance that computed it."""

    def __init__(self, number, weights):
        self.number = number
        self.weights = weights  # each instance would load its own model, e.g. on its own GPU

    @batch
    def __call__(self, x):
        time.sleep(0.2)  # pretend the model is slow, so that concurrent requests overlap
        y = x @ self.weights
        return {"y": y, "instance": np.full((len(x), 1), self.number, dtype=np.int32)}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    weights = np.arange(12, dtype=np.float32).reshape(4, 3)
    with Triton() as triton:
        triton.bind(
            model_name="Linear",
            infer_func=[_LinearInstance(number, weights) for number in range(2)],  # two instances
            inputs=[Tensor(name="x", dtype=np.float32, shape=(4,))],
            outputs=[
                Tensor(name="y", dtype=np.float32, shape=(3,)),
                Tensor(name="instance", dtype=np.int32, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=4),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
