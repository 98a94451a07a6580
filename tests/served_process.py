"""A Triton in a process of its own, for tests that measure the server alone (its RSS) while clients attack it.

    python -m tests.served_process '{"grpc_max_connections": 8}' [1024]   # ServerLimits as JSON [soft open files]

It serves `identity` (FP32 [-1] echoed), `slow` (the same after SLOW_S seconds a call, counting the rows
it computed), `rows` (the rows `slow` computed so far, and the largest batch it saw) and `large` (as many
FP32 zeros as its one input value says: a small request's large answer), prints
"READY <grpc port> <http port>" and serves until its standard input closes.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from typing import Any, Dict, List

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton, TritonConfig

SLOW_S = 0.2
FP32 = [Tensor(dtype=np.float32, shape=(-1,))]


class SlowModel:
    """Answers after SLOW_S seconds; counts the rows it computed and the largest batch."""

    def __init__(self) -> None:
        self.rows = 0
        self.largest = 0
        self._lock = threading.Lock()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        time.sleep(SLOW_S)
        with self._lock:
            self.rows += len(requests)
            self.largest = max(self.largest, len(requests))
        return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]

    def counts(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        with self._lock:
            counts = np.array([[self.rows, self.largest]], np.float32)
        return [{"OUTPUT_1": counts} for _ in requests]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _large(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": np.zeros((1, int(request["INPUT_1"][0][0])), np.float32)} for request in requests]


def main() -> None:
    if len(sys.argv) > 2:  # the soft open-file limit to start with, before the server raises it
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    limits = ServerLimits(**json.loads(sys.argv[1])) if len(sys.argv) > 1 else ServerLimits()
    config = TritonConfig(http_port=0, grpc_port=0, allow_metrics=False, grpc_http2_max_ping_strikes=0)
    slow = SlowModel()
    with Triton(config=config, limits=limits) as triton:
        batched = ModelConfig(max_batch_size=8)
        triton.bind("identity", _identity, inputs=FP32, outputs=FP32, config=batched)
        triton.bind("slow", slow, inputs=FP32, outputs=FP32, config=batched)
        triton.bind("rows", slow.counts, inputs=FP32, outputs=FP32, config=batched)
        triton.bind("large", _large, inputs=FP32, outputs=FP32, config=batched)
        triton.run()
        print(f"READY {triton.grpc_port} {triton.http_port}", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
