"""Waking another thread or the event loop with a byte on a pipe, written without holding the GIL.

`queue.SimpleQueue.put` and uvloop's `call_soon_threadsafe` wake the other thread while still holding
the GIL. On a busy core the woken thread then runs, finds the GIL taken, and sleeps again: a round trip
from the loop to an instance thread and back costs about 7 context switches and 22 us on one core. A
pipe write releases the GIL for the system call, so the woken thread takes it at once: 2 context
switches and 9 us (measured on the bench machine, both threads on one core).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections import deque
from typing import Any, Callable, Deque, Tuple

# How much a wake-up reads at once: every pending ring is consumed, whatever was rung is then handled.
_DRAIN_BYTES = 4096
# How many quietly posted calls may wait for the loop's next wake-up (LoopInbox.post_quietly).
QUIET_CALLS = 64


class Doorbell:
    """A pipe: `ring` from any thread, `take` the rings on the other side.

    Rings may coalesce or outnumber what they announce: the woken side must check its own state. The
    pipe ends close when the doorbell is collected, never while a thread may still use them.
    """

    def __init__(self, blocking: bool) -> None:
        """Create the pipe; `blocking`: `take` waits for a ring when none is pending (else it never blocks)."""
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        os.set_blocking(self._read_fd, blocking)
        # Not at exit (a finalizer's default): a server still running then has threads blocked on the pipe.
        weakref.finalize(self, _close, self._read_fd, self._write_fd).atexit = False

    def fileno(self) -> int:
        """The read end, for an event loop to watch."""
        return self._read_fd

    def ring(self) -> None:
        """Wake the other side (releases the GIL during the write)."""
        try:
            os.write(self._write_fd, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of rings the other side has yet to read: it will wake

    def take(self) -> None:
        """Consume the pending rings (a blocking doorbell first waits for one)."""
        try:
            os.read(self._read_fd, _DRAIN_BYTES)
        except BlockingIOError:
            pass  # not blocking, and no ring pending


def _close(*fds: int) -> None:
    """Close a collected doorbell's pipe."""
    for fd in fds:
        os.close(fd)


class LoopInbox:
    """Calls that other threads post to one event loop, run on it in the order posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch a new doorbell on `loop` (held weakly: the inbox must not keep its loop alive)."""
        self._loop = weakref.ref(loop)
        self._calls: Deque[Tuple[Callable[..., Any], Tuple[Any, ...]]] = deque()
        self._doorbell = Doorbell(blocking=False)
        loop.add_reader(self._doorbell, self._run_calls)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call `fn(*args)` on the loop soon; from any thread. RuntimeError once the loop is closed."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            raise RuntimeError("Event loop is closed")
        self._calls.append((fn, args))
        self._doorbell.ring()

    def post_quietly(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call `fn(*args)` on the loop with the calls of the next `post`; from any thread.

        Saves a wake-up (of the loop, and the GIL it then takes) where a thread knows it posts again soon. The
        call that makes QUIET_CALLS wait rings once: ringing on each call after it, while the loop waits for the
        GIL to run them, cost a switch to the loop and back each time (7 us a call).
        """
        calls = self._calls
        calls.append((fn, args))
        if len(calls) == QUIET_CALLS:
            self._doorbell.ring()

    def _run_calls(self) -> None:
        """On the loop: run every posted call; one that raises is reported like a failed callback."""
        self._doorbell.take()
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception as error:  # noqa: BLE001 - reported, and the other calls still run
                loop = self._loop()
                if loop is not None:
                    loop.call_exception_handler({"message": f"exception in {fn!r}", "exception": error})


_INBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox] = weakref.WeakKeyDictionary()


def inbox_of(loop: asyncio.AbstractEventLoop) -> LoopInbox:
    """The inbox of an event loop, created on the loop's thread the first time it is asked for."""
    inbox = _INBOXES.get(loop)
    if inbox is None:
        inbox = _INBOXES[loop] = LoopInbox(loop)
    return inbox
