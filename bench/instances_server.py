"""The model server of `python -m bench instances`: the same models as thread instances and as process instances.

* ``identity_thread`` / ``identity_proc``: FP32 ``INPUT_1`` [-1] echoed, max_batch_size 64, one instance.
  The process instance inherits the server's CPU pinning: the hop is measured on the server's core.
* ``gil_thread_N`` / ``gil_proc_N`` (N = 1, 2, 4): each call holds the GIL for ``GIL_CALL_S`` in a pure-Python
  loop and echoes its input; no batching. Process instances may use every CPU (their factory unpins them):
  what the instances are for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import numpy as np

from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

GIL_CALL_S = 0.005
COUNTS = (1, 2, 4)


def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Return every request's input unchanged."""
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def hold_the_gil(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Spin in Python for GIL_CALL_S (the GIL is held throughout), then echo."""
    deadline = time.perf_counter() + GIL_CALL_S
    spins = 0
    while time.perf_counter() < deadline:
        spins += 1
    return identity(requests)


def unpinned_identity() -> Callable[..., Any]:
    """Factory run in each instance process: identity, on every CPU."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return identity


def unpinned_hold_the_gil() -> Callable[..., Any]:
    """Factory run in each instance process: use every CPU, whatever the server was pinned to."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return hold_the_gil


def main() -> None:
    """Bind the models and serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
    )
    io = {
        "inputs": [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
    }
    with Triton(config=config) as triton:
        batched = ModelConfig(max_batch_size=64)
        triton.bind("identity_thread", identity, **io, config=batched)
        triton.bind("identity_proc", ProcessInstances(identity), **io, config=batched)
        triton.bind("identity_proc_free", ProcessInstances(factory=unpinned_identity), **io, config=batched)
        io_2d = {
            "inputs": [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1, -1))],
            "outputs": [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1, -1))],
        }
        for count in COUNTS:
            plain = ModelConfig(batching=False)
            triton.bind(f"gil_thread_{count}", [hold_the_gil] * count, **io_2d, config=plain)
            processes = ProcessInstances(factory=unpinned_hold_the_gil, count=count)
            triton.bind(f"gil_proc_{count}", processes, **io_2d, config=plain)
        triton.serve()


if __name__ == "__main__":
    main()
