"""An async callable's call awaited in a task that its client may cancel, without the cancel reaching the callable.

A request that finds its model idle runs at once in its handler's task (core/scheduling/scheduler.py), and a gRPC cancel
or deadline cancels that task. Awaiting the callable's coroutine there would throw the CancelledError into the
callable at its current `await`. Instead the coroutine is driven here step by step, as a Task drives one, each
future it waits for shielded: a cancel ends the wait of the handler's task only, and the coroutine goes on in a
task of its own (`rest`) to its end, its result dropped, as a thread instance's call goes on in its thread. The
callable learns of the cancel from `Request.is_cancelled()`.

The callable's own cancels are another matter. A timeout (`asyncio.timeout`, and `asyncio.wait_for` from Python
3.12) or a task group in the callable cancels the task its code runs in, the handler's, and takes the cancel back
at its scope's end (a TimeoutError there). Such a cancel, told by who called `Task.cancel` (`_SCOPED_CANCELLERS`), is
thrown into the coroutine, as a task would throw it; shielded, it failed the request as one its client cancelled.

A coroutine that never waits costs about 0.6 us more; each wait about 1.5 us (a future and a callback), no loop turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
from typing import Any, Coroutine, Generator, Optional, Tuple

# Modules that cancel the task they run in for a scope of their own (a timeout, a task group) and take the cancel
# back at that scope's end: their cancel of a task that runs a callable is the callable's own.
_SCOPED_CANCELLERS = frozenset(("asyncio.timeouts", "asyncio.taskgroups", "async_timeout", "anyio._backends._asyncio"))
_TASK_MODULES = frozenset(("asyncio.tasks", "asyncio.futures"))  # Task.cancel itself, where it is not C


class CancelShieldedCall:
    """Awaitable once: the coroutine's result; a cancel of the awaiting task leaves the coroutine running in `rest`.

    With a `context`, each step of the coroutine runs in it, here and in `rest`: what a task of its own would give
    the coroutine (its own context variables) without the task (an inner call awaited in its caller's task).
    `own_cancels`: a cancel of the awaiting task by a scope of the coroutine's (a timeout, a task group) is thrown
    into it, as a task would; without, every cancel is shielded (an inner call: its caller's scopes are not its).
    """

    __slots__ = ("_context", "_coro", "_own_cancels", "rest")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        context: Optional[contextvars.Context] = None,
        own_cancels: bool = True,
    ) -> None:
        """Drive `coro` (not started yet) when awaited."""
        self._coro = coro
        self._context = context
        self._own_cancels = own_cancels
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
            waiter: Optional[_Waiter] = None
            try:
                if awaited is None:  # a bare yield (asyncio.sleep(0)): let the loop run once
                    await asyncio.sleep(0)
                else:
                    waiter = _Waiter(loop=awaited.get_loop())  # cancelled in its place, as asyncio.shield does
                    awaited.add_done_callback(functools.partial(_wake, waiter))
                    await waiter
            except asyncio.CancelledError as cancel:
                if waiter is not None and waiter.own_cancel and self._own_cancels:
                    assert awaited is not None
                    awaited.cancel()  # the coroutine's own: thrown into it, as a task throws it
                    error = cancel
                    continue
                # only the awaiting task's: the coroutine goes on without it
                self.rest = asyncio.ensure_future(_finish(coro, awaited, context))
                self.rest.add_done_callback(_drop_outcome)
                raise


class _Waiter(asyncio.Future):  # type: ignore[type-arg]
    """What the awaiting task waits on while the coroutine waits: notes whether its cancel is the coroutine's own."""

    own_cancel = False

    def cancel(self, msg: Any = None) -> bool:
        """Cancel it (the awaiting task is cancelled), noting who asked: a scope of the coroutine's, or another."""
        self.own_cancel = _canceller() in _SCOPED_CANCELLERS
        return super().cancel(msg)


def _canceller() -> str:
    """The module of the code that called Task.cancel, whose cancel of its future waiter is running now."""
    frame = sys._getframe(2)  # this function's caller is _Waiter.cancel: the frame after it asked
    while frame is not None and frame.f_globals.get("__name__") in _TASK_MODULES:
        frame = frame.f_back  # type: ignore[assignment]
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


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
