"""The server's stop, as a sequence of named phases run in order on the engine's loop.

0. lame duck: for `ServerLimits.lame_duck_s`, readiness is false while requests are still served, so
   that load balancers take the replica out first (runtime/lame_duck.py).
1. refuse: readiness turns false; new requests get 503 / UNAVAILABLE.
2. drain: queued and running requests finish, up to the stop's deadline (`exit_timeout_secs` after
   the refusal); how many are left and how long they still have is logged every PROGRESS_PERIOD_S.
   A hurry (a second SIGINT/SIGTERM under `serve()`) ends the lame duck and the drain at once, and
   leaves the processes of phase 4 LEAST_GRACE_S to exit.
3. cut off: every request still open is answered with UNAVAILABLE on its own transport (HTTP 503,
   a gRPC status); a call still running goes on in its instance thread and its result is dropped.
4. close: the frontends stop (answers under way get a second; those still leaving then, such as a
   large response a slow client reads, the rest of the deadline unless hurried; connections that only
   wait for their client close) and the instances' threads end after their calls; an instance process
   told to exit that has not by the same deadline is killed (LEAST_GRACE_S after it was told at the
   earliest: ipc/spawn.stop_process), so a process whose exit hangs holds no stop past it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from typing import Any, Awaitable, Callable, List, Optional, Sequence

from pytriton.core.engine import Engine
from pytriton.options.routes import CustomRoutes
from pytriton.runtime.lame_duck import Leaving, lame_duck

LOGGER = logging.getLogger("pytriton")

PROGRESS_PERIOD_S = 5.0
# How long a stop may run past its lame duck and exit_timeout_secs (the frontends' grace, instance processes
# killed at the deadline) before the caller gives up waiting on it and logs where it is stuck.
OVERRUN_S = 10.0


class StopSequence:
    """One stop of a server: `run()` goes through the phases; `hurried` cuts the lame duck and the drain short."""

    def __init__(
        self,
        engine: Engine,
        *,
        frontends: Sequence[Leaving],
        close_ports: Callable[[float], Awaitable[None]],
        lame_duck_s: float,
        exit_timeout_s: float,
        hurried: asyncio.Event,
        routes: Optional[CustomRoutes] = None,
    ) -> None:
        """Stop `engine` and then the ports (`close_ports`), after a lame duck, draining up to `exit_timeout_s`.

        The drain waits for the custom routes' running handlers too, and the cut-off gives them up (503).
        """
        self._engine = engine
        self._routes = routes
        self._frontends = frontends
        self._close_ports = close_ports
        self._lame_duck_s = lame_duck_s
        self._exit_timeout_s = exit_timeout_s
        self._hurried = hurried
        self._reason = ""  # why the drain ended with requests still open
        self._deadline: Optional[float] = None  # time.monotonic(): exit_timeout_s after the refusal

    async def run(self) -> None:
        """Lame duck, refuse, drain, cut off and close, in this order."""
        for phase in (self.lame_duck, self.refuse, self.drain, self.cut_off, self.close):
            await phase()

    async def lame_duck(self) -> None:
        """Unready but serving for lame_duck_s (nothing when 0), unless a hurry comes first."""
        leaving = asyncio.ensure_future(lame_duck(self._engine, self._frontends, self._lame_duck_s))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait({leaving, hurried}, return_when=asyncio.FIRST_COMPLETED)
            if leaving.done():
                leaving.result()
        finally:
            leaving.cancel()
            hurried.cancel()

    async def refuse(self) -> None:
        """Unready; new requests are refused from now on, and the stop's deadline is set."""
        self._deadline = time.monotonic() + self._exit_timeout_s
        self._engine.refuse()

    async def drain(self) -> None:
        """Let queued and running requests finish until the deadline or a hurry, logging what is left."""
        if not self._open():
            return
        deadline = self._deadline if self._deadline is not None else time.monotonic() + self._exit_timeout_s
        LOGGER.info(
            "stopping: waiting up to %g s (exit_timeout_secs) for %s",
            self._exit_timeout_s,
            self._describe_open_requests(),
        )
        idle = asyncio.ensure_future(self._until_idle())
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            while True:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    self._reason = f"exit_timeout_secs ({self._exit_timeout_s:g} s) is over"
                    return
                await asyncio.wait(
                    {idle, hurried}, timeout=min(PROGRESS_PERIOD_S, left_s), return_when=asyncio.FIRST_COMPLETED
                )
                if idle.done():
                    LOGGER.info("stopping: every request finished")
                    return
                if hurried.done():
                    self._reason = "stopping at once"
                    return
                left_s = deadline - time.monotonic()
                if left_s >= 1:
                    LOGGER.info("stopping: %s still open, cut off in %.0f s", self._describe_open_requests(), left_s)
        finally:
            idle.cancel()
            hurried.cancel()

    async def cut_off(self) -> None:
        """Answer every request still open with an error."""
        open_requests = self._describe_open_requests()
        count = self._engine.cut_off() + (self._routes.cut_off() if self._routes is not None else 0)
        if count:
            LOGGER.warning("%s: %s answered with an error (UNAVAILABLE)", self._reason, open_requests)

    async def close(self) -> None:
        """Close the ports and stop the instances (a process that will not exit is killed at the deadline).

        After a hurry the deadline is now: a process told to exit gets LEAST_GRACE_S only.
        """
        deadline = time.monotonic() if self._hurried.is_set() or self._deadline is None else self._deadline
        await self._close_ports(max(deadline - time.monotonic(), 0.0))
        await self._engine.close(deadline=deadline)

    def _open(self) -> int:
        """The requests queued or running, those of custom routes included."""
        return sum(self._engine.open_requests()) + (self._routes.running if self._routes is not None else 0)

    async def _until_idle(self) -> None:
        """Return once no request is queued or running (a route's handler may still call a model after its wait)."""
        while True:
            await self._engine.until_idle()
            if self._routes is not None:
                await self._routes.until_idle()
            if not self._open():
                return

    def _describe_open_requests(self) -> str:
        """'3 requests (2 running, 1 queued)'; '... and 1 custom route request', or '2 custom route requests' alone."""
        queued, running = self._engine.open_requests()
        total = queued + running
        text = f"{total} request{'' if total == 1 else 's'} ({running} running, {queued} queued)"
        routes = self._routes.running if self._routes is not None else 0
        if routes:
            described = f"{routes} custom route request{'' if routes == 1 else 's'}"
            text = f"{text} and {described}" if total else described
        return text


def where_stuck(loop: asyncio.AbstractEventLoop) -> str:
    """The stacks of every thread and of the loop's pending tasks, for the log of a stop that overran.

    Read from another thread while the loop may still run: good enough to show where a stop waits.
    """
    lines: List[str] = []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        lines.append(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}")
    try:
        tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    except RuntimeError:  # the set changed while it was read
        tasks = []
    for task in tasks:
        lines.append(f"task {task.get_name()}, awaiting:\n{_awaits(task.get_coro())}")
    return "\n".join(lines)


def _awaits(coroutine: Any) -> str:
    """Where a suspended coroutine waits: the chain of coroutines it awaits, outermost first."""
    lines: List[str] = []
    while coroutine is not None and getattr(coroutine, "cr_frame", None) is not None:
        frame = coroutine.cr_frame
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coroutine = coroutine.cr_await
    if coroutine is not None:
        lines.append(f"  {coroutine!r}")
    return "\n".join(lines)
