"""Watching the clients of waiting requests: one that leaves takes its request out of the queue, or cancels it."""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from typing import Any, Awaitable, Callable, Generic, Iterable, Optional, Protocol, TypeVar

# Returns once a request's client has disconnected.
Disconnect = Callable[[], Awaitable[Any]]
# A request queued at least this long starts watching for its client's disconnect.
WATCH_AFTER_S = 0.1
_WATCH_AFTER_NS = int(WATCH_AFTER_S * 1e9)


class Watched(Protocol):
    """What a watched request holds: its client's `gone`, the watcher awaiting it, and when it came."""

    gone: Optional[Callable[[], Awaitable[Any]]]
    watcher: Optional[asyncio.Future[Any]]
    enqueue_ns: int


W = TypeVar("W", bound=Watched)


class QueueWatch(Generic[W]):
    """Watches the clients of one model's requests once they have waited WATCH_AFTER_S, queued or running.

    A sweep every WATCH_AFTER_S while requests wait or run starts a watcher (`gone()` in a task) for each
    request waiting that long, so a request answered sooner costs no watcher. A request that runs when
    its client leaves is cancelled: its callable sees `is_cancelled()`, its response is dropped.
    """

    def __init__(
        self, queues: Iterable[W], running: Callable[[], Iterable[W]], client_left: Callable[[W], None]
    ) -> None:
        """Watch requests in `queues` and `running()`; `client_left(entry)` runs for one whose client left."""
        self._queues = queues
        self._running = running
        self._client_left = client_left
        self._timer: Optional[asyncio.TimerHandle] = None

    def watch(self, entry: W, gone: Disconnect) -> None:
        """Watch a request just queued or started, should it wait WATCH_AFTER_S."""
        entry.gone = gone
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._sweep)

    def stop(self) -> None:
        """Start no more watchers."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sweep(self) -> None:
        """Start the watchers that are due; look again later while requests wait."""
        self._timer = None
        due_ns = time.monotonic_ns() - _WATCH_AFTER_NS
        waiting = False
        for entries in (self._queues, self._running()):
            for entry in entries:
                waiting = True
                if entry.gone is not None and entry.watcher is None and entry.enqueue_ns <= due_ns:
                    watcher = entry.watcher = asyncio.ensure_future(entry.gone())
                    # Held weakly: the watch ends with the client's connection or its answer's end, and a request
                    # answered (its inputs, its response) goes with its last other holder, not then (on the loop,
                    # where a million strings took 10-20 ms to free, after the transport let go of them).
                    watcher.add_done_callback(functools.partial(self._gone, weakref.ref(entry)))
        if waiting:
            self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._sweep)

    def _gone(self, ref: weakref.ref[W], watcher: asyncio.Future[Any]) -> None:
        """A watcher ended: its client disconnected (a watcher that failed counts the same), unless it was answered."""
        if watcher.cancelled():
            return
        watcher.exception()  # read, so that a failed watcher is not reported as never retrieved
        entry = ref()
        if entry is not None:  # else it was answered, and nothing holds it any more
            self._client_left(entry)
