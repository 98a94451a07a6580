"""ReadGate's rule on a real loop, with a transport that records what the gate asked of it.

The wire tests (test_grpc_http2.py) show what a client sees: a client that writes all its calls before it reads
is answered, and one that reads nothing keeps no more answers than its streams. These show the states between.
"""

from __future__ import annotations

import asyncio
from typing import List

from pytriton.transport.grpc.read_gate import HELD_S, READ_ON_BYTES, ReadGate, Reads


class RecordingTransport:
    """The part of asyncio.Transport the gate uses: whether it reads, and the send buffer's size."""

    def __init__(self) -> None:
        self.reading = True
        self.buffered = 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return self.buffered


def gate_on_loop(closed: bool = False) -> tuple[ReadGate, RecordingTransport, List[str]]:
    read_on: List[str] = []
    gate = ReadGate(asyncio.get_running_loop(), closed=lambda: closed, read_on=lambda: read_on.append("read on"))
    transport = RecordingTransport()
    gate.attach(transport)  # type: ignore[arg-type]
    return gate, transport, read_on


def test_a_client_behind_on_its_answers_holds_reads_then_the_connection_reads_on() -> None:
    async def scenario() -> None:
        gate, transport, read_on = gate_on_loop()
        transport.buffered = 4 << 20
        gate.writes_paused()
        assert (gate.reads, transport.reading, read_on) == (Reads.HELD, False, [])
        await asyncio.sleep(HELD_S * 2)
        assert (gate.reads, transport.reading, read_on) == (Reads.READING_ON, True, ["read on"])
        transport.buffered += READ_ON_BYTES  # what went out while reading on: at the limit, not past it
        gate.wrote()
        assert transport.reading
        transport.buffered += 1
        gate.wrote()
        assert (gate.reads, transport.reading) == (Reads.FULL, False)
        await asyncio.sleep(HELD_S * 2)  # no second reading on: only the client's reading ends it
        assert (gate.reads, transport.reading, read_on) == (Reads.FULL, False, ["read on"])
        transport.buffered = 0
        gate.writes_resumed()
        assert (gate.reads, transport.reading) == (Reads.ON, True)

    asyncio.run(scenario())


def test_a_client_that_catches_up_within_the_hold_is_never_read_on() -> None:
    async def scenario() -> None:
        gate, transport, read_on = gate_on_loop()
        gate.writes_paused()
        gate.writes_resumed()
        await asyncio.sleep(HELD_S * 2)  # the hold's timer went with it
        assert (gate.reads, transport.reading, read_on) == (Reads.ON, True, [])

    asyncio.run(scenario())


def test_a_turn_and_a_hold_each_keep_reads_stopped_until_both_are_over() -> None:
    async def scenario() -> None:
        gate, transport, _ = gate_on_loop()
        gate.turn_over()
        gate.writes_paused()
        gate.next_turn()
        assert not transport.reading  # still held
        gate.turn_over()
        gate.writes_resumed()
        assert not transport.reading  # still its turn's end
        gate.next_turn()
        assert transport.reading

    asyncio.run(scenario())


def test_a_closed_connection_is_left_to_read_and_drop() -> None:
    async def scenario() -> None:
        gate, transport, _ = gate_on_loop(closed=True)
        gate.writes_paused()
        gate.turn_over()
        assert transport.reading
        gate.stop()

    asyncio.run(scenario())
