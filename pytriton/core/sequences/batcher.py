"""Triton's sequence batcher for one model: sequence slots, idle sequences, and which requests batch together.

Every live sequence holds one slot of one instance from its START until its END request ran or it was idle
max_sequence_idle_microseconds (no new request for that long, as tritonserver 2.51 counts it: even while one of
its requests still runs, which then ends it with the slot freed after); a sequence that finds no free slot waits
(Triton's backlog) for one, at most its START request's `timeout` when it has one (then it ends, as in
tritonserver 2.51). A queued request whose client left (cancelled) ends its whole sequence, as in tritonserver
2.51: its other queued requests are cancelled and its next request needs START. A batch for an instance holds
at most one request of each of its sequences, each sequence's oldest, and a sequence's next request runs only
once its previous one has. Requests are checked when they arrive, with Triton's errors. Everything here runs on
the engine's event loop.

Forming a batch looks at the slot holders' next requests only, never at the backlog's: each sequence keeps its
own queued requests (`LiveSequence.queued`), and each instance a heap of its slot holders that may run, by
when each became ready. A sequence model's queue is one FIFO level (the sequence batcher has no priority levels
or queue policies: `ModelSpec.batcher` is None), and moments are places in one count (`SequenceSlots._places`).
Direct: the place of its next request in that queue (the order in which requests were queued). Oldest, as
tritonserver 2.51's, which hands a sequence's next request to its dynamic batcher only once the previous one
finished: the later of that place and when its previous request finished or it got its slot (`free_since`).
With A1 running, A2 then B1 queued, the next batch is [B1, A2].
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, Union

from pytriton.core.batcher import short_batch
from pytriton.core.errors import InferenceError
from pytriton.core.queues import Entry, PriorityQueues
from pytriton.core.request import InferenceRequest
from pytriton.core.sequences.controls import ControlTensors
from pytriton.core.spec import ModelSpec

LOGGER = logging.getLogger(__name__)

SequenceKey = Tuple[bool, Union[int, str]]  # (whether a string id, the id): 5 and "5" are two sequences
# Called with (instance index, sequence serial) when a sequence ended without its END request running there.
ForgetHandler = Callable[[int, int], None]
# tritonserver 2.51's answer (UNAVAILABLE) to the requests of a sequence that waited for a slot past its timeout.
BACKLOG_TIMEOUT_MESSAGE = "timeout of the corresponding sequence has been expired"


class LiveSequence:
    """One run of a sequence, from its START until its slot is released."""

    __slots__ = (
        "backlog_timer",
        "ended",
        "free_since",
        "heaped",
        "idle_timer",
        "instance",
        "key",
        "last_ns",
        "owner",
        "pending",
        "queued",
        "running",
        "serial",
        "slot",
    )

    def __init__(self, owner: SequenceSlots, key: SequenceKey, serial: int) -> None:
        """A sequence of `owner`'s that holds no slot yet."""
        self.owner = owner
        self.key = key
        self.serial = serial
        self.instance = -1  # the index of the instance whose slot it holds (-1: waiting for a slot)
        self.slot = -1
        self.pending = 0  # its requests queued or running
        self.running = False
        self.ended = False  # its END request arrived: no request may join it
        self.last_ns = 0  # when its last request arrived
        self.idle_timer: Optional[asyncio.TimerHandle] = None
        self.backlog_timer: Optional[asyncio.TimerHandle] = None  # its timeout while it waits for a slot
        # Its requests in the model's queue, oldest first, each with its place there; those that left the queue
        # since (`Entry.queued` false) are dropped from the front when looked at.
        self.queued: Deque[Tuple[int, Entry]] = deque()
        self.heaped = 0  # the key its item in its instance's heap of runnable sequences has (0: none)
        self.free_since = 0  # the place in the count when its previous request finished, or it got its slot


class SequenceSlots:
    """A model's sequence batcher: admits requests, assigns slots, forms each instance's batches."""

    def __init__(
        self,
        spec: ModelSpec,
        instance_count: int,
        forget: ForgetHandler,
        on_idle: Callable[[], None],
        on_expired: Callable[[LiveSequence], None],
        on_cancelled: Callable[[LiveSequence], None],
    ) -> None:
        """Slots for each instance: max_batch_size (at least 1), or oldest's max_candidate_sequences.

        `forget` is told of sequences that ended without their END request running; `on_idle` is called after
        an idle sequence freed its slot (a waiting sequence may run now); `on_expired` is given a sequence that
        waited for a slot past its timeout, whose queued requests must fail (BACKLOG_TIMEOUT_MESSAGE);
        `on_cancelled` is given a sequence cancelled by a queued request's client leaving, whose other queued
        requests must fail as cancelled.
        """
        config = spec.sequence_batcher
        assert config is not None
        self._spec = spec
        self._forget = forget
        self._on_idle = on_idle
        self._on_expired = on_expired
        self._on_cancelled = on_cancelled
        self.max_batch = max(1, spec.max_batch_size)
        per_instance = self.max_batch
        oldest = config.oldest
        if oldest is not None and oldest.max_candidate_sequences > 0:
            per_instance = oldest.max_candidate_sequences
        # Taken in turn from each instance, so that sequences spread over them.
        self._free: Deque[Tuple[int, int]] = deque(
            (instance, slot) for slot in range(per_instance) for instance in range(instance_count)
        )
        self._live: Dict[SequenceKey, LiveSequence] = {}
        # Sequences waiting for a slot by serial, oldest first.
        self._backlog: OrderedDict[int, LiveSequence] = OrderedDict()
        self._serials = itertools.count(1)
        self._ready_order = oldest is not None  # Oldest: sequences by when they became ready, not by arrival
        # Each queued request's place in the model's queue; also what `free_since` takes, so that both are moments
        # of one order.
        self._places = itertools.count(1)
        # Per instance, a heap of (when it became ready (`_ready_key`), serial, sequence) of the sequences holding
        # one of its slots that may run their next queued request; an item whose key is not its sequence's
        # `heaped` is stale.
        self._runnable: List[List[Tuple[int, int, LiveSequence]]] = [[] for _ in range(instance_count)]
        self.looked_at = 0  # sequences take_batch looked at (what a batch costs; tests count it)
        self._idle_s = config.max_sequence_idle_microseconds / 1e6
        strategy: Any = oldest if oldest is not None else config.direct
        self.delay_ns = strategy.max_queue_delay_microseconds * 1000 if strategy is not None else 0
        self._preferred = frozenset(oldest.preferred_batch_size or []) if oldest is not None else frozenset()
        # How many ready requests start a batch before the delay is up.
        self._ready_needed = self.max_batch
        if oldest is None:
            utilization = config.direct.minimum_slot_utilization if config.direct is not None else 0.0
            wanted = math.ceil(utilization * per_instance) if utilization else per_instance
            self._ready_needed = min(self.max_batch, max(1, wanted))
        self.controls = ControlTensors(spec.name, config, spec.batching)

    def admit(self, request: InferenceRequest) -> LiveSequence:
        """Check a request as Triton's sequence batcher does and join it to its sequence (started now by a START)."""
        name = self._spec.name
        if request.batch_size > 1:
            raise InferenceError.invalid(
                f"inference request to model '{name}' must specify batch-size 1 due to requirements of sequence batcher"
            )
        sequence_id, start, end = request.sequence or (0, False, False)
        if sequence_id == 0 or sequence_id == "":
            raise InferenceError.invalid(
                f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID"
            )
        key: SequenceKey = (isinstance(sequence_id, str), sequence_id)
        live = self._live.get(key)
        if live is None and not start:
            raise InferenceError.invalid(
                f"inference request for sequence {sequence_id} to model '{name}' must specify the START flag on the "
                "first request of the sequence"
            )
        self.controls.check_id(sequence_id)
        if live is None:
            live = LiveSequence(self, key, next(self._serials))
            self._live[key] = live
            self._assign(live, request.timeout_us)
        elif start:
            LOGGER.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this sequence "
                "start. Previous sequence will be terminated early.",
                sequence_id,
                name,
            )
        live.pending += 1
        live.last_ns = time.monotonic_ns()
        if live.idle_timer is None and not end:  # one timer per sequence, moved on when it fires (`_idle`)
            live.idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._idle, live)
        if end:
            live.ended = True
            del self._live[key]
            if live.idle_timer is not None:
                live.idle_timer.cancel()
                live.idle_timer = None
        request.live_sequence = live
        return live

    def _assign(self, live: LiveSequence, timeout_us: int) -> None:
        """Give a new sequence a free slot, or queue it for the next one freed, for at most `timeout_us` if set."""
        if self._free:
            live.instance, live.slot = self._free.popleft()
            return
        self._backlog[live.serial] = live
        if timeout_us > 0:
            live.backlog_timer = asyncio.get_running_loop().call_later(timeout_us / 1e6, self._expired, live)

    def _expired(self, live: LiveSequence) -> None:
        """A sequence waited for a slot past its timeout: it ends, and its queued requests fail."""
        live.backlog_timer = None
        if live.instance >= 0 or live.ended:
            return
        live.ended = True
        if self._live.get(live.key) is live:
            del self._live[live.key]
        self._on_expired(live)

    def queued(self, entry: Entry) -> None:
        """A request of a sequence joined the model's queue (after every request queued before it)."""
        live: LiveSequence = entry.request.live_sequence
        _next_queued(live)  # drop those that left the queue, so that the deque stays as long as what waits
        live.queued.append((next(self._places), entry))
        if len(live.queued) == 1:
            self._offer(live)

    def waiting(self, live: LiveSequence) -> List[Entry]:
        """A sequence's requests still in the model's queue, oldest first."""
        return [entry for _, entry in live.queued if entry.queued]

    def _offer(self, live: LiveSequence) -> None:
        """Put a sequence on its instance's heap if it may run its next queued request (it holds a slot, none runs)."""
        if live.heaped or live.running or live.instance < 0:
            return
        head = _next_queued(live)
        if head is not None:
            live.heaped = key = self._ready_key(live, head[0])
            heapq.heappush(self._runnable[live.instance], (key, live.serial, live))

    def _ready_key(self, live: LiveSequence, place: int) -> int:
        """When a sequence whose next queued request has `place` became ready to run it, in places of one count."""
        return max(place, live.free_since) if self._ready_order else place

    def take_batch(self, queues: PriorityQueues, instance: int, now_ns: int) -> Tuple[List[Entry], Optional[int]]:
        """The batch `instance` runs now (its sequences' oldest requests, one each), or none and when to look again.

        The sequences in the order in which they became ready (Direct: their next requests' places in the queue,
        as a scan of it would pick them), with a look at the slot holders of `instance` only: O(batch log slots),
        whatever the backlog.
        A request whose caller has gone is dropped from the queue on the way, and its sequence ends (`withdrawn`).
        """
        heap = self._runnable[instance]
        taken: List[Tuple[int, LiveSequence, Entry]] = []
        dead: List[Entry] = []
        preferred_cut = 0
        while heap and len(taken) < self.max_batch:
            place, _, live = heapq.heappop(heap)
            self.looked_at += 1
            if live.heaped != place:
                continue  # stale: the sequence is on the heap under another place, or not at all
            live.heaped = 0
            if live.running or live.instance != instance:
                continue  # it is offered again once it may run (`finished`)
            head = _next_queued(live)
            if head is None:
                continue  # its requests left the queue; its next one offers it again (`queued`)
            if self._ready_key(live, head[0]) != place:  # the request it was offered for left the queue
                self._offer(live)
                continue
            entry = head[1]
            if entry.sink.done():
                dead.append(entry)
                continue
            taken.append((place, live, entry))
            if len(taken) in self._preferred:
                preferred_cut = len(taken)
        if dead:
            queues.take(dead)
            for entry in dead:
                self.withdrawn(entry)
        if not taken:
            return [], None
        entries = [entry for _, _, entry in taken]
        if len(taken) < self._ready_needed and self.delay_ns:
            entries, due = short_batch(entries, preferred_cut, self.delay_ns, now_ns)
            for place, live, _ in taken[len(entries) :]:  # not in this batch: they stay the heap's
                live.heaped = place
                heapq.heappush(heap, (place, live.serial, live))
            if due is not None:
                return [], due
        queues.take(entries)
        for entry in entries:
            live = entry.request.live_sequence
            live.running = True
            live.queued.popleft()
        return entries, None

    def withdrawn(self, entry: Entry) -> None:
        """A queued request whose client left was taken out of the queue: its sequence ends, as in tritonserver 2.51.

        Its other queued requests fail as cancelled (`on_cancelled`); its slot, or its place in the backlog, is
        freed once none of its requests runs; its next request needs START.
        """
        live: Optional[LiveSequence] = entry.request.live_sequence
        if live is not None and live.owner is self:
            live.ended = True
            if self._live.get(live.key) is live:
                del self._live[live.key]
            self._on_cancelled(live)
        self.finished(entry)

    def finished(self, entry: Entry) -> None:
        """A request of a sequence ran, failed or left the queue: its sequence may take its next one, or end."""
        live: Optional[LiveSequence] = entry.request.live_sequence
        entry.request.live_sequence = None
        if live is None or live.owner is not self:  # a request of before a cut-off, whose slots are no more
            return
        if live.running:
            live.free_since = next(self._places)
        live.running = False
        live.pending -= 1
        if live.pending:
            self._offer(live)
            return
        if live.ended:
            # The END request's run dropped the state already; not when it failed before the call or left the queue.
            self._forget(live.instance, live.serial)
            self._release(live)
            return
        if live.idle_timer is None:  # its timer fired while it waited for a slot: it holds one now
            delay = max(0.0, live.last_ns / 1e9 + self._idle_s - time.monotonic_ns() / 1e9)
            live.idle_timer = asyncio.get_running_loop().call_later(delay, self._idle, live)

    def _idle(self, live: LiveSequence) -> None:
        """A sequence had no new request for max_sequence_idle_microseconds: it ends, as tritonserver 2.51's.

        Counted from its last request's arrival, whether or not a request of it still runs or waits (a request
        that runs longer than that, and the next one after it, is tritonserver's case too: that next one needs
        START). Its requests already queued run; its slot is freed, and its state dropped, after the last of them.
        One waiting for a slot is not idle (tritonserver looks again once it holds one): `finished` starts its
        timer again.
        """
        live.idle_timer = None
        if live.ended:
            return
        remaining_s = live.last_ns / 1e9 + self._idle_s - time.monotonic_ns() / 1e9
        if remaining_s > 0:  # a request came since the timer was set
            live.idle_timer = asyncio.get_running_loop().call_later(remaining_s, self._idle, live)
            return
        if live.instance < 0:
            return
        live.ended = True
        if self._live.get(live.key) is live:
            del self._live[live.key]
        if live.pending:
            return  # `finished` frees its slot after its last request
        instance = live.instance
        self._release(live)
        self._forget(instance, live.serial)
        self._on_idle()

    def _release(self, live: LiveSequence) -> None:
        """Free an ended sequence's slot: the oldest sequence waiting for one takes it."""
        if live.instance < 0:
            self._backlog.pop(live.serial, None)  # it ended before it had a slot (its requests left the queue)
            return
        place = (live.instance, live.slot)
        live.instance = live.slot = -1
        if self._backlog:
            _, waiting = self._backlog.popitem(last=False)
            waiting.instance, waiting.slot = place
            waiting.free_since = next(self._places)
            if waiting.backlog_timer is not None:
                waiting.backlog_timer.cancel()
                waiting.backlog_timer = None
            self._offer(waiting)
        else:
            self._free.append(place)

    def close(self) -> None:
        """Stop the idle timers (the model stops): every sequence ends."""
        for live in list(self._live.values()):
            for timer in (live.idle_timer, live.backlog_timer):
                if timer is not None:
                    timer.cancel()
            live.idle_timer = live.backlog_timer = None
            self._forget(live.instance, live.serial)
        self._live.clear()
        self._backlog.clear()
        for heap in self._runnable:
            heap.clear()


def _next_queued(live: LiveSequence) -> Optional[Tuple[int, Entry]]:
    """A sequence's oldest request still in the model's queue, with its place there (those that left are dropped)."""
    queued = live.queued
    while queued and not queued[0][1].queued:
        queued.popleft()
    return queued[0] if queued else None
