"""Both servers' watch on a full send buffer: a client that reads none of it for send_timeout_s is let go.

A client that sends requests and never reads the answers holds them in the server's memory: the kernel's
buffers fill, then the transport's. The transport says so (`pause_writing`); from then on, every
`timeout_s` the buffer must have shrunk, or the connection is given up. A slow reader keeps its
connection; one that reads nothing does not.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional


class SendWatch:
    """Watches one connection's transport while its writes are paused; every method runs on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, stuck: Callable[[], None]) -> None:
        """Call `stuck` (which must close the connection) when the client read nothing for `timeout_s` (0: never)."""
        self._loop = loop
        self._timeout_s = timeout_s
        self._stuck = stuck
        self._transport: Optional[asyncio.WriteTransport] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._unsent = 0  # the buffer's size at the last look

    def paused(self, transport: asyncio.WriteTransport) -> None:
        """The transport's buffer is full (`pause_writing`): start watching it."""
        if self._timeout_s and self._timer is None:
            self._transport = transport
            self._unsent = transport.get_write_buffer_size()
            self._timer = self._loop.call_later(self._timeout_s, self._look)

    def stop(self) -> None:
        """Stop watching: the buffer drained (`resume_writing`), or the connection is gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None

    def _look(self) -> None:
        """`timeout_s` after the buffer filled, or after the last look: give up on a client that read nothing."""
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        unsent = transport.get_write_buffer_size()
        if unsent >= self._unsent:
            self._transport = None
            self._stuck()
            return
        self._unsent = unsent  # a slow reader, but a reader
        self._timer = self._loop.call_later(self._timeout_s, self._look)
