"""How many turns the event loop gave other tasks while one awaitable ran: whether it held the loop."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Tuple, TypeVar

T = TypeVar("T")


def run_counting_turns(make: Callable[[], Awaitable[T]]) -> Tuple[T, int]:
    """Run `make()` on a fresh loop beside a task that counts its own turns; the result and that count."""
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def main() -> Tuple[T, int]:
        other = asyncio.ensure_future(other_task())
        await asyncio.sleep(0)
        before = turns
        result = await make()
        other.cancel()
        return result, turns - before

    return asyncio.run(main())
