"""CancelShieldedCall: an async callable awaited in a task that gets cancelled goes on, untouched, to its end."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest

from pytriton.core.async_call import CancelShieldedCall


def test_results_errors_bare_yields_and_cancelled_futures_reach_the_coroutine_as_in_a_task() -> None:
    async def steps() -> List[Any]:
        seen: List[Any] = []
        await asyncio.sleep(0)  # a bare yield
        seen.append(await asyncio.sleep(0.001, result="slept"))
        loop = asyncio.get_running_loop()
        failing = loop.create_future()
        loop.call_soon(failing.set_exception, ValueError("bad"))
        try:
            await failing
        except ValueError as error:
            seen.append(str(error))
        cancelled = loop.create_future()
        loop.call_soon(cancelled.cancel)
        try:
            await cancelled
        except asyncio.CancelledError:
            seen.append("future cancelled")
        return seen

    async def main() -> List[Any]:
        return await CancelShieldedCall(steps())  # type: ignore[no-any-return]

    assert asyncio.run(main()) == ["slept", "bad", "future cancelled"]


def test_a_raised_error_comes_out() -> None:
    async def raises() -> None:
        await asyncio.sleep(0)
        raise KeyError("k")

    async def main() -> None:
        await CancelShieldedCall(raises())

    with pytest.raises(KeyError):
        asyncio.run(main())


def test_cancelling_the_awaiting_task_leaves_the_coroutine_running_to_its_end() -> None:
    async def main() -> None:
        release = asyncio.Event()
        events: List[str] = []

        async def callable_() -> str:
            events.append("started")
            try:
                await release.wait()
            except asyncio.CancelledError:
                events.append("interrupted")
                raise
            events.append("finished")
            return "done"

        call = CancelShieldedCall(callable_())
        handler = asyncio.ensure_future(_await(call))
        while not events:
            await asyncio.sleep(0)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert call.rest is not None and not call.rest.done()
        release.set()
        assert await call.rest == "done"
        assert events == ["started", "finished"]

    asyncio.run(main())


def test_cancelling_the_rest_cancels_the_coroutine() -> None:
    async def main() -> None:
        events: List[str] = []

        async def hangs() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append("cancelled")
                raise

        call = CancelShieldedCall(hangs())
        handler = asyncio.ensure_future(_await(call))
        await asyncio.sleep(0)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert call.rest is not None
        call.rest.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call.rest
        assert events == ["cancelled"]

    asyncio.run(main())


async def _await(call: CancelShieldedCall) -> Any:
    return await call
