"""AddSub model: element-wise sum and difference of two float vectors, with dynamic batching."""

import logging

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def _add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=_add_sub,
            inputs=[
                Tensor(name="a", dtype=np.float32, shape=(-1,)),
                Tensor(name="b", dtype=np.float32, shape=(-1,)),
            ],
            outputs=[
                Tensor(name="add", dtype=np.float32, shape=(-1,)),
                Tensor(name="sub", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=128, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
            strict=True,
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
