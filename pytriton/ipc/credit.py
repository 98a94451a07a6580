"""Back-pressure for an answer sent in parts: the sender waits while the receiver has too much of it not yet taken.

A server of one process makes a streaming app's `await send(...)` wait while its client's socket is full; an
answer that crosses to another process in parts (ipc/calls.py's PROGRESS) would otherwise be posted at once,
part after part, held in the sender's outbox and the receiver's memory for a client that reads none of it. The
receiver says when it has taken each part (written it on to its client), and the sender's next part waits until
what is still in flight is back within the window.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Deque, Optional

# In flight per answer, at most (then the sender waits): this many bytes, or this many parts (parts of no bytes,
# or few, cost a message each). A part larger than the window goes alone.
WINDOW_BYTES = 256 * 1024
WINDOW_PARTS = 64


class Credit:
    """What one answer's sender has sent and its receiver not yet taken; `sent` waits while that is over the window."""

    def __init__(self, window_bytes: int = WINDOW_BYTES, window_parts: int = WINDOW_PARTS) -> None:
        """Let `window_bytes` bytes or `window_parts` parts be in flight before a sender waits."""
        self._window_bytes = window_bytes
        self._window_parts = window_parts
        self._sizes: Deque[int] = deque()  # of the parts in flight, oldest first (the receiver takes them in order)
        self._bytes = 0
        self._waiter: Optional[asyncio.Future[None]] = None

    async def sent(self, size: int, until: asyncio.Future[None]) -> None:
        """A part of `size` bytes went: wait while what is in flight is over the window, or until `until` is done."""
        self._sizes.append(size)
        self._bytes += size
        while self._over() and not until.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.wait((waiter, until), return_when=asyncio.FIRST_COMPLETED)

    def taken(self) -> None:
        """The receiver took the oldest part in flight: a sender waiting for room may go on once there is."""
        if self._sizes:
            self._bytes -= self._sizes.popleft()
        if self._waiter is not None and not self._over():
            if not self._waiter.done():
                self._waiter.set_result(None)
            self._waiter = None

    def _over(self) -> bool:
        return self._bytes > self._window_bytes or len(self._sizes) > self._window_parts
