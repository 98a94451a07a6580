"""Priority queues with Triton's queue policies: size limits, timeouts, REJECT and DELAY."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from typing import Any, Awaitable, Callable, Deque, Iterator, List, Optional, Tuple

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceRequest
from pytriton.core.sinks import ResponseSink
from pytriton.core.spec import ModelSpec
from pytriton.model_config.common import QueuePolicy, TimeoutAction
from pytriton.proxy.types import Request

QUEUE_FULL_MESSAGE = "Exceeds maximum queue size"
_COMPACT_AFTER = 1024  # entries left in the middle of the deques that make `take` drop them (see `_compact`)
TIMEOUT_MESSAGE = "Request timeout expired"


class Entry:
    """A queued request with its sink and its place in time."""

    __slots__ = (
        "__weakref__",  # the client's watcher holds it weakly (watch.py)
        "call",
        "cancelled",
        "compute_ns",
        "cut_off",
        "deadline_ns",
        "delayed",
        "enqueue_ns",
        "gone",
        "level",
        "queue_ns",
        "queued",
        "request",
        "responded",
        "sink",
        "watcher",
    )

    def __init__(self, request: InferenceRequest, sink: ResponseSink, level: int, deadline_ns: int) -> None:
        """Create an entry queued now."""
        self.request = request
        self.sink = sink
        self.enqueue_ns = time.monotonic_ns()
        self.deadline_ns = deadline_ns
        self.level = level
        self.delayed = False
        self.queued = True
        self.queue_ns = 0
        self.compute_ns: Tuple[int, int, int] = (0, 0, 0)
        self.responded = False
        self.gone: Optional[Callable[[], Awaitable[Any]]] = None  # returns once the client has disconnected
        self.watcher: Optional[asyncio.Future[Any]] = None  # awaits `gone()` while the request waits or runs
        self.call: Optional[Request] = None  # what the callable got, once the request left the queue
        self.cancelled = False  # its client cancelled it while it ran
        self.cut_off = False  # its stream's client fell too far behind its batch: failed, counted then


class _Level:
    """One priority level: its policy, its queue and its queue of delayed (timed-out) entries."""

    __slots__ = ("delayed", "policy", "ready")

    def __init__(self, policy: QueuePolicy) -> None:
        """Create empty queues under a policy."""
        self.policy = policy
        self.ready: Deque[Entry] = deque()
        self.delayed: Deque[Entry] = deque()

    def size(self) -> int:
        """Entries waiting at this level."""
        return len(self.ready) + len(self.delayed)


class PriorityQueues:
    """All waiting requests of one model, in the order Triton serves them."""

    def __init__(self, spec: ModelSpec) -> None:
        """Create the levels a model's batcher config asks for."""
        batcher = spec.batcher
        level_count = batcher.priority_levels if batcher and batcher.priority_levels > 0 else 1
        self._default_level = 1
        if batcher and batcher.priority_levels > 0 and 1 <= batcher.default_priority_level <= level_count:
            self._default_level = batcher.default_priority_level
        self._levels = [_Level(spec.queue_policy(level)) for level in range(1, level_count + 1)]
        self._deadlines: List[Tuple[int, int, Entry]] = []
        self._tiebreak = itertools.count()
        self.size = 0
        self._left = 0  # entries taken out behind the front of their deque, still in it (see `take`)

    def level_of(self, priority: int) -> int:
        """The level (1 is highest) a request's `priority` parameter maps to."""
        if 1 <= priority <= len(self._levels):
            return priority
        return self._default_level

    def push(self, request: InferenceRequest, sink: ResponseSink) -> Entry:
        """Queue a request, or raise UNAVAILABLE when its level is full (Triton's message names the request)."""
        level_number = self.level_of(request.priority)
        level = self._levels[level_number - 1]
        policy = level.policy
        if policy.max_queue_size > 0 and level.size() >= policy.max_queue_size:
            raise InferenceError.unavailable(QUEUE_FULL_MESSAGE).for_request(request.id)
        timeout_us = policy.default_timeout_microseconds
        if policy.allow_timeout_override and 0 < request.timeout_us < timeout_us:
            timeout_us = request.timeout_us
        entry = Entry(request, sink, level_number, 0)
        if timeout_us > 0:
            entry.deadline_ns = entry.enqueue_ns + timeout_us * 1000
            heapq.heappush(self._deadlines, (entry.deadline_ns, next(self._tiebreak), entry))
        level.ready.append(entry)
        self.size += 1
        return entry

    def next_deadline_ns(self) -> Optional[int]:
        """When the earliest queued timeout expires."""
        while self._deadlines and not self._deadlines[0][2].queued:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def expire(self, now_ns: int) -> List[Entry]:
        """Apply the timeout action to entries whose timeout expired; return the rejected ones (dequeued)."""
        rejected: List[Entry] = []
        while self._deadlines and self._deadlines[0][0] <= now_ns:
            _, _, entry = heapq.heappop(self._deadlines)
            if not entry.queued or entry.delayed:
                continue
            level = self._levels[entry.level - 1]
            level.ready.remove(entry)
            if level.policy.timeout_action is TimeoutAction.DELAY:
                entry.delayed = True
                level.delayed.append(entry)
            else:
                entry.queued = False
                self.size -= 1
                rejected.append(entry)
        return rejected

    def __iter__(self) -> Iterator[Entry]:
        """Waiting entries in service order: by level, ready before delayed, FIFO inside each."""
        for level in self._levels:
            for queue in (level.ready, level.delayed):
                for entry in queue:
                    if entry.queued:
                        yield entry

    def take(self, entries: List[Entry]) -> None:
        """Remove entries that leave the queue (a batch, or requests whose client went away)."""
        for entry in entries:
            if entry.queued:
                entry.queued = False
                self.size -= 1
                self._left += 1
        for level in self._levels:
            for queue in (level.ready, level.delayed):
                while queue and not queue[0].queued:
                    queue.popleft()
                    self._left -= 1
        if self._left > _COMPACT_AFTER and self._left > self.size:
            self._compact()

    def _compact(self) -> None:
        """Drop the entries that left from the middle of their deques.

        A sequence model takes its slot holders' requests from behind the backlog's, which may wait for long at
        the front: without this every request that ran since would stay in the deque (memory, and time to
        iterate). Run when they outnumber those waiting, it costs O(1) a request, amortized.
        """
        for level in self._levels:
            level.ready = deque(entry for entry in level.ready if entry.queued)
            level.delayed = deque(entry for entry in level.delayed if entry.queued)
        self._left = 0

    def drain(self) -> List[Entry]:
        """Remove and return every waiting entry."""
        entries = list(self)
        self.take(entries)
        self._deadlines.clear()
        return entries
