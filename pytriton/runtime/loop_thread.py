"""The one background event loop that owns I/O and scheduling."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Awaitable, Callable, Optional, TypeVar

from pytriton.runtime.signals import SIGNAL_POLL_S

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running in a daemon thread; other threads reach it only through `run`/`call`."""

    def __init__(self, name: str = "pytriton-loop") -> None:
        """Start the loop thread and wait until the loop runs."""
        self.loop = new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        """Thread body: run the loop until stopped, then close it."""
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        """Cancel what is left, finish async generators, close the loop."""
        loop = self.loop
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def run(self, awaitable: Awaitable[T], timeout: Optional[float] = None) -> T:
        """Run a coroutine on the loop and wait for its result from another thread.

        The main thread waits in steps of SIGNAL_POLL_S: a signal the kernel hands to another thread
        (the loop's, an instance's) runs its Python handler only once the main thread runs again, and a
        second Ctrl+C during a long stop must not wait for the stop to end.

        Raises:
            RuntimeError: called on the loop's own thread, or with the loop's thread gone (in a process forked
                from the one it runs in), where the wait would never end.
        """
        if self.is_own_thread() or not self.alive:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never started: no "never awaited" warning
            where = "on that loop's own thread" if self.alive else "whose thread is not in this process"
            raise RuntimeError(f"a wait for the server's event loop {where}: it would never end")
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self.loop)
        if threading.current_thread() is not threading.main_thread():
            return future.result(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = SIGNAL_POLL_S if deadline is None else min(SIGNAL_POLL_S, max(deadline - time.monotonic(), 0.0))
            try:
                return future.result(step)
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    @property
    def ident(self) -> int:
        """The loop thread's identifier (`threading.get_ident()` in it)."""
        return self._thread.ident or 0

    def is_own_thread(self) -> bool:
        """Whether the calling thread is the loop's."""
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a plain function on the loop thread and return its result (at once when called there)."""
        if self.is_own_thread():
            return fn(*args)

        async def _call() -> T:
            return fn(*args)

        return self.run(_call())

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a function on the loop without waiting."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait for its thread."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the loop thread runs."""
        return self._thread.is_alive()


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    """Wrap any awaitable in a coroutine."""
    return await awaitable
