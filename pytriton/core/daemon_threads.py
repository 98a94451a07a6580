"""A pool of daemon threads: jobs that may never return hold no process's exit."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable, Optional, Protocol, TypeVar

from pytriton.core.errors import CONTROL_FLOW, CallableRaised

LOGGER = logging.getLogger("pytriton")
T = TypeVar("T")


class DaemonThreads:
    """Up to `most` daemon threads, made as needed, that run the jobs given in turn.

    Not a ThreadPoolExecutor: Python joins its threads as the interpreter exits, even after shutdown(wait=False),
    so a job that never returns (a route's hung handler) would keep the process alive after the server closed.
    Used by custom routes' plain handlers, in the server (transport/http/custom.py) and in a RemoteTriton
    (runtime/remote_routes.py), and by large shared-memory copies (core/shared_memory/off_loop.py); `awaited`
    runs a call in one for a coroutine.
    """

    def __init__(self, most: int, name: str) -> None:
        """No thread yet."""
        self._most = most
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Optional[Callable[[], None]]] = queue.SimpleQueue()
        self._threads = 0
        self._waiting = 0  # threads waiting for a job
        self._untaken = 0  # jobs no thread took yet

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job()` in one of the threads.

        Raises:
            RuntimeError: no thread runs, and none can be started now (a thread limit, no memory for its stack).
        """
        with self._lock:
            self._untaken += 1
            more = self._untaken > self._waiting and self._threads < self._most
            if more:
                self._threads += 1
        if more:
            try:
                threading.Thread(target=self._work, name=self._name, daemon=True).start()
            except RuntimeError:
                # Counted, the thread that never started took a place for ever: `most` such failures, and every later
                # job waited for a thread that would never come, once threads could be started again too.
                with self._lock:
                    self._threads -= 1
                    alone = self._threads == 0
                    if alone:
                        self._untaken -= 1
                if alone:
                    raise
                # the threads there are take it in turn
        self._jobs.put(job)

    def shutdown(self) -> None:
        """Let each thread end once it is done with the jobs given before (a hung one never does; it holds nothing)."""
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            job = self._jobs.get()
            with self._lock:
                self._waiting -= 1
                if job is not None:
                    self._untaken -= 1
            if job is None:
                return
            try:
                job()
            except Exception:  # the thread serves the next job
                LOGGER.exception("%s: a job failed", self._name)
            del job


class Submits(Protocol):
    """What runs jobs in threads: a DaemonThreads (or a stand-in of a test's)."""

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job()` in a thread."""


def awaited(pool: Submits, call: Callable[[], T]) -> asyncio.Future[T]:
    """Run `call()` in one of `pool`'s threads; the returned future, on the running loop, gets its outcome.

    A waiter that gives up (cancels the future) leaves the call to finish on its own. What the call raises of
    CONTROL_FLOW comes as a CallableRaised: asyncio refuses a StopIteration on a future, which then never settled.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        result: Any = None
        error: Optional[BaseException] = None
        try:
            result = call()
        except BaseException as raised:  # noqa: BLE001 - handed to the waiter on the loop
            error = CallableRaised(raised) if isinstance(raised, CONTROL_FLOW) else raised
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:  # the loop closed while the call ran: nobody waits for it
            pass

    pool.submit(job)
    return future


def _settle(future: asyncio.Future[Any], result: Any, error: Optional[BaseException]) -> None:
    """On the loop: a call's outcome, unless its waiter gave up."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
