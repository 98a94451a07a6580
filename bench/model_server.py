"""The bench's model server: ONE script for this project's pytriton and NVIDIA's PyTriton (same API).

Run it with the interpreter of the implementation to measure:

    .venv/bin/python bench/model_server.py --http-port 31000 --grpc-port 31001 --metrics-port 31002
    /tmp/nvidia-pytriton/run python bench/model_server.py --http-port ...

Ports may also come from BENCH_HTTP_PORT / BENCH_GRPC_PORT / BENCH_METRICS_PORT. Models:

* ``identity``: FP32 ``INPUT_1`` [-1] -> ``OUTPUT_1``, max_batch_size 64, default dynamic batcher.
  Serves both the [1,16] workloads and the 1 MiB ([1,262144]) ones.
* ``batching``: the same tensors, but each call costs a fixed 2 ms (``time.sleep(0.002)``) whatever
  the batch size; max_batch_size 64, DynamicBatcher(max_queue_delay_microseconds=1000). It counts its
  calls and rows and returns the running totals as the INT64 outputs ``CALLS`` and ``ROWS`` (one
  value per row) when a client asks for them, so the bench can derive the average batch size
  without trusting the server's statistics endpoint.
* ``simple``: Triton's example model (docs/examples/model_repository/simple in triton-inference-server/server):
  INT32 ``INPUT0`` and ``INPUT1`` [16] -> ``OUTPUT0`` = their sum, ``OUTPUT1`` = their difference,
  max_batch_size 8. What ``perf_analyzer -m simple`` measures (the ``perf_analyzer`` workloads).
* ``wide``: ``simple`` over FP32 tensors of any length, for the shared-memory sweep's perf_analyzer rows.

The callables take the raw list of requests (no ``@batch``) so they run unchanged on both servers.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any, Dict, List

# Never import modules from the bench folder by accident (it sits first on sys.path).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import numpy as np

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

BATCH_COST_S = 0.002


def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Return every request's input unchanged."""
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def simple(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Triton's `simple`: the sum and the difference of the two inputs."""
    return [
        {"OUTPUT0": request["INPUT0"] + request["INPUT1"], "OUTPUT1": request["INPUT0"] - request["INPUT1"]}
        for request in requests
    ]


class BatchingModel:
    """A model costing a fixed 2 ms per call, counting calls and rows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0
        self.rows = 0

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        """Sleep 2 ms, count, and echo each request with the running totals."""
        time.sleep(BATCH_COST_S)
        rows = sum(int(request["INPUT_1"].shape[0]) for request in requests)
        with self._lock:
            self.calls += 1
            self.rows += rows
            calls, total = self.calls, self.rows
        out = []
        for request in requests:
            n = request["INPUT_1"].shape[0]
            out.append(
                {
                    "OUTPUT_1": request["INPUT_1"],
                    "CALLS": np.full((n, 1), calls, dtype=np.int64),
                    "ROWS": np.full((n, 1), total, dtype=np.int64),
                }
            )
        return out


def _port(value: int, env: str) -> int:
    """The port from argv, else from the environment."""
    if value:
        return value
    if env in os.environ:
        return int(os.environ[env])
    raise SystemExit(f"missing port: pass it on the command line or set {env}")


def _security_kwargs() -> Dict[str, Any]:
    """Both servers guard the statistics endpoint with a random token: fix it to BENCH_ACCESS_TOKEN.

    BENCH_RESTRICTED_ENDPOINTS (a comma list, possibly empty) replaces the APIs the token guards:
    perf_analyzer reads the statistics and registers shared memory without a token over gRPC (its -H
    headers go out over HTTP only), so the perf_analyzer workloads leave those two open.
    """
    token = os.environ.get("BENCH_ACCESS_TOKEN")
    restricted = os.environ.get("BENCH_RESTRICTED_ENDPOINTS")
    from pytriton.triton import TritonSecurityConfig

    if restricted is not None:
        endpoints = [name for name in restricted.split(",") if name]
        return {"security_config": TritonSecurityConfig(access_token=token, restricted_endpoints=endpoints)}
    return {"security_config": TritonSecurityConfig(access_token=token)} if token else {}


def main() -> None:
    """Bind the bench models and serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0)
    args = parser.parse_args()
    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        http_port=_port(args.http_port, "BENCH_HTTP_PORT"),
        grpc_port=_port(args.grpc_port, "BENCH_GRPC_PORT"),
        metrics_port=_port(args.metrics_port, "BENCH_METRICS_PORT"),
    )
    import pytriton

    print(f"bench model server: pytriton from {os.path.dirname(pytriton.__file__)}", flush=True)
    with Triton(config=config, **_security_kwargs()) as triton:
        triton.bind(
            model_name="identity",
            infer_func=identity,
            inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=64),
        )
        triton.bind(
            model_name="batching",
            infer_func=BatchingModel(),
            inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
            outputs=[
                Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,)),
                Tensor(name="CALLS", dtype=np.int64, shape=(1,)),
                Tensor(name="ROWS", dtype=np.int64, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
        )
        triton.bind(
            model_name="simple",
            infer_func=simple,
            inputs=[
                Tensor(name="INPUT0", dtype=np.int32, shape=(16,)),
                Tensor(name="INPUT1", dtype=np.int32, shape=(16,)),
            ],
            outputs=[
                Tensor(name="OUTPUT0", dtype=np.int32, shape=(16,)),
                Tensor(name="OUTPUT1", dtype=np.int32, shape=(16,)),
            ],
            config=ModelConfig(max_batch_size=8),
        )
        triton.bind(
            model_name="wide",
            infer_func=simple,
            inputs=[
                Tensor(name="INPUT0", dtype=np.float32, shape=(-1,)),
                Tensor(name="INPUT1", dtype=np.float32, shape=(-1,)),
            ],
            outputs=[
                Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,)),
                Tensor(name="OUTPUT1", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=8),
        )
        triton.serve()


if __name__ == "__main__":
    main()
