"""The composition bench's server: a two-model pipeline, composed in-process and as two separate models.

    .venv/bin/python bench/composition_server.py --http-port 31000

Models (FP32 ``x`` [-1] -> ``y``, max_batch_size 64, default dynamic batcher, sync callables):

* ``pre``: the Python preprocessing step, ``y = x * 2 + 1`` (the batch's rows stacked, then split again, as the
  pipelines do);
* ``identity``: ``y = x``;
* ``pipeline``: the preprocessing step, then ``identity`` called in-process (pytriton.compose.call_model), its
  output answered (the whole batch as one inner request). The same work as ``pre`` then ``identity`` called one
  after the other by the client;
* ``pipeline_async``: the same as an ``async def`` callable (call_model_async);
* ``sync_loop``, ``async_loop``: a sync and an async callable that call the model named by their ``target``
  parameter (``identity``, or ``identity_async``, the same as an async callable) 2,000 times one after the other
  and answer the microseconds per call: an inner call's whole round trip, without a client.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import numpy as np

from pytriton.compose import call_model, call_model_async
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def _stacked(requests: List[Any]) -> np.ndarray:
    """The batch's inputs as one array (each request's rows in order)."""
    return requests[0]["x"] if len(requests) == 1 else np.concatenate([request["x"] for request in requests])


def _split(y: np.ndarray, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """One response per request: its rows of `y`."""
    if len(requests) == 1:
        return [{"y": y}]
    bounds = np.cumsum([len(request["x"]) for request in requests])[:-1]
    return [{"y": part} for part in np.split(y, bounds)]


def pre(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """The preprocessing step."""
    return _split(_stacked(requests) * 2 + 1, requests)


def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Every request's input, unchanged."""
    return [{"y": request["x"]} for request in requests]


def pipeline(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """The preprocessing step, then `identity` in-process: the whole batch as one request."""
    return _split(call_model("identity", {"x": _stacked(requests) * 2 + 1})["y"], requests)


async def pipeline_async(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """`pipeline` as an async callable (call_model_async)."""
    outputs = await call_model_async("identity", {"x": _stacked(requests) * 2 + 1})
    return _split(outputs["y"], requests)


async def identity_async(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """`identity` as an async callable."""
    return [{"y": request["x"]} for request in requests]


LOOP_CALLS = 2000
_ONE_ROW = np.zeros((1, 16), np.float32)


def sync_loop(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """LOOP_CALLS calls to the model named by the `target` parameter, one after the other: microseconds per call."""
    target = str((requests[0].parameters or {})["target"])
    started = time.perf_counter()
    for _ in range(LOOP_CALLS):
        call_model(target, {"x": _ONE_ROW})
    per_call = (time.perf_counter() - started) / LOOP_CALLS * 1e6
    return [{"y": np.full((1, 1), per_call, np.float32)} for _ in requests]


async def async_loop(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """`sync_loop` as an async callable."""
    target = str((requests[0].parameters or {})["target"])
    started = time.perf_counter()
    for _ in range(LOOP_CALLS):
        await call_model_async(target, {"x": _ONE_ROW})
    per_call = (time.perf_counter() - started) / LOOP_CALLS * 1e6
    return [{"y": np.full((1, 1), per_call, np.float32)} for _ in requests]


def main() -> None:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-port", type=int, required=True)
    args = parser.parse_args()
    config = ModelConfig(max_batch_size=64, batcher=DynamicBatcher())
    tensors: Dict[str, Any] = {
        "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
        "config": config,
    }
    triton = Triton(config=TritonConfig(http_port=args.http_port, grpc_port=0, metrics_port=0))
    models = (
        ("pre", pre),
        ("identity", identity),
        ("identity_async", identity_async),
        ("pipeline", pipeline),
        ("pipeline_async", pipeline_async),
        ("sync_loop", sync_loop),
        ("async_loop", async_loop),
    )
    for name, fn in models:
        triton.bind(name, fn, **tensors)
    triton.serve()


if __name__ == "__main__":
    main()
