"""A server with a model of its own; RemoteTriton processes (remote.py) bind theirs into it while it runs."""

import logging

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def identity(data):
    return {"data": data}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="Identity",
            infer_func=identity,
            inputs=[Tensor(name="data", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="data", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
