"""`python -m bench.composition_calls`: the Python calls one sync -> sync inner call makes, counted exactly.

A count does not move with the machine's load, as `bench.composition_cpu`'s microseconds do. The bench's server
(in this process, this checkout's `pytriton`) serves a sync `identity` and a sync callable that calls it
`--calls` times in a row (FP32 [1, 16], as `bench/composition_server.py`'s `sync_loop`) with `sys.setprofile`
set on its own thread and on the engine's loop, where a direct call's statistics are counted. It prints the Python
function calls (and calls of C functions) per inner call on each thread, and the functions called most.

    python -m bench.composition_calls
    python -m bench.composition_calls --calls 5000 --top 40
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import urllib.request
from typing import Any, Counter, Dict, List, Optional, Tuple

import numpy as np

from bench.servers import free_ports
from pytriton.compose import call_model
from pytriton.core.composition.path import CURRENT
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

_ONE_ROW = np.zeros((1, 16), np.float32)
Key = Tuple[str, str]  # (event kind, function)


class _Counter:
    """A profile function counting calls by function, while on."""

    def __init__(self) -> None:
        self.calls: Counter[Key] = collections.Counter()
        self.on = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if not self.on:
            return
        if event == "call":
            code = frame.f_code
            self.calls[("py", f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}")] += 1
        elif event == "c_call":
            self.calls[("c", getattr(arg, "__qualname__", str(arg)))] += 1


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"]} for request in requests]


def _counted_loop(calls: int, caller: _Counter, loop_side: _Counter) -> Any:
    """A sync callable calling `identity` `calls` times, counted on its thread and on the loop."""

    def loop_model(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        source = CURRENT.get()
        assert source is not None
        engine_loop = source.call_path().loop
        for _ in range(50):  # warm: the model's caches and the direct path's first-call work
            call_model("identity", {"x": _ONE_ROW})
        turned = threading.Event()
        engine_loop.call_soon_threadsafe(_set_profile, loop_side, turned)
        turned.wait()
        sys.setprofile(caller)
        caller.on = loop_side.on = True
        for _ in range(calls):
            call_model("identity", {"x": _ONE_ROW})
        caller.on = False
        sys.setprofile(None)
        # the statistics of the calls are counted on the loop once this batch is answered: the counter stays on there
        return [{"y": np.zeros((1, 1), np.float32)} for _ in requests]

    return loop_model


def _set_profile(counter: Optional[_Counter], done: threading.Event) -> None:
    sys.setprofile(counter)
    done.set()


def _infer(port: int, model: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{model}/infer",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.composition_calls", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    caller, loop_side = _Counter(), _Counter()
    tensors: Dict[str, Any] = {
        "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
        "config": ModelConfig(max_batch_size=64, batcher=DynamicBatcher()),
    }
    (http,) = free_ports(1)
    with Triton(config=TritonConfig(http_port=http, grpc_port=0, metrics_port=0)) as triton:
        triton.bind("identity", _identity, **tensors)
        triton.bind("loop", _counted_loop(args.calls, caller, loop_side), **tensors)
        triton.run()
        _infer(http, "loop")
        _infer(http, "identity")  # the loop has counted the calls' statistics by the time this one is answered
        loop_side.on = False
    for name, counter in (("caller's thread", caller), ("loop", loop_side)):
        python = sum(n for (kind, _), n in counter.calls.items() if kind == "py")
        native = sum(n for (kind, _), n in counter.calls.items() if kind == "c")
        print(f"{name}: {python / args.calls:.1f} Python calls, {native / args.calls:.1f} C calls per inner call")
    merged: Counter[Key] = caller.calls + loop_side.calls
    print(f"the {args.top} functions called most (calls per inner call, both threads):")
    for (kind, function), count in merged.most_common(args.top):
        print(f"  {count / args.calls:6.2f}  {kind:2s} {function}")


if __name__ == "__main__":
    main(sys.argv[1:])
