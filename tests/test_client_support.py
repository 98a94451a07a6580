"""Models, a server and fixtures shared by the client tests (this module holds no tests).

Test modules load it with `pytest_plugins`, so its fixture names carry a `client_` prefix or name a gate.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton
from tests.conftest import running_triton

HEADER_PATTERN = "x-test-.*"
PROTOCOLS = ["http", "grpc"]
WAIT_S = 30.0  # upper bound for events that should happen at once
# The inference timeout of a client whose call a gate holds (it must time out) and whose other calls must not:
# a free call answers well within it on a loaded machine (0.3 s did not always suffice for a new connection).
HELD_TIMEOUT_S = 2.0

Outputs = List[Dict[str, np.ndarray]]


class Gate:
    """Holds the callables that use it until released; counts those inside so teardown can drain them."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()
        self._inside = 0
        self._drained = threading.Condition()

    def arm(self) -> None:
        self.entered.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def drain(self) -> None:
        self._open.set()
        with self._drained:
            assert self._drained.wait_for(lambda: self._inside == 0, WAIT_S), "blocked callables did not finish"

    def pass_through(self) -> None:
        with self._drained:
            self._inside += 1
        self.entered.set()
        try:
            self._open.wait(WAIT_S)
        finally:
            with self._drained:
                self._inside -= 1
                self._drained.notify_all()


def _params_bytes(request: Request) -> np.ndarray:
    return np.array([[json.dumps(request.parameters or {}, sort_keys=True).encode()]], dtype=object)


def _add_sub(requests: List[Request]) -> Outputs:
    return [{"sum": r["a"] + r["b"], "diff": r["a"] - r["b"]} for r in requests]


def _shout(requests: List[Request]) -> Outputs:
    return [{"text": np.vectorize(lambda s: bytes(s).upper() + b"!", otypes=[object])(r["text"])} for r in requests]


def _double(requests: List[Request]) -> Outputs:
    return [{"y": r["x"] * 2} for r in requests]


def _params(requests: List[Request]) -> Outputs:
    return [{"params": _params_bytes(r)} for r in requests]


def _fail(requests: List[Request]) -> Outputs:
    raise ValueError("the model says no")


def _blocking(gate: Gate) -> Any:
    def infer(requests: List[Request]) -> Outputs:
        gate.pass_through()
        return [{"y": r["x"]} for r in requests]

    return infer


def _stream(requests: List[Request]) -> Iterator[Outputs]:
    for step in range(4):
        yield [{"y": r["x"] + step} for r in requests]


def _stream_fail(requests: List[Request]) -> Iterator[Outputs]:
    yield [{"y": r["x"]} for r in requests]
    raise ValueError("the stream broke")


def _stream_params(requests: List[Request]) -> Iterator[Outputs]:
    yield [{"y": r["x"], "params": _params_bytes(r)} for r in requests]


def _stream_blocking(gate: Gate) -> Any:
    def infer(requests: List[Request]) -> Iterator[Outputs]:
        yield [{"y": r["x"]} for r in requests]
        gate.pass_through()
        yield [{"y": r["x"]} for r in requests]

    return infer


class ClientServer:
    """A running server with every model the client tests use."""

    def __init__(self, triton: Triton, slow_gate: Gate, queue_gate: Gate, stream_gate: Gate) -> None:
        self.triton = triton
        self.slow_gate = slow_gate
        self.queue_gate = queue_gate
        self.stream_gate = stream_gate

    def url(self, protocol: str) -> str:
        if protocol == "grpc":
            return f"grpc://127.0.0.1:{self.triton.grpc_port}"
        return f"http://127.0.0.1:{self.triton.http_port}"


def _bind(triton: Triton, slow_gate: Gate, queue_gate: Gate, stream_gate: Gate) -> None:
    f32 = np.float32
    vector = (-1,)
    batching = ModelConfig(max_batch_size=8)
    decoupled = ModelConfig(max_batch_size=8, decoupled=True)
    x_in = [Tensor(name="x", dtype=f32, shape=vector)]
    y_out = [Tensor(name="y", dtype=f32, shape=vector)]
    params_out = Tensor(name="params", dtype=bytes, shape=(1,))
    triton.bind(
        "add_sub",
        _add_sub,
        inputs=[Tensor(name="a", dtype=f32, shape=vector), Tensor(name="b", dtype=f32, shape=vector)],
        outputs=[Tensor(name="sum", dtype=f32, shape=vector), Tensor(name="diff", dtype=f32, shape=vector)],
        config=batching,
    )
    text = [Tensor(name="text", dtype=bytes, shape=vector)]
    triton.bind("shout", _shout, inputs=text, outputs=text, config=batching)
    triton.bind("double", _double, inputs=x_in, outputs=y_out, config=ModelConfig(batching=False))
    triton.bind("params", _params, inputs=x_in, outputs=[params_out], config=batching)
    triton.bind("fail", _fail, inputs=x_in, outputs=y_out, config=batching)
    triton.bind("slow", _blocking(slow_gate), inputs=x_in, outputs=y_out, config=batching)
    queue_config = ModelConfig(batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=1)))
    triton.bind("queue", _blocking(queue_gate), inputs=x_in, outputs=y_out, config=queue_config)
    triton.bind("stream", _stream, inputs=x_in, outputs=y_out, config=decoupled)
    triton.bind(
        "stream_unbatched", _stream, inputs=x_in, outputs=y_out, config=ModelConfig(batching=False, decoupled=True)
    )
    triton.bind("stream_fail", _stream_fail, inputs=x_in, outputs=y_out, config=decoupled)
    triton.bind("stream_params", _stream_params, inputs=x_in, outputs=[*y_out, params_out], config=decoupled)
    triton.bind("stream_slow", _stream_blocking(stream_gate), inputs=x_in, outputs=y_out, config=decoupled)


@pytest.fixture(scope="module")
def client_server() -> Iterator[ClientServer]:
    gates = Gate(), Gate(), Gate()
    config = {"http_header_forward_pattern": HEADER_PATTERN, "grpc_header_forward_pattern": HEADER_PATTERN}
    with running_triton(lambda triton: _bind(triton, *gates), **config) as triton:
        try:
            yield ClientServer(triton, *gates)
        finally:
            for gate in gates:
                gate.drain()


@pytest.fixture(params=PROTOCOLS)
def client_url(request: pytest.FixtureRequest, client_server: ClientServer) -> str:
    return client_server.url(request.param)


@pytest.fixture
def slow_gate(client_server: ClientServer) -> Iterator[Gate]:
    client_server.slow_gate.arm()
    yield client_server.slow_gate
    client_server.slow_gate.drain()


@pytest.fixture
def queue_gate(client_server: ClientServer) -> Iterator[Gate]:
    client_server.queue_gate.arm()
    yield client_server.queue_gate
    client_server.queue_gate.drain()


@pytest.fixture
def stream_gate(client_server: ClientServer) -> Iterator[Gate]:
    client_server.stream_gate.arm()
    yield client_server.stream_gate
    client_server.stream_gate.drain()


def floats(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)
