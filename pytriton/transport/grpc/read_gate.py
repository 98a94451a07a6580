"""When a gRPC connection reads: the one rule behind its transport's pause_reading and resume_reading.

A connection stops reading for two reasons, each with its way back:

- **Its turn is over** (connection.py's turn budget): it reads again at the loop's next turn.
- **Its client is behind on reading the answers** (the transport paused writing). The two directions then
  take turns instead of meeting in the socket: on loopback the server pays for the client's segments that
  arrive while its `writev` holds the socket (docs/performance.md, "the eighth look": 10 % of the server's CPU
  a 1 MiB call). But a client that writes all its calls before it reads any answer (a blocking one, within the
  windows the server opened) would then wait for the server as the server waits for it. So a connection held
  for HELD_S reads on. What it reads on cannot fill the server's memory: from then on until the client catches
  up, the answers wait in their calls (`read_on` holds them: responses.py), as they do for a client's window,
  so that the calls open at once (`grpc_max_concurrent_streams`) bound them; the frames that still go out
  (acknowledgements, errors, resets) may add READ_ON_BYTES to the send buffer before reads stop again.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Callable, Optional

# How long reads stay stopped for a client that is behind on its answers. A 1 MiB answer drains in well under a
# millisecond on loopback and in ~10 ms at 1 Gbit/s: only a client that does not read (or a slow link) meets it.
HELD_S = 0.05
# What the frames sent while reading on (answers are held) may add to the send buffer before reads stop again.
READ_ON_BYTES = 1 << 20


class Reads(enum.Enum):
    """Where a connection stands with its client's reading of the answers."""

    ON = enum.auto()  # the client keeps up: reading
    HELD = enum.auto()  # the client is behind: not reading, for HELD_S at most
    READING_ON = enum.auto()  # held for HELD_S: reading, the answers held in their calls
    FULL = enum.auto()  # reading on added READ_ON_BYTES to the send buffer: not reading until the client reads


class ReadGate:
    """Pauses and resumes one connection's reads by the rule above; `yielding` is the turn's part of it."""

    __slots__ = ("_closed", "_held_from", "_loop", "_on_read_on", "_timer", "_transport", "reads", "yielding")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, closed: Callable[[], bool], read_on: Callable[[], None]
    ) -> None:
        """A gate that calls `read_on()` as it reads on, and leaves the transport alone once `closed()`."""
        self._loop = loop
        self._closed = closed
        self._on_read_on = read_on
        self._transport: Optional[asyncio.Transport] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._held_from = 0  # the send buffer's size when reading on began
        self.reads = Reads.ON
        self.yielding = False  # the connection's turn is over until the loop's next one

    def attach(self, transport: asyncio.Transport) -> None:
        """The transport whose reads this gate pauses and resumes."""
        self._transport = transport

    def stop(self) -> None:
        """The connection is gone: no timer left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the client's reading of the answers --------------------------------------------------------------------

    def writes_paused(self) -> None:
        """The send buffer passed its high-water mark: hold reads, for HELD_S at most."""
        self.reads = Reads.HELD
        if self._timer is None:
            self._timer = self._loop.call_later(HELD_S, self._read_on)
        self._apply()

    def writes_resumed(self) -> None:
        """The send buffer drained: read again."""
        self.stop()
        self.reads = Reads.ON
        self._apply()

    def wrote(self) -> None:
        """Something went to the transport: while reading on, stop once the send buffer grew by READ_ON_BYTES."""
        if self.reads is Reads.READING_ON and self._transport is not None:
            if self._transport.get_write_buffer_size() > self._held_from + READ_ON_BYTES:
                self.reads = Reads.FULL
                self._apply()

    def _read_on(self) -> None:
        """Held for HELD_S: the client may be waiting for the server to read before it reads."""
        self._timer = None
        if self.reads is Reads.HELD and self._transport is not None:
            self.reads = Reads.READING_ON
            self._held_from = self._transport.get_write_buffer_size()
            self._on_read_on()
            self._apply()

    # -- turns ---------------------------------------------------------------------------------------------------

    def turn_over(self) -> None:
        """The connection used its turn's budget: no reads until `next_turn`."""
        self.yielding = True
        self._apply()

    def next_turn(self) -> None:
        """The other connections had their turn."""
        self.yielding = False
        self._apply()

    def _apply(self) -> None:
        transport = self._transport
        if transport is None or self._closed():
            return
        if self.yielding or self.reads is Reads.HELD or self.reads is Reads.FULL:
            transport.pause_reading()
        else:
            transport.resume_reading()
