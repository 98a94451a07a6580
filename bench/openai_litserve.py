"""LitServe's side of the OpenAI streaming bench: a toy generator of 64 tokens behind LitServe's `OpenAISpec`.

    python bench/openai_litserve.py --http-port 31000 [--fast-queue] [--log-level warning]

`POST /v1/chat/completions` streams "tok0 ", "tok1 " ... "tok63 " as content deltas whatever the request asks
(no sleep: what is measured is the server). LitServe's defaults otherwise: `accelerator="cpu"` (what "auto"
picks on a machine without a GPU), one inference worker process, as many API server processes as workers
(one), uvicorn's log level "info" (an access log line per request). `--fast-queue` (ZeroMQ between the API
server and the worker) and `--log-level` are the tuning the bench tried (the `litserve-tuned` target).
`--grpc-port` and `--metrics-port` are accepted and ignored (the bench starts every server with them).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Iterator

# Never import modules from the bench folder by accident (it sits first on sys.path).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import litserve as ls
from litserve.specs.openai import OpenAISpec

TOKENS = [f"tok{index} " for index in range(64)]


class ToyGenerator(ls.LitAPI):  # type: ignore[misc]
    """Yields the 64 toy tokens, one content delta each."""

    def setup(self, device: str) -> None:
        self.tokens = TOKENS

    def predict(self, x: Any) -> Iterator[str]:
        yield from self.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument(
        "--fast-queue",
        action="store_true",
        default=os.environ.get("BENCH_LITSERVE_FAST_QUEUE") == "1",
        help="LitServer(fast_queue=True): ZeroMQ queues (or BENCH_LITSERVE_FAST_QUEUE=1)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("BENCH_LITSERVE_LOG_LEVEL", "info"),
        help="uvicorn's log level (LitServe's default: info; or BENCH_LITSERVE_LOG_LEVEL)",
    )
    args = parser.parse_args()
    server = ls.LitServer(ToyGenerator(spec=OpenAISpec()), accelerator="cpu", fast_queue=args.fast_queue)
    server.run(host="127.0.0.1", port=args.http_port, log_level=args.log_level, generate_client_file=False)


if __name__ == "__main__":
    main()
