"""The per-model scheduler: Triton's dynamic batcher over priority queues, feeding free instances."""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections import deque
from typing import Any, Awaitable, Callable, Coroutine, Deque, List, Optional, Set, Tuple

from pytriton.core.batcher import BatchRules
from pytriton.core.composition.direct import DirectAnswer
from pytriton.core.composition.path import CURRENT, CallPath, ModelCallError, Models, PathMaker, PathSource
from pytriton.core.errors import (
    BatchNotRun,
    CallableRaised,
    FailureReason,
    InferenceError,
    OutputsNotTaken,
    Status,
    callable_error,
)
from pytriton.core.instances import CallableKind, Instance, ModelInstance
from pytriton.core.logs.failure_log import FailureLog
from pytriton.core.outputs import build_response, check_results
from pytriton.core.queues import TIMEOUT_MESSAGE, Entry, PriorityQueues
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.request_spans import SpanSource, TracedSink, traced_request
from pytriton.core.scheduling import direct_runs
from pytriton.core.scheduling.async_call import CancelShieldedCall
from pytriton.core.scheduling.direct_runs import Outputs
from pytriton.core.scheduling.in_flight import InFlight
from pytriton.core.scheduling.ordering import ReleaseOrder, Slot
from pytriton.core.scheduling.running import RunningBatch, RunningBatches
from pytriton.core.sequences.batcher import BACKLOG_TIMEOUT_MESSAGE, LiveSequence, SequenceSlots
from pytriton.core.sinks import ResponseSink
from pytriton.core.spec import ModelSpec
from pytriton.core.stats import ComputeTimes, ModelStats
from pytriton.core.waiters import wake
from pytriton.core.watch import Disconnect, QueueWatch
from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.proxy.types import Request

LOGGER = logging.getLogger(__name__)
UnrecoverableHandler = Callable[[str], None]
FELL_BEHIND_MESSAGE = (
    "the stream's client fell too far behind the other requests of its batch, which go on: its request was ended"
)
_CLIENT_GONE = "the client disconnected before its response was ready"
# uvloop's timers count whole milliseconds (a delay is rounded to the nearest one): a timer may fire up to
# half a millisecond early. Rounding up instead would make every batch wait up to a millisecond too long.
_TIMER_SLACK_NS = 500_000


class BatchNotStarted(BatchNotRun):
    """An instance could not start a batch's call (its thread could not start): the batch fails alone."""


class Scheduler:
    """Queues a model's requests, forms batches by Triton's rules and runs them on free instances.

    Everything here runs on the engine's event loop; only user callables leave it, and `run_here`, which a
    sync callable's thread calls (and which `start_here` runs in an instance's thread).
    """

    def __init__(
        self,
        spec: ModelSpec,
        instances: List[ModelInstance],
        stats: ModelStats,
        on_unrecoverable: UnrecoverableHandler,
    ) -> None:
        """Create a scheduler for a model and its instances."""
        self.spec = spec
        self.stats = stats
        self._instances = instances
        # Taken from the right: the instance freed last is warm (caches, a CUDA stream or context), and one
        # request at a time stays on it. Taking turns cost a lone ResNet-50 request ~2.6 ms on an H200.
        self._free: Deque[ModelInstance] = deque(reversed(instances))
        self._queues = PriorityQueues(spec)
        self._on_unrecoverable = on_unrecoverable
        self._rules = BatchRules(spec)
        batcher = spec.batcher
        oldest = spec.sequence_batcher.oldest if spec.sequence_batcher is not None else None
        preserve = bool(batcher and batcher.preserve_ordering) or bool(oldest and oldest.preserve_ordering)
        self._order = ReleaseOrder() if preserve and len(instances) > 1 else None
        self._sequences = (
            SequenceSlots(
                spec,
                len(instances),
                self._forget,
                self._sequence_idle,
                self._sequence_expired,
                self._sequence_cancelled,
            )
            if spec.sequence_batcher
            else None
        )
        self._instance_index = {id(instance): index for index, instance in enumerate(instances)}
        self._sequence_warned = False
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at_ns = 0
        self._batches = RunningBatches()
        self._watch = QueueWatch(self._queues, self._batches.entries, self._client_left)
        self._running: Set[asyncio.Task[Any]] = set()
        self._awaiting: Set[DirectAnswer] = set()  # sync callers waiting for calls awaited here (`await_here`)
        self._in_flight = InFlight()
        self._accepting = True
        self._held = False  # hold(): requests queue, and the batch starts at release()
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the engine's, once a request came (see `loop`)
        self._drained: Optional[asyncio.Future[None]] = None  # until_idle() waits on it until nothing is left
        self.spans: Optional[SpanSource] = None  # set while the model is traced (runtime/tracing.py)
        self.models: Optional[Models] = None  # where the callable's inner calls go (set by the engine)
        self._paths: Optional[PathMaker] = None  # what makes a batch's call path (on the loop, once models is set)
        self.failures = FailureLog(f"'{spec.name}' version {spec.version}")
        # Whether an inner call may skip the queue when the model is idle: a lone request would run at once (no
        # batching delay, no sequence, no ordering to keep). On a sync callable it runs on the caller's thread
        # (`run_here`); on an async one, on the loop in a task of its own for a sync caller (`await_here`).
        runs_at_once = (
            not spec.decoupled and self._sequences is None and self._order is None and not self._rules.delay_ns
        )
        kinds = {instance.kind if isinstance(instance, Instance) else None for instance in instances}
        self._runs_here = runs_at_once and kinds <= {CallableKind.SYNC}
        self._awaits_here = runs_at_once and kinds <= {CallableKind.ASYNC}

    @property
    def instances(self) -> List[ModelInstance]:
        """The model's instances."""
        return self._instances

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The engine's loop, which every request comes in on.

        Asked once: on Python 3.11 and older `asyncio.get_running_loop()` makes a getpid system call each time.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @property
    def pending(self) -> int:
        """Requests waiting in the queue."""
        return self._queues.size

    def submit(self, request: InferenceRequest, sink: ResponseSink) -> None:
        """Queue a request; raises UNAVAILABLE if the model is stopping or its queue is full."""
        run_now = self.submit_inline(request, sink)
        if run_now is not None:
            self._track(self.loop.create_task(run_now))

    def submit_inline(
        self, request: InferenceRequest, sink: ResponseSink, gone: Optional[Disconnect] = None
    ) -> Optional[Coroutine[Any, Any, None]]:
        """Queue a request, or return the coroutine that runs it at once for the caller to await.

        A request that finds a free instance, an empty queue and no batching delay runs alone and
        at once (as Triton's batcher would run it); awaiting it in the caller's task saves a task.
        A queued request whose client leaves (`gone()` returns) gives up its place; a running one is cancelled
        (see QueueWatch).
        """
        if not self._accepting:
            self.stats.record_failure(0, FailureReason.REJECTED.value)
            raise InferenceError.unavailable(f"model '{self.spec.name}' is not accepting requests")
        if not request.inputs and self.spec.batching:
            raise self._refuse_without_inputs(request)
        if request.sequence is not None or self._sequences is not None:
            if self._sequences is not None:
                # A refusal is no failure of the model: tritonserver 2.51 counts none (statistics, metrics).
                self._sequences.admit(request)
            elif not self._sequence_warned:
                self._warn_sequence_ignored()
        if self._free and not self._queues.size and not self._rules.delay_ns and not self._held:
            try:
                instance = self._pop_free() if self._sequences is None else self._free_instance_of(request)
            except IndexError:  # a caller's thread took the last one since (run_here)
                instance = None
            if instance is not None:
                entry = Entry(request, sink, self._queues.level_of(request.priority), 0)
                entry.queued = False  # it never waits in the queue: its client leaving cancels it where it runs
                if gone is not None:
                    self._watch.watch(entry, gone)
                return self._launch(instance, [entry])
        # A full queue refuses the request before it is one of the model's: tritonserver 2.51 counts no failure
        # (statistics, nv_inference_request_failure; REJECTED is for a request that timed out in the queue).
        entry = self._queues.push(request, sink)
        if self._sequences is not None:
            self._sequences.queued(entry)
        if gone is not None:
            self._watch.watch(entry, gone)
        if (self._free or entry.deadline_ns) and not self._held:  # else _release (or release) schedules
            self._schedule()
        return None

    def hold(self) -> None:
        """Queue the requests submitted from now on, and start none, until `release()`.

        For a caller that submits several requests at once (a frontend process's message): they then start as
        one batch, where the first would start alone on an idle instance and the rest wait for it.
        """
        self._held = True

    def release(self) -> None:
        """Start what the requests submitted since `hold()` make due."""
        self._held = False
        if self._queues.size:
            self._schedule()

    def _pop_free(self) -> ModelInstance:
        """The free instance freed last that can take work; IndexError when none is free.

        One whose process died while it was free leaves the free list until its new process serves: a batch
        started on it failed at once ("is not running") while another instance could serve it, or it could wait.
        (A sequence's requests still go to their slot's instance: its state died with the process.)
        """
        while True:
            instance = self._free.pop()
            if instance.alive:
                return instance
            instance.when_idle(self._release, instance)

    def _free_instance_of(self, request: InferenceRequest) -> Optional[ModelInstance]:
        """The instance holding the slot of the request's sequence, taken off the free list, if it can run it now."""
        assert self._sequences is not None
        live: LiveSequence = request.live_sequence
        if self._sequences.delay_ns or live.running or live.instance < 0:
            return None
        instance = self._instances[live.instance]
        if instance not in self._free:
            return None
        self._free.remove(instance)
        live.running = True
        return instance

    def _warn_sequence_ignored(self) -> None:
        """Triton takes and ignores a sequence's parameters for a model without a sequence batcher; say so once."""
        self._sequence_warned = True
        LOGGER.warning(
            "requests to model '%s' carry sequence parameters (sequence_id, sequence_start, sequence_end): they are "
            "ignored, as Triton ignores them for a model without a sequence batcher (ModelConfig.sequence_batcher)",
            self.spec.name,
        )

    def _forget(self, instance_index: int, serial: int) -> None:
        """A sequence ended without its END request running: its instance forgets its state."""
        if instance_index >= 0:
            self._instances[instance_index].forget_sequences([serial])

    def _sequence_idle(self) -> None:
        """An idle sequence freed its slot: a sequence that waited for one may run."""
        if self._free and self._queues.size:
            self._schedule()

    def _sequence_expired(self, live: LiveSequence) -> None:
        """A sequence waited for a slot past its timeout: its queued requests fail, as tritonserver 2.51's do."""
        assert self._sequences is not None
        waiting = self._sequences.waiting(live)
        self._queues.take(waiting)
        for entry in waiting:
            entry.request.inputs = {}
            self._fail(entry, InferenceError.unavailable(BACKLOG_TIMEOUT_MESSAGE))
            self._sequences.finished(entry)
        self._update_idle()

    def _sequence_cancelled(self, live: LiveSequence) -> None:
        """A queued request of a sequence was cancelled: its other queued requests fail as tritonserver 2.51's do.

        Triton answers them CANCELLED with no words (HTTP 400 `{"error":""}`), counted as CANCELED failures.
        """
        assert self._sequences is not None
        waiting = self._sequences.waiting(live)
        self._queues.take(waiting)
        for entry in waiting:
            entry.request.inputs = {}
            self._fail(entry, InferenceError.cancelled(""))
            self._sequences.finished(entry)

    def withdraw(self, sink: ResponseSink) -> None:
        """A request's client went away: a queued one frees its slot and inputs now, a running one is cancelled.

        A running request's callable sees `is_cancelled()` (a generator stops at its next step:
        core/scheduling/running.py).

        Looked up rather than remembered, so that a request costs nothing extra unless its client leaves. A
        request whose batch runs already stays in it; once no request of the batch has a client left, the
        inner calls its callable has in flight are cancelled (core/composition/path.py).
        """
        for entry in self._queues:
            if entry.sink is sink:
                self._leave_queue(entry)
                return
        self._batches.cancel(sink)
        for running in list(self._batches):
            path = running.path
            if path is not None and all(entry.sink.done() for entry in running.entries):
                path.close(f"every request of the batch of model '{self.spec.name}' that made the call was cancelled")

    def _leave_queue(self, entry: Entry) -> None:
        """Take out a queued request whose client went away (CANCELED), freeing its place and inputs."""
        self._queues.take([entry])
        entry.request.inputs = {}
        self.stats.record_failure(time.monotonic_ns() - entry.enqueue_ns, FailureReason.CANCELED.value)
        if self._sequences is not None:
            self._sequences.withdrawn(entry)
            if self._free and self._queues.size:
                self._schedule()  # its sequence may have freed a slot
        self._update_idle()

    def _client_left(self, entry: Entry) -> None:
        """A request's client disconnected: a queued one leaves the queue (CANCELLED), a running one is cancelled."""
        if not entry.queued:
            self._batches.cancel_entry(entry)
            return
        self._leave_queue(entry)
        entry.sink.fail(InferenceError.cancelled(_CLIENT_GONE))

    def _schedule(self, slack_ns: int = 0) -> None:
        """Start every batch that is due (within `slack_ns`) on a free instance; arm a timer for the next decision."""
        now = time.monotonic_ns()
        for entry in self._queues.expire(now):
            self._fail(entry, InferenceError.unavailable(TIMEOUT_MESSAGE))
        wake_at: Optional[int] = None
        if self._sequences is not None:
            wake_at = self._schedule_sequences(now + slack_ns)
        while self._free and self._queues.size and self._sequences is None:
            try:
                instance = self._pop_free()  # first: a caller's thread may take the last one (run_here)
            except IndexError:
                break
            batch, wake_at = self._rules.take_batch(self._queues, now + slack_ns)
            if not batch:
                self._free.append(instance)
                break
            self._start(instance, batch)
        deadline = self._queues.next_deadline_ns()
        if deadline is not None and (wake_at is None or deadline < wake_at):
            wake_at = deadline
        self._arm_timer(wake_at, now)
        self._update_idle()

    def _schedule_sequences(self, now_ns: int) -> Optional[int]:
        """Start each free instance's due batch of its sequences' requests; return when the next one is due."""
        assert self._sequences is not None
        wake_at: Optional[int] = None
        for instance in list(reversed(self._free)):
            if not self._queues.size:
                break
            batch, due = self._sequences.take_batch(self._queues, self._instance_index[id(instance)], now_ns)
            if batch:
                self._free.remove(instance)
                self._start(instance, batch)
            elif due is not None and (wake_at is None or due < wake_at):
                wake_at = due
        return wake_at

    def _arm_timer(self, wake_at_ns: Optional[int], now_ns: int) -> None:
        """Make sure `_schedule` runs again at `wake_at_ns`."""
        if wake_at_ns is None:
            return
        if self._timer is not None and not self._timer.cancelled() and self._timer_at_ns <= wake_at_ns:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at_ns = wake_at_ns
        self._timer = self.loop.call_later(max(wake_at_ns - now_ns, 0) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        """Timer callback: what is due within the timer's resolution is due."""
        self._timer = None
        self._schedule(_TIMER_SLACK_NS)

    def _start(self, instance: ModelInstance, batch: List[Entry]) -> None:
        """Start a batch on an instance now; a task of its own waits for it and delivers the responses."""
        self._track(self.loop.create_task(self._launch(instance, batch, hand_over=True)))

    def _track(self, task: asyncio.Task[None]) -> None:
        """Keep a reference to a batch task until it ends."""
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _launch(
        self, instance: ModelInstance, batch: List[Entry], hand_over: bool = False
    ) -> Coroutine[Any, Any, None]:
        """Start a batch on an instance now; the returned coroutine waits for it and delivers the responses.

        A batch from the queue is handed over to the instance thread (the loop has more work waiting); a
        request that found the instance idle is not (the loop has none).
        """
        start_ns = time.monotonic_ns()
        instance.call_started_ns = start_ns
        spec = self.spec
        spans = self.spans
        sequences = self._sequences
        requests = []
        traced_span: Any = None  # a traced request's compute span: the batch's inner calls nest under it
        traced_any = False  # a request of the batch is traced: its compute times are noted on its entry
        for entry in batch:
            entry.queue_ns = start_ns - entry.enqueue_ns
            request = entry.request
            requested = request.requested_outputs
            # A request that names no outputs gets them all, and the callable is told so (as in PyTriton 0.7).
            names = list(spec.output_names) if requested is None else requested
            if sequences is None or request.live_sequence is None:
                data = request.inputs
                if tuple(data) != spec.input_names:  # in the model's order, as NVIDIA's PyTriton hands them
                    data = spec.in_declared_order(data)
                call_request = Request(data=data, parameters=request.parameters, requested_output_names=names)
            else:
                call_request = self._sequence_request(request, names, request.live_sequence.serial)
            if spans is not None:
                origin = request.origin
                traced = spans.start(entry.enqueue_ns, origin[2] if origin is not None else None, entry)
                if traced is not None:
                    # a span, or (a trace file's record, which has none) the record: inner calls' nest under it
                    traced_span = traced.span if traced.span is not None else traced
                    traced_any = True
                    call_request = traced_request(call_request, traced)
                    entry.sink = TracedSink(entry.sink, traced)
            entry.call = call_request
            requests.append(call_request)
        if sequences is not None and instance.sequence_states is not None:
            instance.sequence_states.attach(requests)  # a thread instance's; a process instance's is in its process
        slots = self._order.reserve(len(batch)) if self._order is not None else None
        paths = self._paths
        if paths is None and self.models is not None:
            paths = self._paths = PathMaker(self.models, spec.name)
        running = RunningBatch(batch, instance, spec.decoupled, paths)
        if traced_span is not None:
            running.span = traced_span
        self._batches.add(running)
        infer_start_ns = time.monotonic_ns()
        if spec.decoupled:
            call = None
        else:
            call = self._call(instance, requests, hand_over, running if paths is not None else None)
            if not hand_over and type(call) is types.CoroutineType:
                call = CancelShieldedCall(call)  # run at once in a task its client may cancel: not the callable
        return self._run(running, requests, slots, call, (start_ns, infer_start_ns), traced_any)

    def _sequence_request(self, request: InferenceRequest, names: List[str], serial: int) -> Request:
        """The Request of a sequence's request: its sequence's id and flags, and the control inputs configured."""
        assert self._sequences is not None and request.sequence is not None
        sequence_id, start, end = request.sequence
        self._sequences.controls.add(request.inputs, sequence_id, start, end)
        return Request(
            data=request.inputs,
            parameters=request.parameters,
            requested_output_names=names,
            sequence_id=sequence_id,
            sequence_start=start,
            sequence_end=end,
            sequence_serial=serial,
        )

    def _call(
        self, instance: ModelInstance, requests: List[Request], hand_over: bool, source: Optional[PathSource]
    ) -> Awaitable[Any]:
        """Start a batch's call; one that cannot start (its thread cannot: "can't start new thread") fails alone.

        It fails the batch through `_run`, which gives the instance back: a thread instance starts its thread
        again with its next batch. Raised here, it left the instance off the free list for good (and a queued
        batch unanswered), so that the model never answered again.
        """
        try:
            return instance.start(requests, hand_over, source)
        except Exception as error:  # noqa: BLE001 - the batch fails alone; the instance must not stay busy with it
            refused = BatchNotStarted(
                f"model '{self.spec.name}' instance {instance.label} could not start the batch: "
                f"{type(error).__name__}: {error}"
            )
            refused.__cause__ = error
            failed: asyncio.Future[Any] = self.loop.create_future()
            failed.set_exception(refused)
            return failed

    async def _run(
        self,
        running: RunningBatch,
        requests: List[Request],
        slots: Optional[List[Slot]],
        call: Optional[Awaitable[Any]],
        started_ns: Tuple[int, int],
        traced: bool = False,
    ) -> None:
        """Wait for a batch's call (`call`, started already; None: a decoupled model's, started here) and respond.

        `traced`: a request of the batch is traced; each entry is told its compute times (a trace file's record).

        The instance is freed as soon as its call returns, before its outputs are checked and the responses
        go out: the next batch then starts first and the model works while the loop finishes this one.
        """
        spec = self.spec
        instance, batch = running.instance, running.entries
        start_ns, infer_start_ns = started_ns  # when the batch left the queue, when its call started
        infer_end_ns = output_end_ns = 0
        released = False
        task = self._in_flight.enter(len(batch))
        try:
            if self._in_flight.cut:  # a batch that left the queue just before the cut-off: answer it now
                raise self._stopped()
            if call is None:
                responding_ns = await self._run_streaming(running, requests)
                output_end_ns = time.monotonic_ns()
                infer_end_ns = max(infer_start_ns, output_end_ns - responding_ns)
                compute = (infer_start_ns - start_ns, infer_end_ns - infer_start_ns, output_end_ns - infer_end_ns)
                assert running.stop is not None
                cut = running.stop.cut
                for index, entry in enumerate(batch):
                    entry.compute_ns = compute
                    self._hand_over(slots, index, self._end_stream, entry, cut)
            else:
                results = await call
                infer_end_ns = time.monotonic_ns()
                if self._sequences is not None:
                    self._sequences_ran(batch)
                instance.when_idle(self._release, instance)
                released = True
                outcomes: List[Any] = []
                refused: List[InferenceError] = []
                notices = self.failures
                for entry, result in zip(batch, check_results(spec, results, len(batch))):
                    try:
                        outcomes.append(build_response(spec, result, entry.request.requested_outputs, True, notices))
                    except InferenceError as error:  # wrong or oversized outputs fail only this request
                        # Its traceback would hold this frame, which holds it (`outcomes`): a cycle that kept the
                        # batch's outputs and requests until the collector's next full pass.
                        error.with_traceback(None)
                        outcomes.append(error)
                        refused.append(error)
                if refused:
                    self.failures.outputs_refused(refused[0], len(refused))
                output_end_ns = time.monotonic_ns()
                compute = (infer_start_ns - start_ns, infer_end_ns - infer_start_ns, output_end_ns - infer_end_ns)
                if traced:
                    for entry in batch:
                        entry.compute_ns = compute
                if slots is None:
                    self._deliver(batch, outcomes, compute)
                else:
                    for index, (entry, outcome) in enumerate(zip(batch, outcomes)):
                        if isinstance(outcome, InferenceError):
                            self._hand_over(slots, index, self._fail, entry, outcome)
                        else:
                            entry.compute_ns = compute
                            self._hand_over(slots, index, self._respond, entry, outcome)
        except BaseException as error:
            infer_end_ns = output_end_ns = time.monotonic_ns()
            if isinstance(error, asyncio.CancelledError) and self._accepting and not self._in_flight.cut:
                for entry in batch:  # the handler that ran it at once was cancelled: its client cancelled
                    running.cancel(entry)
            failure = self._as_inference_error(error, len(batch))
            for index, entry in enumerate(batch):
                self._hand_over(slots, index, self._fail, entry, failure)
            # Often the error itself (a decoupled model's oversized outputs), whose traceback holds this frame: kept
            # here, that cycle held the batch's requests and outputs until the collector's next full pass.
            del failure
            output_end_ns = time.monotonic_ns()  # answering the failure is its compute output, as in Triton's stats
            # A cancel of this task goes on up. What else is no Exception came from the callable (KeyboardInterrupt,
            # SystemExit raised in it): its batch failed with it, and raised on here it stopped the server's loop.
            if isinstance(error, asyncio.CancelledError) and not self._in_flight.answered(error, task):
                raise
        finally:
            self._batches.discard(running)
            running.ended = True  # before its path is read (RunningBatch.call_path)
            if running.path is not None:
                running.end(spec.name)
            self._in_flight.leave(task)
            self.stats.record_execution(
                sum(entry.request.batch_size for entry in batch) if spec.batching else 1,
                infer_start_ns - start_ns,
                infer_end_ns - infer_start_ns,
                output_end_ns - infer_end_ns,
            )
            for entry in batch:
                entry.request.inputs = {}
                entry.call = None  # its inputs: a request buffer is reused once nothing refers to it
            if not released:
                # A call the loop stopped waiting for (client gone, shutdown) may still run in the instance
                # thread, or an async one in a task of its own: the instance takes new work once it has returned.
                self._sequences_ran(batch)
                rest = call.rest if isinstance(call, CancelShieldedCall) else None
                if rest is None or rest.done():
                    instance.when_idle(self._release, instance)
                else:
                    if self._in_flight.cut:
                        rest.cancel()  # the server stops: the callable is cancelled, as a task of its own would be
                    self._running.add(rest)
                    rest.add_done_callback(self._running.discard)
                    rest.add_done_callback(lambda _: self._release(instance))
            # A call that raised holds its error, whose traceback holds this frame: without the call here, that is
            # no reference cycle, so the batch's requests (and the frames of their handlers, their bodies) go with
            # their answers, not at the cycle collector's next full pass (12 failed requests of 16 MiB held 192 MB).
            call = None

    def _sequences_ran(self, batch: List[Entry]) -> None:
        """A batch's sequences may take their next request (before its instance is free to run them)."""
        if self._sequences is not None:
            for entry in batch:
                self._sequences.finished(entry)

    def _release(self, instance: ModelInstance) -> None:
        """An instance finished its call: give it the next batch."""
        instance.call_started_ns = 0
        self._free.append(instance)
        if self._queues.size:
            self._schedule()
        else:
            self._update_idle()

    def _deliver(self, batch: List[Entry], outcomes: List[Any], compute: ComputeTimes) -> None:
        """Hand each request of a batch its response or its error, and count them."""
        now = time.monotonic_ns()
        totals: List[int] = []
        queues: List[int] = []
        inferences = 0
        for entry, outcome in zip(batch, outcomes):
            if isinstance(outcome, InferenceError) or entry.cancelled:
                self._fail(entry, outcome)
                continue
            totals.append(now - entry.enqueue_ns)
            queues.append(entry.queue_ns)
            inferences += entry.request.batch_size
            if entry.request.compute_sink is not None:
                _add_compute(entry.request.compute_sink, compute)
            entry.sink.deliver(outcome)
            entry.sink.finish()
        if totals:
            self.stats.record_successes(totals, queues, compute, inferences)

    async def _run_streaming(self, running: RunningBatch, requests: List[Request]) -> int:
        """Run a decoupled model: each step the callable yields is one response per request.

        Returns the time spent checking and sending the steps' outputs: the batch's compute output, the rest of
        its run being its compute infer (Triton's statistics split a decoupled model's run so too; without
        the split, perf_analyzer showed a decoupled model's server time as all overhead).
        """
        batch = running.entries
        stop = running.stop
        assert stop is not None
        steps = running.instance.steps(requests, stop)
        token = CURRENT.set(
            running if running.paths is not None else None
        )  # this task runs an async generator's steps; a thread's takes it when it starts
        responding_ns = 0
        try:
            async for step in steps:
                step_ns = time.monotonic_ns()
                results = check_results(self.spec, step, len(batch))
                for entry, result in zip(batch, results):
                    if result is None:
                        continue
                    if not entry.sink.done():
                        response = build_response(
                            self.spec, result, entry.request.requested_outputs, False, self.failures
                        )
                        entry.sink.deliver(response)
                        if not entry.responded:
                            entry.responded = True
                            self.stats.record_first_response(time.monotonic_ns() - entry.enqueue_ns)
                    elif entry.cancelled and not entry.cut_off:  # a response its client's cancel lost
                        entry.cut_off = True
                        self._fail(entry, self._cancelled())
                responding_ns += time.monotonic_ns() - step_ns
                if all(entry.sink.done() for entry in batch):
                    stop.set()
                for entry in batch:
                    if not entry.sink.has_room():
                        await self._keep_pace(batch)
                        break
        finally:
            stop.set()  # a generator still running in the instance thread stops at its next step
            await steps.aclose()  # type: ignore[attr-defined]
            CURRENT.reset(token)
        return responding_ns

    async def _keep_pace(self, batch: List[Entry]) -> None:
        """Hold a decoupled batch's generator while each of its live consumers is far behind (its thread waits too).

        A consumer behind while another keeps up holds no one: its responses pile up to its backlog's hard bound
        (core/backlog.py), and past it that request alone is cut off. Holding the batch for it had stalled every
        other stream of the batch until send_timeout_s cut the client that read nothing off.
        """
        live = [entry for entry in batch if not entry.sink.done()]
        behind = [entry for entry in live if not entry.sink.has_room()]
        if len(behind) < len(live):
            for entry in behind:
                if entry.sink.overrun():
                    LOGGER.info("model '%s': %s", self.spec.name, FELL_BEHIND_MESSAGE)
                    entry.cut_off = True
                    self._fail(entry, InferenceError(Status.UNAVAILABLE, FELL_BEHIND_MESSAGE))
            return
        if len(behind) == 1:
            await behind[0].sink.room()
            return
        waits = [asyncio.ensure_future(entry.sink.room()) for entry in behind]  # the first to take some lets go
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _refuse_without_inputs(self, request: InferenceRequest) -> InferenceError:
        """A request without inputs to a batching model: counted as its failure, as tritonserver 2.51 counts it.

        Triton reads the batch size off a batching model's first input: it answers 400 / INVALID_ARGUMENT and
        counts a failure (reason BACKEND) without running the model; a model without batching runs it. An
        ensemble step whose only input an earlier step left out comes here too.
        """
        self.stats.record_failure(0, FailureReason.BACKEND.value)
        return InferenceError.invalid(
            f"[request id: {request.id or '<id_unknown>'}] out of bounds index 0: request has 0 inputs"
        )

    # Run an inner call on the calling thread (a sync callable's) if the model is idle; else None. The function
    # itself, not a method that calls it: a call less per inner call.
    run_here = direct_runs.run_here

    # On the loop: run an inner call in an idle instance's thread now; else None (direct_runs).
    start_here = direct_runs.start_here

    def await_inline(self, request: InferenceRequest, caller: CallPath) -> Optional[Awaitable[Outputs]]:
        """On the loop: an async caller's call to this idle async model, to await at once in its task; else None."""
        return direct_runs.await_inline(self, request, caller)

    def may_await_here(self) -> bool:
        """Whether `await_here` may take a call now (any thread: a hint)."""
        return direct_runs.may_await_here(self)

    def await_here(self, request: InferenceRequest, caller: CallPath, answer: DirectAnswer) -> bool:
        """On the loop: run a sync caller's inner call to an idle async model now; else False (direct_runs)."""
        if not request.inputs and self.spec.batching:
            return False
        return direct_runs.await_here(self, request, caller, answer)

    def _as_inference_error(self, error: BaseException, requests: int) -> InferenceError:
        """Map what a batch of `requests` raised to the error its requests get, and log the model's faults."""
        if isinstance(error, ModelCallError):  # an inner call's error, which its own model logged
            return error
        if isinstance(error, InferenceError):
            self.failures.outputs_refused(error, requests)
            return error
        if isinstance(error, asyncio.CancelledError):
            if self._accepting:
                return InferenceError.cancelled(f"request to model '{self.spec.name}' was cancelled")
            return self._stopped()
        if isinstance(error, BatchNotRun):
            self.failures.batch_not_run(error, requests)
        elif isinstance(error, OutputsNotTaken):
            self.failures.outputs_not_taken(error, requests)
        else:
            self.failures.callable_raised(error.error if isinstance(error, CallableRaised) else error, requests)
        if isinstance(error, PyTritonUnrecoverableError):
            self._on_unrecoverable(f"model '{self.spec.name}' raised PyTritonUnrecoverableError: {error}")
        return callable_error(error)

    def _cancelled(self) -> InferenceError:
        """The error of a request its client cancelled while it ran (nobody reads it: the client left)."""
        return InferenceError.cancelled(f"request to model '{self.spec.name}' was cancelled")

    def _stopped(self) -> InferenceError:
        """The error of a request the server's stop left unserved."""
        return InferenceError.unavailable(f"model '{self.spec.name}' stopped before the request was served")

    def _hand_over(self, slots: Optional[List[Slot]], index: int, action: Callable[..., None], *args: Any) -> None:
        """Run an outcome's action now, or, with preserve_ordering, once every earlier request's has run."""
        if slots is None or self._order is None:
            action(*args)
        else:
            self._order.settle(slots[index], action, *args)

    def _respond(self, entry: Entry, response: InferenceResponse) -> None:
        """Deliver a request's response."""
        if entry.cancelled:
            self._fail(entry, self._cancelled())
            return
        self.stats.record_success(
            time.monotonic_ns() - entry.enqueue_ns, entry.queue_ns, entry.compute_ns, entry.request.batch_size
        )
        if entry.request.compute_sink is not None:
            _add_compute(entry.request.compute_sink, entry.compute_ns)
        entry.sink.deliver(response)
        entry.sink.finish()

    def _end_stream(self, entry: Entry, cut: bool) -> None:
        """End a request's stream after its last response (`cut`: its generator was closed at a step, StreamStop).

        A cancelled request counts CANCELED where the cancel cost its client a response: a step after it (dropped
        there: `cut_off`), or a generator closed at its step, which did not end by itself. One whose generator ended
        by itself and handed on every response it made, as when its client cancels after the last response but
        before the final flag, counts a success, as tritonserver 2.51 counts it.
        """
        if entry.cut_off:
            return
        if entry.cancelled and cut:
            self._fail(entry, self._cancelled())
            return
        self.stats.record_success(
            time.monotonic_ns() - entry.enqueue_ns, entry.queue_ns, entry.compute_ns, entry.request.batch_size
        )
        entry.sink.finish()

    def _fail(self, entry: Entry, error: Any) -> None:
        """Fail a request (one its client cancelled counts as CANCELED, whatever its call gave)."""
        if entry.cancelled and (not isinstance(error, InferenceError) or error.reason is not FailureReason.CANCELED):
            error = self._cancelled()
        self.stats.record_failure(time.monotonic_ns() - entry.enqueue_ns, error.reason.value)
        entry.sink.fail(error)

    @property
    def _idle(self) -> bool:
        """Whether nothing is queued or running (an instance whose process is down runs nothing)."""
        if self._queues.size:
            return False
        return len(self._free) == len(self._instances) or all(
            instance in self._free or not instance.alive for instance in self._instances
        )

    @property
    def has_live_instance(self) -> bool:
        """Whether some instance can take work (a model whose every process is down is not ready)."""
        return any(instance.alive for instance in self._instances)

    def _update_idle(self) -> None:
        """Wake until_idle() once nothing is queued or running."""
        if self._drained is not None and self._idle:  # only while until_idle() waits
            wake(self._drained)

    @property
    def open_requests(self) -> Tuple[int, int]:
        """The requests waiting in the queue and those whose batch is running."""
        return self._queues.size, self._in_flight.requests

    def refuse(self) -> None:
        """Take no new request (UNAVAILABLE); those queued and running go on."""
        self._accepting = False

    async def until_idle(self) -> None:
        """Return once nothing is queued or running."""
        drained = self._drained
        if drained is None or drained.done():
            # Set before `_idle` is read: a caller's thread that frees an instance (run_here) reads it after.
            drained = self._drained = asyncio.get_running_loop().create_future()
        if self._idle:
            wake(drained)
            return
        await asyncio.shield(drained)  # a waiter that gives up leaves the future to the others

    def cut_off(self) -> int:
        """Answer every request still queued or running with UNAVAILABLE now; return how many there were.

        A running call goes on in its instance thread, but nobody waits for it: its result is dropped.
        """
        self._accepting = False
        queued = self._queues.drain()
        for entry in queued:
            self._fail(entry, self._stopped())
        if self._sequences is not None:
            self._sequences_ran(queued)
            self._sequences.close()
        running = self._in_flight.cut_off()
        awaiting = list(self._awaiting)
        for answer in awaiting:  # their calls go on; their callers are answered now, as a running batch's are
            stopped = self._stopped()
            answer.fail(ModelCallError(stopped.status, stopped.message, stopped.reason))
        if self._timer is not None:
            self._timer.cancel()
        self._watch.stop()
        return len(queued) + running + len(awaiting)

    async def close_instances(self, deadline: Optional[float] = None) -> None:
        """Stop the instances: threads end after their call, processes at once if a call still runs.

        An idle process is told to exit and killed if it has not by `deadline` (time.monotonic()).
        """
        await asyncio.gather(*(instance.close(deadline) for instance in self._instances))

    def resume(self) -> None:
        """Take requests again after a cut-off (model reload); the sequences of before are gone."""
        self._accepting = True
        if self._sequences is not None:
            self._sequences = SequenceSlots(
                self.spec,
                len(self._instances),
                self._forget,
                self._sequence_idle,
                self._sequence_expired,
                self._sequence_cancelled,
            )
        self._in_flight.reset()


def _add_compute(sink: List[int], compute: ComputeTimes) -> None:
    """Add a request's compute times to an ensemble's (its step's request names the sink)."""
    sink[0] += compute[0]
    sink[1] += compute[1]
    sink[2] += compute[2]
