"""The instance thread: jobs run off the loop, their results come back to it, hand-overs leave nothing behind."""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Callable, List

import pytest

from pytriton.core.worker import WorkerThread


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_jobs_run_in_the_thread_and_settle_on_the_loop() -> None:
    async def main() -> List[object]:
        worker = WorkerThread("test-worker")
        loop_thread = threading.get_ident()
        try:
            plain = worker.submit(threading.get_ident)
            handed = worker.submit(lambda value: value * 2, 21, hand_over=True)
            return [await plain, await handed, loop_thread]
        finally:
            worker.close()

    thread_ident, doubled, loop_thread = run(main())  # type: ignore[misc]
    assert doubled == 42 and thread_ident != loop_thread


def test_a_handed_over_job_has_been_taken_when_submit_returns() -> None:
    async def main() -> None:
        worker = WorkerThread("test-worker")
        release = threading.Event()
        try:
            first = worker.submit(release.wait, 5.0)  # warms the thread up
            release.set()
            await first
            release.clear()
            held = worker.submit(release.wait, 5.0, hand_over=True)
            assert not worker._jobs, "the thread has not taken the job yet"
            release.set()
            assert await held is True
        finally:
            worker.close()

    run(main())


@pytest.mark.parametrize("hand_over", [False, True])
def test_many_jobs_leave_no_notes_behind(hand_over: bool) -> None:
    """Every job the thread takes leaves a note only when its submitter waits for it (a leak otherwise)."""

    async def main() -> int:
        worker = WorkerThread("test-worker")
        try:
            for value in range(500):
                assert await worker.submit(abs, -value, hand_over=hand_over) == value
            return worker._taken.qsize()
        finally:
            worker.close()

    assert run(main()) <= 1  # one late note at most, from a hand-over that timed out


class _Tracked:
    """An object whose lifetime a test watches through a weak reference."""


def _returns_another(_: object) -> object:
    return _Tracked()


class _Failed(ValueError):
    """An error a weak reference can watch (built-in exceptions take none)."""


def _raises(_: object) -> object:
    raise _Failed("the callable failed")


@pytest.mark.parametrize("call", [_returns_another, _raises], ids=["returned", "raised"])
def test_an_idle_worker_holds_nothing_of_its_last_job(call: Callable[[object], object]) -> None:
    """Once a job's future settled and its submitter let go, neither its arguments nor its result stay alive.

    The thread used to keep both in its locals until its next job: a batch's inputs (views of a request
    buffer, which then could not be reused) and outputs, and at exit a torch tensor among them was freed by
    the thread while the interpreter finalized, which aborted the process ("terminate called without an
    active exception").
    """

    async def main() -> List[weakref.ref[_Tracked]]:
        worker = WorkerThread("test-worker")
        try:
            argument = _Tracked()
            try:
                result: object = await worker.submit(call, argument)
            except _Failed as error:
                result = error
            refs = [weakref.ref(argument), weakref.ref(result)]
            del argument, result
            for _ in range(100):  # the thread lets go once it is back waiting for a job
                if all(ref() is None for ref in refs):
                    break
                await asyncio.sleep(0.01)
            return refs
        finally:
            worker.close()

    refs = run(main())
    assert [ref() for ref in refs] == [None, None]  # type: ignore[union-attr]


def test_a_worker_opens_its_pipe_only_with_its_first_job() -> None:
    """An instance whose callable is async never uses its thread: it must not hold a pipe for it."""
    idle = WorkerThread("test-worker")
    assert idle._doorbell is None
    idle.close()  # nothing to stop, nothing raised

    async def main() -> object:
        worker = WorkerThread("test-worker")
        try:
            return await worker.submit(abs, -3), worker._doorbell is not None
        finally:
            worker.close()

    assert run(main()) == (3, True)


def test_a_thread_instance_opens_its_pipe_when_made_and_an_async_one_never() -> None:
    """A sync callable's pipe is opened with its instance (out of descriptors, binding fails, not a request)."""
    from pytriton.core.instances import Instance

    async def coroutine(requests: object) -> object:
        return requests

    assert Instance(abs, "sync")._worker._doorbell is not None
    assert Instance(coroutine, "async")._worker._doorbell is None
