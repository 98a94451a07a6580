"""What large request bodies (HTTP) and messages (gRPC) hold while they arrive, bounded server-wide.

Each HTTP connection may hold one body of up to max_body_bytes (2 GiB - 1), each gRPC connection up to
grpc_max_buffered_bytes of messages still arriving: a dozen clients that really send 2 GiB each would make the
server hold 24 GiB, and the kernel would kill it with every other client's requests. Here a body or message
of at least SHARE_BYTES (declared: HTTP's Content-Length, the gRPC message's length prefix; a chunked body as
its bytes come) takes a share of ServerLimits.max_received_bytes before its bytes are read. When the budget
lacks room the connection stops reading it (HTTP: the socket read pauses; gRPC: the stream's window stays shut)
until the shares before it come back, granted in arrival order. One larger than the whole budget goes when
nothing else holds a share: nothing max_body_bytes allows is refused, and nothing waits for ever.

A share comes back when the last view of its bytes is gone (`watch`), when its request is answered, or when
its connection drops, whichever comes first, from whichever thread lets go of it: hence the lock. Smaller
requests take no share and pay nothing: the budget's work is for bodies of a megabyte or more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional

import numpy as np

from pytriton.core.logs.log_budget import LogBudget

LOGGER = logging.getLogger(__name__)

# Bodies and messages at least this large take a share; a chunked body takes them as its bytes pass it.
SHARE_BYTES = 2**20
# What a chunked HTTP body takes at a time, past SHARE_BYTES (as much as the connection holds for its app).
CHUNKED_STEP_BYTES = 4 * 2**20


class ReceiveBudget:
    """Bytes that large request bodies and messages may hold at once, all of a server's connections together."""

    def __init__(self, capacity: int) -> None:
        """A budget of `capacity` bytes."""
        self.capacity = capacity
        self.held = 0
        self._waiting: Deque[Share] = deque()  # shares waiting for room, in arrival order
        self._lock = threading.Lock()
        self._log = LogBudget(self._held_back)

    def claim(self, size: int, granted: Callable[[], None]) -> Share:
        """A share of `size` bytes, taken now when the budget has room, else `granted()` (on the loop) once it has."""
        share = Share(self, granted)
        share.more(size)
        return share

    @property
    def waiting(self) -> int:
        """Shares waiting for room now."""
        return len(self._waiting)

    def _ask(self, share: Share, size: int) -> bool:
        """Take `size` more bytes for `share` when nothing waits before it and they fit; else queue it."""
        with self._lock:
            if not self._waiting and self._fits(share, size):
                self.held += size
                share.size += size
                return True
            share.pending = size
            share.loop = asyncio.get_running_loop()  # before another thread may grant it
            self._waiting.append(share)
            held = self.held
        self._waits(size, held)
        return False

    def _give_back(self, share: Share) -> None:
        """`share` is over: its bytes come back, or it leaves the queue; grant the shares that now fit."""
        with self._lock:
            self.held -= share.size
            share.size = 0
            if share.pending:
                share.pending = 0
                self._waiting.remove(share)
            granted = self._grant()
        for each in granted:
            each.notify()

    def force(self, share: Share) -> None:
        """`share`'s bytes have all arrived while it waited (a gRPC message whole in its first DATA): count them."""
        with self._lock:
            if not share.pending:
                return
            self._waiting.remove(share)
            self.held += share.pending
            share.size += share.pending
            share.pending = 0
            granted = self._grant()
        for each in granted:
            each.notify()

    def _fits(self, share: Share, size: int) -> bool:
        """Whether `share` may take `size` more bytes: they fit, or nothing but itself holds any (under the lock).

        A body larger than the whole budget goes alone, and a chunked one may grow past it alone: never a refusal,
        never a body waiting for itself.
        """
        return self.held == share.size or self.held + size <= self.capacity

    def _grant(self) -> List[Share]:
        """Take room for the waiting shares that fit now, oldest first (under the lock); those granted."""
        granted: List[Share] = []
        waiting = self._waiting
        while waiting:
            share = waiting[0]
            if not self._fits(share, share.pending):
                break
            waiting.popleft()
            self.held += share.pending
            share.size += share.pending
            share.pending = 0
            granted.append(share)
        return granted

    def _waits(self, size: int, held: int) -> None:
        """A body or message waits for room (on the event loop): tell the operator, within the log's budget."""
        line = (
            f"a request of {size} bytes waits to be received: large requests arriving hold {held} of the "
            f"{self.capacity} bytes ServerLimits.max_received_bytes allows"
        )
        if self._log.admit(line):
            LOGGER.info("%s", line)

    def _held_back(self, count: int, last: str) -> None:
        LOGGER.info("... and more large requests waited for the same reason (%d); the last: %s", count, last)


class Share:
    """What one body or message holds of a budget (`size`) and still waits for (`pending`); given back once."""

    __slots__ = ("_budget", "_granted", "loop", "pending", "size")

    def __init__(self, budget: ReceiveBudget, granted: Callable[[], None]) -> None:
        self._budget: Optional[ReceiveBudget] = budget
        self._granted = granted
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # where `granted` runs: set once it waits
        self.size = 0
        self.pending = 0

    @property
    def waiting(self) -> bool:
        """Whether the share waits for room: its connection must not read its bytes yet."""
        return bool(self.pending)

    def more(self, size: int) -> bool:
        """Ask for `size` more bytes (a chunked body growing); whether they were taken at once."""
        budget = self._budget
        if budget is None:
            return True
        return budget._ask(self, size)

    def force(self) -> None:
        """The bytes waited for have arrived anyway: count them now."""
        if self._budget is not None:
            self._budget.force(self)

    def give_back(self) -> None:
        """The bytes are gone, answered or dropped: return them, or stop waiting (again: nothing)."""
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back(self)

    def freed(self, ref: weakref.ref[Any]) -> None:
        """The last view of the bytes is gone (`watch`; from whichever thread let go of it)."""
        _WATCHED.pop(id(ref), None)
        self.give_back()

    def notify(self) -> None:
        """The share was granted (from any thread): its connection reads on, on its own loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._budget is not None and not self.pending:
            self._granted()


def watch(view: memoryview, share: Share) -> memoryview:
    """`view` as a writable memoryview that gives `share` back once it and every view made of it are gone.

    Its exporter is an array watched for its end (a memoryview cannot be); the array lies where `view` does. A
    weak reference with a callback, kept in `_WATCHED` until it fires, costs a third of a `weakref.finalize`.
    """
    watched = np.frombuffer(view, np.uint8)
    # The callback holds the share, and `_WATCHED` the callback: the share must not hold what holds the array (its
    # `granted` reaches the connection or the call, and a gRPC call keeps its request's memory). Whole, the bytes
    # have their share: nothing will be granted any more.
    share._granted = _nothing
    ref = weakref.ref(watched, share.freed)
    _WATCHED[id(ref)] = ref
    return memoryview(watched)  # type: ignore[arg-type]  # ndarray exports its buffer; numpy stubs say not


# The weak references `watch` made whose arrays live yet (a weak reference that is itself collected never fires).
# By id: a weak reference hashes as its array, which does not hash.
_WATCHED: Dict[int, weakref.ref[Any]] = {}


def _nothing() -> None:
    """A share's `granted` once nothing can be granted to it any more."""
