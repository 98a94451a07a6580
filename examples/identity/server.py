"""Identity model: returns its inputs (a float vector and a bytes vector) unchanged."""

import logging

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def _identity(data, text):
    return {"data_out": data, "text_out": text}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:  # ports: PYTRITON_TRITON_CONFIG_HTTP_PORT etc., default 8000/8001/8002
        triton.bind(
            model_name="Identity",
            infer_func=_identity,
            inputs=[
                Tensor(name="data", dtype=np.float32, shape=(-1,)),
                Tensor(name="text", dtype=bytes, shape=(-1,)),
            ],
            outputs=[
                Tensor(name="data_out", dtype=np.float32, shape=(-1,)),
                Tensor(name="text_out", dtype=bytes, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=64),
            strict=True,
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
