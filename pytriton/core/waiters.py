"""One-shot futures that a coroutine waits on until the loop has news for it."""

from __future__ import annotations

import asyncio
from typing import Callable, Optional


def wake(waiter: Optional[asyncio.Future[None]]) -> None:
    """Settle `waiter` if there is one still waiting (a cancelled or woken waiter is left alone)."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class Room:
    """Where a producer waits until its consumer has taken enough (a stream's backlog): one future at a time.

    The consumer calls `wake()` once there is room again; the producer tests its own condition after each wake-up.
    """

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: Optional[asyncio.Future[None]] = None

    async def until(self, ready: Callable[[], bool]) -> None:
        """Wait until `ready()` is true, woken by `wake()`."""
        while not ready():
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter

    def wake(self) -> None:
        """Let a waiting producer test its condition again (nothing when none waits)."""
        wake(self._waiter)
