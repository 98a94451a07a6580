"""A request body of a declared length, read by the kernel straight into the buffer the app receives.

Through the parser, each byte of a body was copied three times before the app saw it (into the loop's
bytes, into httptools' bytes, then joined); a 1 MiB request spent about a fifth of the server's CPU in
those copies and in the page faults of their fresh buffers. A body whose Content-Length is large enough
skips them: the connection hands this buffer's free room to the transport (asyncio.BufferedProtocol), so
the only copy is the kernel's. The memory is uninitialised, reused once nothing refers to it
(receive_buffers.py); a fresh one's pages are touched as bytes arrive, so a client declaring a large body
costs the server only what it actually sends.
"""

from __future__ import annotations

from typing import Optional, Union

from pytriton.transport.receive_buffers import RECEIVE_BUFFERS

# Bodies of at least this many bytes are read past the parser; smaller ones cost less through it.
PRESIZED_BODY_BYTES = 64 * 1024


class PresizedBody:
    """The buffer of one request body whose length the head declared, and how much of it has arrived."""

    __slots__ = ("_view", "filled", "length")

    def __init__(self, length: int) -> None:
        """A buffer for `length` bytes, none of them arrived yet."""
        self.length = length
        self.filled = 0
        self._view: Optional[memoryview] = RECEIVE_BUFFERS.take(length)

    @property
    def left(self) -> int:
        """Bytes of the body still to come."""
        return self.length - self.filled

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived."""
        return self.filled >= self.length

    def room(self) -> Optional[memoryview]:
        """Where the next bytes go; None once the body is dropped (its bytes are then read and discarded)."""
        view = self._view
        return None if view is None else view[self.filled :]

    def add(self, data: Union[bytes, memoryview]) -> None:
        """Copy a part of the body that shared a read with the head."""
        view = self._view
        end = self.filled + len(data)
        if view is not None:
            view[self.filled : end] = data
        self.filled = end

    def drop(self) -> None:
        """Nobody will read this body (its request is answered already): keep counting, stop keeping."""
        self._view = None

    def take(self) -> memoryview:
        """The whole body, writable, for the app."""
        view = self._view
        assert view is not None, "a dropped body has no contents"
        return view
