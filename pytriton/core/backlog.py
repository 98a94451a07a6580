"""What a stream has handed on that its consumer has not taken yet, counted in responses and in bytes.

A streamed answer is paced by its client (docs/configuration.md): the model's generator waits while the backlog
is full. Counting responses alone either held token streams too soon or let large responses pile up: with a
window of 64 responses behind a frontend process, the OpenAI bench's 64-token streams at 64 clients got 0.72-0.75x
the tokens/s of no window (quick runs, the 2-core VM), with 256 and 16 MiB 0.96-0.98x; yet 256 of an endless
generator's 256 KiB responses would hold 64 MiB for a client that reads nothing. So a backlog is full at
`max_items` responses or `max_bytes` bytes, whichever comes first, and it lets its producer go on only once half
of it was taken (one wake-up per half, not per response).

A consumer behind in a batch whose other consumers keep up does not hold the batch: its backlog grows on, and once
it is OVERRUN times its bounds (in responses, or twice in bytes) that consumer alone is cut off
(core/scheduling/scheduler.py).
"""

from __future__ import annotations

from collections import deque
from typing import Deque

# How many times its bounds a backlog may grow while the rest of its batch goes on (bytes: twice): past that, cut off.
OVERRUN, OVERRUN_BYTES = 8, 2


class Backlog:
    """Sizes of the responses handed on and not taken yet, oldest first."""

    __slots__ = ("_bytes", "_sizes", "max_bytes", "max_items")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        """An empty backlog, full at `max_items` responses or `max_bytes` bytes."""
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._sizes: Deque[int] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sizes)

    def add(self, nbytes: int) -> None:
        """One more response handed on."""
        self._sizes.append(nbytes)
        self._bytes += nbytes

    def take(self, count: int = 1) -> None:
        """The consumer took its `count` oldest responses."""
        sizes = self._sizes
        for _ in range(min(count, len(sizes))):
            self._bytes -= sizes.popleft()

    def full(self) -> bool:
        """Whether the producer must wait."""
        return len(self._sizes) >= self.max_items or self._bytes >= self.max_bytes

    def overrun(self) -> bool:
        """Whether its consumer fell so far behind (OVERRUN) that it is cut off rather than hold others."""
        return len(self._sizes) >= self.max_items * OVERRUN or self._bytes >= self.max_bytes * OVERRUN_BYTES

    def drained(self) -> bool:
        """Whether half of a full backlog was taken: a waiting producer may go on."""
        return len(self._sizes) <= self.max_items // 2 and self._bytes <= self.max_bytes // 2
