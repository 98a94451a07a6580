"""The ASGI bridge Ray Serve replicas use: an app on the engine's loop, called from another event loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.runtime.asgi_bridge import LoopBridge
from pytriton.triton import Triton, TritonConfig

FP32 = [Tensor(dtype=np.float32, shape=(-1,))]


def _scope(method: str, path: str) -> Dict[str, Any]:
    return {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1234),
        "root_path": "",
        "asgi": {"version": "3.0"},
    }


async def _call(bridge: LoopBridge, method: str, path: str, body: bytes = b"") -> List[Dict[str, Any]]:
    chunks = [body[: len(body) // 2], body[len(body) // 2 :]]  # the body arrives in two parts
    messages = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return messages.pop(0) if messages else await asyncio.get_running_loop().create_future()

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    await bridge(_scope(method, path), receive, send)
    return sent


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait, on the caller's loop, until `condition()` holds (10 s at most)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


def test_bridge_serves_the_engine_app_from_another_loop():
    gate, entered = threading.Event(), threading.Event()

    def held(requests):
        entered.set()
        gate.wait(10)
        return [{"OUTPUT_1": request["INPUT_1"] * 2} for request in requests]

    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    try:
        triton.bind("double", held, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=4))
        runtime = triton._runtime
        bridge = LoopBridge(runtime.http_app(), runtime.loop)
        body = json.dumps({"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})

        model = triton._runtime.engine.model("double")

        async def scenario() -> None:
            ready = await _call(bridge, "GET", "/v2/health/ready")
            assert ready[0]["status"] == 200
            # A caller that goes away while its request waits in the queue takes it out (CANCELLED).
            blocker = asyncio.ensure_future(_call(bridge, "POST", "/v2/models/double/infer", body.encode()))
            await _until(entered.is_set, "the first request is in the model")
            waiting = asyncio.ensure_future(_call(bridge, "POST", "/v2/models/double/infer", body.encode()))
            await _until(lambda: model.scheduler.pending == 1, "the second request waits in the queue")
            waiting.cancel()
            await _until(lambda: model.stats.failures_by_reason.get("CANCELED", 0) == 1, "it leaves the queue")
            assert model.scheduler.pending == 0
            gate.set()
            answer = await blocker
            assert answer[0]["status"] == 200
            assert json.loads(answer[1]["body"])["outputs"][0]["data"] == [2, 4]

        asyncio.run(scenario())
        assert model.stats.failures_by_reason.get("CANCELED", 0) == 1
    finally:
        gate.set()
        triton.stop()


def test_bridge_answers_the_lifespan_protocol():
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    try:
        bridge = LoopBridge(triton._runtime.http_app(), triton._runtime.loop)
        incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent: List[Dict[str, Any]] = []

        async def receive() -> Dict[str, Any]:
            return incoming.pop(0)

        async def send(message: Dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(bridge({"type": "lifespan"}, receive, send))
        assert [message["type"] for message in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    finally:
        triton.stop()
