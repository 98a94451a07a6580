"""Three models in one server: a batching AddSub, a text model and a non-batching Power model."""

import logging

import numpy as np

from pytriton.decorators import batch, sample
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def _add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def _upper(text):
    return {"upper": np.char.upper(text.astype(bytes))}


@sample
def _power(base, exponent):
    return {"power": np.power(base, exponent)}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=_add_sub,
            inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
            outputs=[
                Tensor(name="add", dtype=np.float32, shape=(-1,)),
                Tensor(name="sub", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            model_name="Upper",
            infer_func=_upper,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="upper", dtype=bytes, shape=(1,))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            model_name="Power",
            infer_func=_power,
            inputs=[
                Tensor(name="base", dtype=np.int64, shape=(-1,)),
                Tensor(name="exponent", dtype=np.int64, shape=(1,)),
            ],
            outputs=[Tensor(name="power", dtype=np.int64, shape=(-1,))],
            config=ModelConfig(batching=False),  # no batch axis: @sample gets exactly one request
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
