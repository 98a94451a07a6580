"""A daemon worker thread that runs sync callables and settles asyncio futures on the loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, List, Optional, Tuple

_Job = Tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], Tuple[Any, ...]]


class WorkerThread:
    """One daemon thread with a job queue; a hung callable never keeps the process alive."""

    def __init__(self, name: str) -> None:
        """Create the worker; its thread starts with the first job."""
        self.name = name
        self._jobs: queue.SimpleQueue[Optional[_Job]] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._unfinished = 0  # jobs submitted and not finished yet (read and written on the loop only)
        self._on_idle: List[Tuple[Callable[..., None], Tuple[Any, ...]]] = []

    def when_idle(self, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(*args)` on the loop once every submitted job has finished (at once when none is left)."""
        if self._unfinished:
            self._on_idle.append((callback, args))
        else:
            callback(*args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` in the thread; the returned future settles on the calling loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
        self._unfinished += 1
        self._jobs.put((loop, future, fn, args))
        return future

    def _work(self) -> None:
        """Run jobs until told to stop."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            loop, future, fn, args = job
            result: Any = None
            error: Optional[BaseException] = None
            try:
                result = fn(*args)
            except BaseException as raised:  # noqa: BLE001 - handed to the waiter on the loop
                error = raised
            try:
                loop.call_soon_threadsafe(self._finished, future, result, error)
            except RuntimeError:  # the loop closed while the job ran: nobody is waiting
                pass

    def _finished(self, future: asyncio.Future[Any], result: Any, error: Optional[BaseException]) -> None:
        """On the loop: settle a job's future unless its waiter gave up; run the idle callbacks after the last job."""
        self._unfinished -= 1
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if not self._unfinished and self._on_idle:
            callbacks, self._on_idle = self._on_idle, []
            for callback, args in callbacks:
                callback(*args)

    def close(self) -> None:
        """Stop the thread after the job it is running, if any."""
        self._jobs.put(None)
