"""A model whose inference callable is a coroutine (`async def`), awaited on the server's event loop."""

import asyncio
import logging

import numpy as np

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton


async def _lookup(requests):
    """Pretend to await an external service, then answer every request of the batch."""
    await asyncio.sleep(0.01)
    responses = []
    for request in requests:
        x = request["x"]
        responses.append({"doubled": x * 2, "batch_size": np.full((len(x), 1), len(requests), dtype=np.int32)})
    return responses


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="AsyncDouble",
            infer_func=_lookup,
            inputs=[Tensor(name="x", dtype=np.int32, shape=(-1,))],
            outputs=[
                Tensor(name="doubled", dtype=np.int32, shape=(-1,)),
                Tensor(name="batch_size", dtype=np.int32, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=5000)),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
