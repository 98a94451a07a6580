"""The batches of a model whose call is running, and the cut-off that answers their requests at once.

When the server's stop reaches its deadline, a call may still run (a hung model, a long generation).
Its requests must not wait for it: each batch's waiting task is cancelled, fails its requests with
UNAVAILABLE and goes on. That task may be a transport's own (a request run at once is awaited in the
handler's task), so the cancel is taken back: the handler then sends the error on its own transport.
The call itself goes on in its instance thread; its result is dropped.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Dict, Optional


class InFlight:
    """The tasks waiting for running calls, with their request counts; everything runs on the engine's loop."""

    def __init__(self) -> None:
        """No call is running and the cut-off has not come."""
        self._waiting: Dict[asyncio.Task[Any], int] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the engine's: current_task(loop) costs 50 ns, not 200
        self.cut = False  # True from cut_off() until reset(): a batch starting now is answered at once

    def enter(self, requests: int) -> asyncio.Task[Any]:
        """The current task waits for a batch of `requests`; return it for leave()."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        self._waiting[task] = requests
        return task

    def leave(self, task: asyncio.Task[Any]) -> None:
        """The task's batch was answered."""
        del self._waiting[task]

    @property
    def requests(self) -> int:
        """The requests whose call is running."""
        return sum(self._waiting.values())

    def cut_off(self) -> int:
        """Cancel every waiting task (each answers its batch, see `answered`); return their request count."""
        self.cut = True
        for task in self._waiting:
            task.cancel()
        return self.requests

    def answered(self, error: BaseException, task: asyncio.Task[Any]) -> bool:
        """Whether `error` is the cut-off's cancel of `task`: its requests are answered and the task goes on."""
        if not (self.cut and isinstance(error, asyncio.CancelledError)):
            return False
        if sys.version_info >= (3, 11):
            task.uncancel()  # else asyncio.timeout() and TaskGroup would count a cancel nobody asked for
        return True

    def reset(self) -> None:
        """Serve again after a cut-off (a model loaded again)."""
        self.cut = False
