"""SIGINT and SIGTERM under `serve()`: the first stops the server gracefully, the next one at once."""

from __future__ import annotations

import _thread
import contextlib
import logging
import signal
import threading
import time
from typing import Any, Callable, Iterator, List

LOGGER = logging.getLogger("pytriton")

# How long the main thread waits, at most, before it runs the Python handler of a signal that the kernel
# delivered to another thread (which only sets a flag): waits in the main thread go in steps this long.
SIGNAL_POLL_S = 0.1


@contextlib.contextmanager
def stop_on_signals(stopping: threading.Event, hurry: Callable[[], None]) -> Iterator[None]:
    """In the main thread, make SIGINT and SIGTERM stop the server instead of killing the process.

    The first signal sets `stopping` (the server drains, up to exit_timeout_secs); a signal that comes
    while it is set calls `hurry()` (what is still open is answered with an error now). The previous
    handlers come back when the block ends. Other threads cannot handle signals: nothing changes there.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    received: List[int] = []  # the signals that started the stop (the handler takes no lock: see below)

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if received or stopping.is_set():
            LOGGER.warning("received %s while stopping: stopping at once", name)
            hurry()
            return
        received.append(signum)
        LOGGER.info("received %s: stopping gracefully (send SIGINT or SIGTERM again to stop at once)", name)
        # Set by another thread: the handler runs in the main thread between two of its bytecodes, maybe inside
        # `stopping.wait()` with the event's lock held, which is not reentrant (stopping.set() here hung the stop,
        # 1 run in 75 under load).
        try:
            _thread.start_new_thread(stopping.set, ())
        except RuntimeError:  # no thread can start (the process is at its limit): here, as before
            stopping.set()

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_in_main_thread(event: threading.Event, timeout_s: float) -> bool:
    """`event.wait(timeout_s)` in steps of SIGNAL_POLL_S, so that signal handlers run on time; whether it is set."""
    deadline = time.monotonic() + timeout_s
    while not event.wait(max(min(SIGNAL_POLL_S, deadline - time.monotonic()), 0.0)):
        if time.monotonic() >= deadline:
            return False
    return True
