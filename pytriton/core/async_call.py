"""An async callable's call awaited in a task that its client may cancel, without the cancel reaching the callable.

A request that finds its model idle runs at once in its handler's task (core/scheduler.py), and a gRPC cancel or
deadline cancels that task. Awaiting the callable's coroutine there would throw the CancelledError into the
callable at its current `await`. Instead the coroutine is driven here step by step, as a Task drives one, each
future it waits for shielded: a cancel ends the wait of the handler's task only, and the coroutine goes on in a
task of its own (`rest`) to its end, its result dropped, as a thread instance's call goes on in its thread. The
callable learns of the cancel from `Request.is_cancelled()`.

A coroutine that never waits costs about 0.6 us more; each wait about 1.5 us (a future and a callback), no loop turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from typing import Any, Coroutine, Generator, Optional, Tuple


class CancelShieldedCall:
    """Awaitable once: the coroutine's result; a cancel of the awaiting task leaves the coroutine running in `rest`.

    With a `context`, each step of the coroutine runs in it, here and in `rest`: what a task of its own would give
    the coroutine (its own context variables) without the task (an inner call awaited in its caller's task).
    """

    __slots__ = ("_context", "_coro", "rest")

    def __init__(self, coro: Coroutine[Any, Any, Any], context: Optional[contextvars.Context] = None) -> None:
        """Drive `coro` (not started yet) when awaited."""
        self._coro = coro
        self._context = context
        self.rest: Optional[asyncio.Task[Any]] = None  # where the coroutine goes on after a cancel

    def __await__(self) -> Generator[Any, None, Any]:
        """The coroutine's result or exception."""
        return self._drive().__await__()

    async def _drive(self) -> Any:
        coro, context = self._coro, self._context
        error: Optional[BaseException] = None
        while True:
            try:
                awaited = _step(coro, error, context)
            except StopIteration as stop:
                return stop.value
            awaited, error = _taken(awaited)
            if error is not None:
                continue
            try:
                if awaited is None:  # a bare yield (asyncio.sleep(0)): let the loop run once
                    await asyncio.sleep(0)
                else:
                    waiter = awaited.get_loop().create_future()  # cancelled in its place, as asyncio.shield does
                    awaited.add_done_callback(functools.partial(_wake, waiter))
                    await waiter
            except asyncio.CancelledError:  # only the awaiting task's: the coroutine goes on without it
                self.rest = asyncio.ensure_future(_finish(coro, awaited, context))
                self.rest.add_done_callback(_drop_outcome)
                raise


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    """The future a coroutine waits for is done: the task that drives it goes on (unless it was cancelled)."""
    if not waiter.done():
        waiter.set_result(None)


def _taken(awaited: Any) -> Tuple[Optional[asyncio.Future[Any]], Optional[BaseException]]:
    """What a coroutine step yielded, as a Task takes it: a future to wait for (None: a bare yield), or an error."""
    if awaited is None:
        return None, None
    if not getattr(awaited, "_asyncio_future_blocking", False):
        return None, RuntimeError(f"the callable's coroutine yielded {awaited!r}, not an asyncio future")
    awaited._asyncio_future_blocking = False
    return awaited, None


def _step(
    coro: Coroutine[Any, Any, Any], error: Optional[BaseException], context: Optional[contextvars.Context]
) -> Any:
    """One step of the coroutine (in `context` if given): what it yields; StopIteration at its end."""
    if context is None:
        return coro.send(None) if error is None else coro.throw(error)
    return context.run(coro.send, None) if error is None else context.run(coro.throw, error)


async def _finish(
    coro: Coroutine[Any, Any, Any], awaited: Optional[asyncio.Future[Any]], context: Optional[contextvars.Context]
) -> Any:
    """Drive the coroutine to its end in this task, from the wait it was in; cancelling this task cancels it."""
    error: Optional[BaseException] = None
    while True:
        if error is None:
            try:
                if awaited is None:
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait([awaited])
            except asyncio.CancelledError as cancel:
                if awaited is not None:
                    awaited.cancel()
                error = cancel
        try:
            awaited = _step(coro, error, context)
        except StopIteration as stop:
            return stop.value
        awaited, error = _taken(awaited)


def _drop_outcome(task: asyncio.Task[Any]) -> None:
    """Nobody reads the result of a call whose client left: read its exception so that it is not reported."""
    if not task.cancelled():
        task.exception()
