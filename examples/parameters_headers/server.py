"""A model that reads request parameters and forwarded HTTP headers / gRPC metadata."""

import logging

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def _scale_shift(requests):
    """y = x * parameter `multiplier` + header `x-offset`; every request carries its own values."""
    responses = []
    for request in requests:
        multiplier = request.parameters.get("multiplier", 1)  # a parameter keeps its type (int here)
        offset = float(request.parameters.get("x-offset", 0))  # a header is always a string
        responses.append({"y": (request["x"] * multiplier + offset).astype(np.float32)})
    return responses


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # headers whose name matches the pattern reach the callable in request.parameters
    config = TritonConfig(http_header_forward_pattern="x-.*", grpc_header_forward_pattern="x-.*")
    with Triton(config=config) as triton:
        triton.bind(
            model_name="ScaleShift",
            infer_func=_scale_shift,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
