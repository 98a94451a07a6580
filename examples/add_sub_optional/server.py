"""AddSub with optional inputs: `offset` (per sample, default 0) and `scale` (one value per request, default 1)."""

import logging

import numpy as np

from pytriton.decorators import batch, fill_optionals, first_value, group_by_values
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@fill_optionals(offset=np.array([0.0], dtype=np.float32), scale=np.array([1.0], dtype=np.float32))
@batch
@group_by_values("scale")  # requests with different scales are computed separately...
@first_value("scale")  # ...so that scale can be a single number
def _add_sub(a, b, offset, scale):
    return {"add": (a + b) * scale + offset, "sub": (a - b) * scale + offset}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="AddSubOptional",
            infer_func=_add_sub,
            inputs=[
                Tensor(name="a", dtype=np.float32, shape=(-1,)),
                Tensor(name="b", dtype=np.float32, shape=(-1,)),
                Tensor(name="offset", dtype=np.float32, shape=(1,), optional=True),
                Tensor(name="scale", dtype=np.float32, shape=(1,), optional=True),
            ],
            outputs=[
                Tensor(name="add", dtype=np.float32, shape=(-1,)),
                Tensor(name="sub", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=64),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
