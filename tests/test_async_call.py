"""CancelShieldedCall: an async callable awaited in a task that gets cancelled goes on, untouched, to its end."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Dict, List

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.core.scheduling.async_call import CancelShieldedCall
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton
from tests.conftest import http_url, running_triton


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


def _own_scopes() -> List[str]:
    """The scopes that cancel the task their code runs in, on this Python: a timeout and a task group from 3.11
    (and wait_for from 3.12); before 3.11 wait_for runs what it waits for in a task of its own."""
    return ["wait_for", "timeout", "task_group"] if sys.version_info >= (3, 11) else ["wait_for"]


async def _times_out(scope: str) -> str:
    """A callable whose own scope cancels its wait: it takes the cancel back and answers."""
    if scope == "wait_for":
        try:
            await asyncio.wait_for(asyncio.sleep(5), 0.01)
        except asyncio.TimeoutError:
            return "timed out"
    elif scope == "timeout":
        try:
            async with asyncio.timeout(0.01):  # type: ignore[attr-defined]
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
    else:

        async def fails() -> None:
            await asyncio.sleep(0.01)
            raise KeyError("child")

        try:
            async with asyncio.TaskGroup() as group:  # type: ignore[attr-defined]
                group.create_task(fails())
                await asyncio.sleep(5)  # cancelled by the group when its child fails
        except BaseException as error:  # noqa: BLE001 - an ExceptionGroup (Python 3.11+), named below
            return f"group failed: {type(error).__name__}"
    return "not cancelled"


def test_a_cancel_by_a_scope_of_the_callables_own_is_thrown_into_it_and_taken_back() -> None:
    """A timeout or task group in the callable cancels the task it runs in: it is the callable's, not a client's."""

    async def main() -> List[str]:
        answers = []
        for scope in _own_scopes():
            call = CancelShieldedCall(_times_out(scope))
            handler = asyncio.ensure_future(_await(call))
            answers.append(await handler)
            assert call.rest is None
        return answers

    expected = {"wait_for": "timed out", "timeout": "timed out", "task_group": "group failed: ExceptionGroup"}
    assert asyncio.run(main()) == [expected[scope] for scope in _own_scopes()]


def test_an_async_model_whose_own_timeout_expires_answers_its_request() -> None:
    """Served: the request runs at once in its handler's task, which the callable's own timeout cancels."""

    async def model(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        answers = [await _times_out(scope) for scope in _own_scopes()]
        return [{"y": np.array([answer.encode() for answer in answers], dtype=object)} for _ in requests]

    def bind(triton: Triton) -> None:
        triton.bind(
            "timing_out",
            model,
            [Tensor(name="x", dtype=np.float32, shape=(1,))],
            [Tensor(name="y", dtype=bytes, shape=(-1,))],
            config=ModelConfig(batching=False),
        )

    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        given = httpclient.InferInput("x", [1], "FP32")
        given.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        answer = client.infer("timing_out", [given]).as_numpy("y")
    assert answer is not None
    assert [item.decode() for item in answer.tolist()] == [
        {"wait_for": "timed out", "timeout": "timed out", "task_group": "group failed: ExceptionGroup"}[scope]
        for scope in _own_scopes()
    ]


async def _await(call: CancelShieldedCall) -> Any:
    return await call
