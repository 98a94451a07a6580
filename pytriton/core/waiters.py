"""One-shot futures that a coroutine waits on until the loop has news for it."""

from __future__ import annotations

import asyncio
from typing import Optional


def wake(waiter: Optional[asyncio.Future[None]]) -> None:
    """Settle `waiter` if there is one still waiting (a cancelled or woken waiter is left alone)."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
