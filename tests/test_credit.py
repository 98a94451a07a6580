"""An answer sent in parts is held to a window (ipc/credit.py): the sender waits while too much is not yet taken."""

from __future__ import annotations

import asyncio
from typing import List, cast

from pytriton.ipc.credit import WINDOW_BYTES, WINDOW_PARTS, Credit

KIB = 1024


async def _steps(count: int = 5) -> None:
    """Let the loop run what is ready (a task not done after this waits for something not yet done)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def _send_all(credit: Credit, sizes: List[int], until: asyncio.Future[None], sent: List[int]) -> None:
    for size in sizes:
        await credit.sent(size, until)
        sent.append(size)


def test_a_sender_waits_once_a_window_of_bytes_is_in_flight_and_goes_on_as_parts_are_taken() -> None:
    async def main() -> None:
        credit, sent = Credit(), cast(List[int], [])
        until = asyncio.get_running_loop().create_future()
        part = 100 * KIB
        sending = asyncio.ensure_future(_send_all(credit, [part] * 4, until, sent))
        await _steps()
        assert len(sent) == WINDOW_BYTES // part  # the next one past the window waits, sent but not returned
        credit.taken()
        await _steps()
        assert len(sent) == WINDOW_BYTES // part + 1
        for _ in range(3):
            credit.taken()
        await _steps()
        assert sending.done() and len(sent) == 4

    asyncio.run(main())


def test_parts_of_no_bytes_are_held_to_a_window_of_parts() -> None:
    # A stream of empty parts (keep-alives) would otherwise cost a message each without limit.
    async def main() -> None:
        credit, sent = Credit(), cast(List[int], [])
        until = asyncio.get_running_loop().create_future()
        sending = asyncio.ensure_future(_send_all(credit, [0] * (WINDOW_PARTS + 2), until, sent))
        await _steps()
        assert len(sent) == WINDOW_PARTS
        credit.taken()
        await _steps()
        assert len(sent) == WINDOW_PARTS + 1
        until.set_result(None)  # the receiver left: nothing waits any more
        await _steps()
        assert sending.done() and len(sent) == WINDOW_PARTS + 2

    asyncio.run(main())


def test_a_part_larger_than_the_window_goes_alone() -> None:
    async def main() -> None:
        credit, sent = Credit(), cast(List[int], [])
        until = asyncio.get_running_loop().create_future()
        sending = asyncio.ensure_future(_send_all(credit, [4 * WINDOW_BYTES, 1], until, sent))
        await _steps()
        assert sent == []
        credit.taken()
        await _steps()
        assert sending.done() and sent == [4 * WINDOW_BYTES, 1]

    asyncio.run(main())
