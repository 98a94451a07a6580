"""A large gRPC message is read into its buffer a bounded piece at a time, each read's own time counted in the turn.

grpc's clients send a large message in DATA frames of up to 4 MiB, read straight into the message's buffer. A read
of a whole frame (a copy into fresh pages) and libuv reading on while each read filled its buffer (up to 32 reads)
held the loop 40-115 ms a turn for a 64 Mi-value FP32 request; and the read's own time, spent before
buffer_updated, was not counted against the connection's turn budget (connection.TURN_BUDGET_S). No timing here:
the rooms' sizes are asserted, and a clock that makes each read in place last longer than the budget.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.transport.grpc import connection, framing
from pytriton.transport.grpc.connection import GrpcConnection
from pytriton.transport.grpc.read_gate import ReadGate
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton

# 16 MiB of FP32 values: sent by tritonclient in frames of several MiB.
VALUES = 4 * 2**20


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": request["in"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        inputs=[Tensor(name="in", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="out", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False) as server:
        yield server


def _infer(triton: Triton) -> None:
    """Send one large FP32 request over gRPC; check its answer."""
    values = np.random.default_rng(0).random(VALUES, dtype=np.float32)
    tensor = grpcclient.InferInput("in", [VALUES], "FP32")
    tensor.set_data_from_numpy(values)
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        result = client.infer("identity", [tensor])
    np.testing.assert_array_equal(result.as_numpy("out"), values)


def _record_rooms(monkeypatch: pytest.MonkeyPatch, after_room: Any = None) -> List[int]:
    """Record the size of each room get_buffer gives in a message's buffer; call `after_room` after each."""
    rooms: List[int] = []
    get_buffer = GrpcConnection.get_buffer

    def recording(self: GrpcConnection, sizehint: int) -> memoryview:
        room = get_buffer(self, sizehint)
        if self._in_place:
            rooms.append(len(room))
            if after_room is not None:
                after_room()
        return room

    monkeypatch.setattr(GrpcConnection, "get_buffer", recording)
    return rooms


def test_reads_in_place_are_bounded(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    rooms = _record_rooms(monkeypatch)
    _infer(triton)
    assert len(rooms) >= VALUES * 4 // framing.MAX_DIRECT_READ_BYTES  # the message was read in place
    assert max(rooms) <= framing.MAX_DIRECT_READ_BYTES


def test_a_read_in_place_counts_against_the_turn(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read in place takes (by the connection's clock) twice the turn budget: each gives the turn over."""
    offset = [0.0]
    monkeypatch.setattr(connection, "perf_counter", lambda: perf_counter() + offset[0])

    def slow_read() -> None:
        offset[0] += 2 * connection.TURN_BUDGET_S

    rooms = _record_rooms(monkeypatch, slow_read)
    turns: List[int] = []
    turn_over = ReadGate.turn_over

    def counting(self: ReadGate) -> None:
        turns.append(1)
        turn_over(self)

    monkeypatch.setattr(ReadGate, "turn_over", counting)
    _infer(triton)
    assert len(rooms) >= 8
    # Each read in place is a turn of its own; the handling alone (well under the budget) would give none.
    assert len(turns) >= len(rooms) // 2
