"""This project's side of the OpenAI streaming bench: a toy decoupled generator of 64 tokens.

    python bench/openai_pytriton.py --http-port 31000 --grpc-port 31001 --metrics-port 31002 [--route v1]

Model `toy`: bytes `text_input` [1] -> bytes `text_output` [1], `ModelConfig(decoupled=True)` (the defaults
otherwise: batching, max_batch_size 4, the default dynamic batcher). Each call yields "tok0 ", "tok1 " ...
"tok63 ", one response each, whatever the prompt (no sleep: what is measured is the server).

`--route v1` binds it with `openai=OpenAIChat(chat_template=None)` (`pytriton.openai`), served at
`POST /v1/chat/completions`; `--route generate_stream` binds it plainly, served at
`POST /v2/models/toy/generate_stream` (the same generator behind the KServe generate extension's server-sent
events); BENCH_OPENAI_ROUTE sets the default. Frontend processes come from PYTRITON_FRONTENDS, as for every
server the bench starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, AsyncIterator, Dict, Iterator, List

# Never import modules from the bench folder by accident (it sits first on sys.path).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig

TOKENS = [np.array([f"tok{index} ".encode()], dtype=object) for index in range(64)]


@batch
def toy(text_input: np.ndarray) -> Iterator[Dict[str, np.ndarray]]:
    """Yields the 64 toy tokens to every request of the batch, one response per token."""
    rows = text_input.shape[0]
    for token in TOKENS:
        yield {"text_output": np.broadcast_to(token, (rows, 1))}


async def toy_on_loop(requests: List[Request]) -> AsyncIterator[List[Dict[str, np.ndarray]]]:
    """The same tokens from an async generator, which the server iterates on its event loop (no thread hop)."""
    for token in TOKENS:
        yield [{"text_output": np.broadcast_to(token, (request["text_input"].shape[0], 1))} for request in requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument(
        "--route", choices=("v1", "generate_stream"), default=os.environ.get("BENCH_OPENAI_ROUTE", "v1")
    )
    parser.add_argument(
        "--on-loop",
        action="store_true",
        default=os.environ.get("BENCH_TOY_ON_LOOP") == "1",
        help="serve the async generator (iterated on the event loop) instead of the sync one (or BENCH_TOY_ON_LOOP=1)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=int(os.environ.get("BENCH_TOY_MAX_BATCH", "4")),
        help="the model's max_batch_size (ModelConfig's default: 4; or BENCH_TOY_MAX_BATCH)",
    )
    args = parser.parse_args()
    extra: Dict[str, Any] = {}
    if args.route == "v1":
        from pytriton.openai import OpenAIChat  # type: ignore[import-not-found,unused-ignore]

        extra["openai"] = OpenAIChat(chat_template=None)
    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
    )
    import pytriton

    print(f"bench openai server: pytriton from {os.path.dirname(pytriton.__file__)}", flush=True)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="toy",
            infer_func=toy_on_loop if args.on_loop else toy,
            inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
            config=ModelConfig(decoupled=True, max_batch_size=args.max_batch_size),
            **extra,
        )
        triton.serve()


if __name__ == "__main__":
    main()
