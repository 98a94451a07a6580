"""Inner calls that skip an idle model's queue (core/composition/direct.py asks for them).

They run on the caller's thread, in an instance's thread for an async caller, or on the loop for a sync caller of an
async model. Each takes a free instance off the scheduler's free list for the call's time, counts the call in the
model's statistics as one that went through the queue, and lets the caller's request's end or cancel reach it
(a sync model's call: `LoneCall`, core/scheduling/running.py; an async model's: `DirectCall`). The functions here are
the bodies of `Scheduler`'s `run_here`, `start_here`, `may_await_here` and `await_here`, over its state.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from pytriton.core.composition.direct import DirectAnswer
from pytriton.core.composition.path import CallPath, ModelCallError, PathMaker
from pytriton.core.errors import FailureReason, InferenceError, callable_error
from pytriton.core.instances import Instance, call_in_scope
from pytriton.core.outputs import check_results, checked_outputs
from pytriton.core.queues import Entry
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.scheduling.async_call import CancelShieldedCall
from pytriton.core.scheduling.running import LoneCall, RunningBatch
from pytriton.core.sinks import ResponseSink
from pytriton.core.stats import FOLD_EVERY
from pytriton.core.worker import IN_WORKER
from pytriton.proxy.types import Request

if TYPE_CHECKING:
    from pytriton.core.scheduling.scheduler import Scheduler  # these functions are its methods' bodies, with its state

Outputs = Dict[str, np.ndarray]  # a direct inner call's answer: the outputs by name


class DirectCall(ResponseSink):
    """An inner call that runs on its caller's thread (Scheduler.run_here), as its caller's call path sees it.

    Its `cancel` runs on the loop when the caller's request ends or is cancelled: the callable's
    `is_cancelled()` says so, and its own inner calls are cancelled.
    """

    __slots__ = ("reason", "running")

    def __init__(self) -> None:
        """Not started yet."""
        self.running: Optional[RunningBatch] = None
        self.reason = ""

    def done(self) -> bool:
        """Whether the call has ended."""
        return self.running is None or self.running.ended

    def deliver(self, response: InferenceResponse) -> None:
        """Unused: the caller's thread gets the response itself."""

    def fail(self, error: InferenceError) -> None:
        """Unused: the caller's thread gets the error itself."""

    def finish(self) -> None:
        """Unused: the caller's thread gets the response itself."""

    def cancel(self, reason: str) -> None:
        """On the loop: the caller's request ended or was cancelled (or the caller itself, before the call started)."""
        running = self.running
        if running is not None and running.ended:
            return
        self.reason = reason
        if running is None:
            return  # the call fails as it starts
        for entry in running.entries:
            running.cancel(entry)
        if running.path is not None:
            running.path.close(reason)


def _idle_instance(scheduler: Scheduler, allowed: bool) -> Optional[Instance]:
    """A free instance taken off the free list if the model is idle and `allowed`; else None.

    Idle: nothing queued, accepting, not cut off, not traced. `allowed`: its kind of callable may run a direct call.
    Any thread: the loop's own uses of the free list allow for an instance taken between their test and their pop.
    """
    if (
        not allowed
        or scheduler._queues.size
        or not scheduler._accepting
        or scheduler._in_flight.cut
        or scheduler.spans is not None
    ):
        return None
    try:
        instance = scheduler._free.pop()
    except IndexError:  # none free (or another caller's thread took the last one)
        return None
    assert isinstance(instance, Instance)
    return instance


def start_here(
    scheduler: Scheduler,
    caller: CallPath,
    inputs: Dict[str, Any],
    parameters: Dict[str, Any],
    requested: Optional[List[str]],
    batch_size: int,
) -> Optional[Tuple[asyncio.Future[Outputs], LoneCall]]:
    """On the loop: run an inner call in an idle instance's thread now, as `run_here` runs it; else None.

    For an async callable calling a sync model: its result goes from the instance's thread straight to the
    caller's future, without the batch's task. Cancel the call with the LoneCall returned. (`Scheduler.start_here`
    is this function.)
    """
    if (  # as _idle_instance, inline: a call less per inner call
        not scheduler._runs_here
        or scheduler._queues.size
        or not scheduler._accepting
        or scheduler._in_flight.cut
        or scheduler.spans is not None
        or (not inputs and scheduler.spec.batching)
    ):
        return None
    try:
        instance = scheduler._free.pop()
    except IndexError:  # none free
        return None
    assert isinstance(instance, Instance)
    paths = scheduler._paths
    call = LoneCall(caller.chain, paths) if paths is not None else _lone_call(scheduler, caller)
    try:
        started = instance.submit(
            run_here, scheduler, caller, inputs, parameters, requested, batch_size, instance, call
        )
    except Exception:  # noqa: BLE001 - its thread cannot start: the queue's way reports it
        scheduler._free.append(instance)
        return None
    return started, call


def _lone_call(scheduler: Scheduler, caller: CallPath) -> LoneCall:
    """A direct call's LoneCall (its PathMaker made with the model's first call)."""
    paths = scheduler._paths
    if paths is None and scheduler.models is not None:  # the caller's loop is the engine's
        paths = scheduler._paths = PathMaker(scheduler.models, scheduler.spec.name, caller.loop, caller.inbox)
    return LoneCall(caller.chain, paths)


def may_await_here(scheduler: Scheduler) -> bool:
    """Whether `await_here` may take a call now (any thread: a hint, which `await_here` checks again)."""
    return scheduler._awaits_here and not scheduler._queues.size and bool(scheduler._free) and scheduler.spans is None


def await_here(scheduler: Scheduler, request: InferenceRequest, caller: CallPath, answer: DirectAnswer) -> bool:
    """On the loop: run a sync caller's inner call to an idle async model now, in a task of its own; else False.

    Idle as for `run_here`. The task awaits the callable as a batch's would, counts the call as `run_here`
    counts one, and settles `answer`, whose settling wakes the caller's thread: no queue entry, no batch task
    wrapped around the call, no sink, no response made.
    """
    instance = _idle_instance(scheduler, scheduler._awaits_here)
    if instance is None:
        return False
    scheduler._awaiting.add(answer)
    scheduler._track(scheduler.loop.create_task(_await_here(scheduler, instance, request, caller, answer)))
    return True


async def _await_here(
    scheduler: Scheduler, instance: Instance, request: InferenceRequest, caller: CallPath, answer: DirectAnswer
) -> None:
    """Await one request's call on `instance` (taken off the free list), count it, and settle `answer`."""
    try:
        outputs = await _await_call(scheduler, instance, request, caller, None)
    except ModelCallError as error:
        answer.fail(error)
    except BaseException as error:  # the task itself was cancelled (the server stops): it ends so
        answer.fail(_call_error(scheduler, error))
        raise
    else:
        answer.settle(outputs)
    finally:
        scheduler._awaiting.discard(answer)


def await_inline(scheduler: Scheduler, request: InferenceRequest, caller: CallPath) -> Optional[Awaitable[Outputs]]:
    """On the loop: an async caller's inner call to an idle async model, to await in the caller's own task; else None.

    Idle as for `run_here`. The callable's coroutine is driven in the awaiting task, in a copy of its context
    (core/scheduling/async_call.CancelShieldedCall): no queue entry, no task, no loop turn, no sink, no response made.
    The call is counted as `run_here` counts one, and the caller's request's end or cancel reaches it (`DirectCall`). A
    cancel of the awaiting task reaches the callable as `is_cancelled()`, as a queued call's would: its coroutine
    goes on in a task of its own, and the instance is free once it ends. Await what this returns at once (the
    instance is taken): the outputs, or ModelCallError as the call fails.
    """
    if not request.inputs and scheduler.spec.batching:
        return None
    instance = _idle_instance(scheduler, scheduler._awaits_here)
    if instance is None:
        return None
    return _await_call(scheduler, instance, request, caller, contextvars.copy_context())


async def _await_call(
    scheduler: Scheduler,
    instance: Instance,
    request: InferenceRequest,
    caller: CallPath,
    context: Optional[contextvars.Context],
) -> Outputs:
    """Await one request's call on `instance` (taken off the free list) and count it; its outputs.

    Raises ModelCallError as it fails or is cancelled. With a `context` (an inner call awaited in its caller's task)
    the callable's coroutine runs in it, shielded from a cancel of the awaiting task: the call is cancelled and
    ends in a task of its own (`_ended_after_cancel`) while the cancel goes on. Without one (a task of the call's
    own), what is thrown into it (the server stops) goes on as it is, once the call is counted.
    """
    spec = scheduler.spec
    direct = DirectCall()
    entry, call, running = _begin(scheduler, instance, request, caller, direct)
    start_ns, requested = entry.enqueue_ns, request.requested_outputs
    outputs: Optional[Outputs] = None
    error: Optional[BaseException] = None
    infer_start_ns = infer_end_ns = time.monotonic_ns()
    caller.inner.add(direct)
    going_on = False  # the awaiting task was cancelled while the call runs: it ends in a task of its own
    try:
        if caller.cancelled or direct.reason:
            raise InferenceError.cancelled(
                direct.reason or f"the request that calls model '{spec.name}' was cancelled or has ended"
            )
        started = instance.start([call], False, running if running.paths is not None else None)
        if context is None:
            results = await started
        else:
            shielded = CancelShieldedCall(started, context, own_cancels=False)  # type: ignore[arg-type]
            try:
                results = await shielded
            except asyncio.CancelledError:
                if shielded.rest is not None:  # else the callable itself raised it: the call has ended
                    going_on = True
                    direct.cancel("the caller was cancelled")  # the callable's is_cancelled() says so
                    shielded.rest.add_done_callback(
                        functools.partial(
                            _ended_after_cancel, scheduler, instance, request, caller, direct, start_ns, infer_start_ns
                        )
                    )
                raise
        infer_end_ns = time.monotonic_ns()
        if type(results) is not list or len(results) != 1:
            results = check_results(spec, results, 1)
        outputs = checked_outputs(spec, results[0], requested, scheduler.failures)
    except BaseException as raised:  # raised below as a ModelCallError (a cancel of its own task: as it is)
        if going_on:
            raise
        error = raised
    _end_call(scheduler, instance, request, caller, direct, (start_ns, infer_start_ns, infer_end_ns), error)
    if entry.cancelled:
        raise ModelCallError.cancelled(direct.reason or f"request to model '{spec.name}' was cancelled")
    if error is not None:
        if not isinstance(error, Exception) and context is None:
            raise error  # thrown into the call's own task
        raise _call_error(scheduler, error)
    assert outputs is not None
    return outputs


def _end_call(
    scheduler: Scheduler,
    instance: Instance,
    request: InferenceRequest,
    caller: CallPath,
    direct: DirectCall,
    times: Tuple[int, int, int],
    error: Optional[BaseException],
) -> None:
    """On the loop: an awaited call has ended: free its instance and count it."""
    output_end_ns = time.monotonic_ns()
    running = direct.running
    assert running is not None
    caller.inner.discard(direct)
    running.ended = True
    direct.running = None  # no cycle (direct -> running -> entry -> direct) left to the garbage collector
    request.inputs = {}
    running.entries[0].call = None
    instance.call_started_ns = 0
    scheduler._free.append(instance)
    _ran_here(scheduler, running, (*times, output_end_ns), error)


def _ended_after_cancel(
    scheduler: Scheduler,
    instance: Instance,
    request: InferenceRequest,
    caller: CallPath,
    direct: DirectCall,
    start_ns: int,
    infer_start_ns: int,
    rest: asyncio.Task[Any],
) -> None:
    """The coroutine of a call whose awaiting task was cancelled has ended: free its instance and count it."""
    infer_end_ns = time.monotonic_ns()
    error = asyncio.CancelledError() if rest.cancelled() else rest.exception()
    _end_call(scheduler, instance, request, caller, direct, (start_ns, infer_start_ns, infer_end_ns), error)


def _call_error(scheduler: Scheduler, error: BaseException) -> ModelCallError:
    """What the caller of a failed call gets: the error as its model answers it, with the inner model's message."""
    if isinstance(error, ModelCallError):
        return error
    failure = scheduler._as_inference_error(error, 1) if isinstance(error, asyncio.CancelledError) else None
    if failure is None:
        failure = error if isinstance(error, InferenceError) else callable_error(error)
    return ModelCallError(failure.status, failure.message, failure.reason)


def run_here(
    scheduler: Scheduler,
    caller: CallPath,
    inputs: Dict[str, Any],
    parameters: Dict[str, Any],
    requested: Optional[List[str]],
    batch_size: int,
    instance: Optional[Instance] = None,
    call: Optional[LoneCall] = None,
) -> Optional[Outputs]:
    """Run an inner call on the calling thread (a sync callable's), if the model is idle; else None.

    The call's request is given as its checked parts: `inputs` (a dict of the call's own), the callable's
    `parameters`, the outputs `requested` (None: all) and the batch size its inputs make. Idle: nothing queued and
    a free instance, which the call takes off the free list for its time, so the instance's concurrency stays one
    call and requests that come meanwhile queue and batch as usual. The call is counted in the statistics (on the
    loop, after it) as one that went through the queue, and the caller's request's end or cancel reaches it. Any
    thread; the loop's own uses of the free list allow for an instance taken between their test and their pop.
    Returns the outputs by name (checked as a response's, no response made); raises ModelCallError as the call
    fails. A request without inputs to a batching model goes the queue's way, which refuses it.
    (`Scheduler.run_here` is this function.)

    Given an `instance` taken off the free list already and its `call` (start_here, in the instance's thread), it
    runs the call on them. One LoneCall stands for the request's queue entry, its sink and its running batch of
    one: no InferenceRequest, Entry or RunningBatch is made. The callable runs in the model's scope and with the
    call as its call path, in a copy of the caller's context (instances.call_in_scope; inline, as the idle test, the
    output checks' first test and CallPath.later are: each a frame less per call).
    """
    if instance is None:
        if (  # as _idle_instance
            not scheduler._runs_here
            or scheduler._queues.size
            or not scheduler._accepting
            or scheduler._in_flight.cut
            or scheduler.spans is not None
            or (not inputs and scheduler.spec.batching)
        ):
            return None
        try:
            free = scheduler._free.pop()
        except IndexError:  # none free (or another caller's thread took the last one)
            return None
        assert isinstance(free, Instance)
        instance = free
    if call is None:
        paths = scheduler._paths
        call = LoneCall(caller.chain, paths) if paths is not None else _lone_call(scheduler, caller)
    spec = scheduler.spec
    start_ns = time.monotonic_ns()
    instance.call_started_ns = start_ns
    if len(inputs) > 1 and tuple(inputs) != spec.input_names:  # in the model's order, as a client's request's
        inputs = spec.in_declared_order(inputs)
    request = call.request = Request(
        inputs, parameters, None, list(spec.output_names) if requested is None else requested
    )
    outputs: Optional[Outputs] = None
    error: Optional[BaseException] = None
    infer_start_ns = infer_end_ns = time.monotonic_ns()
    inner = caller.inner
    inner.add(call)
    try:
        if caller.cancelled or call.reason:
            raise InferenceError.cancelled(
                call.reason or f"the request that calls model '{spec.name}' was cancelled or has ended"
            )
        results = contextvars.copy_context().run(
            call_in_scope, instance.fn, [request], instance.model, call if call.paths is not None else None
        )
        infer_end_ns = time.monotonic_ns()
        if type(results) is not list or len(results) != 1:
            results = check_results(spec, results, 1)
        result = results[0]
        if requested is None and type(result) is dict:  # checked_outputs' first test, inline: a frame less
            passed = spec.passed_outputs
            size = 0
            for name, value in result.items():
                if type(value) is not np.ndarray or passed.get((name, value.dtype)) is None:
                    break
                size += value.nbytes  # a number or bool array: what the response limit counts
            else:
                if size <= spec.max_response_bytes or not spec.max_response_bytes:  # else checked_outputs refuses it
                    outputs = dict(result)  # a copy: the callable may return a dict it keeps
        if outputs is None:
            outputs = checked_outputs(spec, result, requested, scheduler.failures)
    except Exception as raised:  # noqa: BLE001 - the caller gets it as a ModelCallError
        error = raised
    finally:
        output_end_ns = time.monotonic_ns()
        inner.discard(call)
        call.ended = True  # this thread made its path, if any: the loop closes it
        instance.call_started_ns = 0
        scheduler._free.append(instance)  # before the queue and `_drained` are read (see `_ran_here`)
        cancelled = call.cancelled  # read once: the call's answer and its count agree
        drained = scheduler._drained
        stats = scheduler.stats
        if outputs is not None and not cancelled and call.path is None and not stats.observers:  # the commonest end
            # Counted from this thread (ModelStats.lone_successes): the loop is woken only to start what queued.
            lone = stats.lone_successes
            lone.append(
                (batch_size, batch_size if spec.batching else 1, start_ns, infer_start_ns, infer_end_ns, output_end_ns)
            )
            if len(lone) % FOLD_EVERY == 0:
                try:
                    caller.inbox.post(stats.fold)
                except RuntimeError:  # the loop has closed: nobody reads these statistics any more
                    pass
            if scheduler._queues.size or (drained is not None and not drained.done()):
                caller.inbox.post(_freed, scheduler)
        else:
            _tell_loop(
                scheduler,
                caller,
                call,
                batch_size,
                (start_ns, infer_start_ns, infer_end_ns, output_end_ns),
                outputs is not None,
                cancelled,
                error,
            )
    if cancelled:
        raise ModelCallError.cancelled(call.reason or f"request to model '{spec.name}' was cancelled")
    if error is not None:
        failure = error if isinstance(error, InferenceError) else callable_error(error)
        raise ModelCallError(failure.status, failure.message, failure.reason)
    assert outputs is not None
    return outputs


def _begin(
    scheduler: Scheduler, instance: Instance, request: InferenceRequest, caller: CallPath, direct: DirectCall
) -> Tuple[Entry, Request, RunningBatch]:
    """One direct call's entry (never queued: no priority level to find), the callable's Request and its batch."""
    spec = scheduler.spec
    entry = Entry(request, direct, 0, 0)
    entry.queued = False
    instance.call_started_ns = entry.enqueue_ns
    requested = request.requested_outputs
    data = request.inputs
    call = entry.call = Request(
        data=spec.in_declared_order(data) if tuple(data) != spec.input_names else data,
        parameters=request.parameters,
        requested_output_names=list(spec.output_names) if requested is None else requested,
    )
    paths = scheduler._paths
    if paths is None and scheduler.models is not None:  # the caller's loop is the engine's
        paths = scheduler._paths = PathMaker(scheduler.models, spec.name, caller.loop, caller.inbox)
    running = direct.running = RunningBatch([entry], instance, False, paths)
    return entry, call, running


def _tell_loop(
    scheduler: Scheduler,
    caller: CallPath,
    call: LoneCall,
    batch_size: int,
    times: Tuple[int, int, int, int],
    succeeded: bool,
    cancelled: bool,
    error: Optional[BaseException],
) -> None:
    """From the caller's thread: have the loop count a direct call that ended otherwise than the commonest way.

    Its model has observers (metrics' latencies, which the loop feeds), or it failed, was cancelled or made a call
    path. The loop counts it once the caller's batch is answered, off the way of its answers (CallPath.later), or
    now where it must start what queued meanwhile, or is woken by nothing else (a thread not a worker's).
    """
    if succeeded and not cancelled and call.path is None:
        # Told with numbers only: the call's objects go now, not once the loop has counted it.
        told: Tuple[Any, ...] = (scheduler, batch_size, *times)
        count: Callable[..., None] = _succeeded_here
    else:
        call.request = None  # the caller's arrays are not held until the loop counts the call
        told, count = (scheduler, call, batch_size, times, cancelled, error), _lone_ran
    drained = scheduler._drained
    if scheduler._queues.size or (drained is not None and not drained.done()) or not getattr(IN_WORKER, "yes", 0):
        caller.inbox.post(count, *told)
    else:
        caller.later(count, *told)


def _freed(scheduler: Scheduler) -> None:
    """On the loop: a direct call's instance is free again; start what queued meanwhile, or tell until_idle()."""
    if scheduler._free and scheduler._queues.size:
        scheduler._schedule()
    elif scheduler._drained is not None:  # only while until_idle() waits
        scheduler._update_idle()


def _succeeded_here(
    scheduler: Scheduler, batch_size: int, start_ns: int, infer_start_ns: int, infer_end_ns: int, output_end_ns: int
) -> None:
    """On the loop: `_ran_here` for a call that succeeded, was not cancelled and made no call path of its own."""
    scheduler.stats.record_lone_success(
        batch_size,
        batch_size if scheduler.spec.batching else 1,
        infer_start_ns - start_ns,
        infer_end_ns - infer_start_ns,
        output_end_ns - infer_end_ns,
        output_end_ns - start_ns,
    )
    _freed(scheduler)


def _ran_here(
    scheduler: Scheduler, running: RunningBatch, times: Tuple[int, int, int, int], error: Optional[BaseException]
) -> None:
    """On the loop: count a call that ran on its caller's thread, and start what its instance may run now.

    The caller's thread put the instance back on the free list, then read the queue's size and `_drained`:
    a request queued, or an `until_idle()` begun, after that thread's reads found the instance free already.
    """
    entry = running.entries[0]
    _count_ran(scheduler, running, entry.request.batch_size, times, entry.cancelled, error)


def _lone_ran(
    scheduler: Scheduler,
    call: LoneCall,
    batch_size: int,
    times: Tuple[int, int, int, int],
    cancelled: bool,
    error: Optional[BaseException],
) -> None:
    """On the loop: count a direct call that failed, was cancelled or made a call path, as `_ran_here` counts one."""
    _count_ran(scheduler, call, batch_size, times, cancelled, error)


def _count_ran(
    scheduler: Scheduler,
    ran: Union[RunningBatch, LoneCall],
    batch_size: int,
    times: Tuple[int, int, int, int],
    cancelled: bool,
    error: Optional[BaseException],
) -> None:
    """On the loop: count a call that ran on its caller's thread, end the call path it made, start what queued."""
    start_ns, infer_start_ns, infer_end_ns, output_end_ns = times
    rows = batch_size if scheduler.spec.batching else 1
    compute = (infer_start_ns - start_ns, infer_end_ns - infer_start_ns, output_end_ns - infer_end_ns)
    if ran.path is not None:
        ran.end(scheduler.spec.name)
    if cancelled or error is not None:
        scheduler.stats.record_execution(rows, *compute)
        if cancelled:
            reason = FailureReason.CANCELED
        else:
            assert error is not None
            reason = scheduler._as_inference_error(error, 1).reason  # logged here, as the loop logs a batch's
        scheduler.stats.record_failure(output_end_ns - start_ns, reason.value)
    else:
        scheduler.stats.record_lone_success(batch_size, rows, *compute, output_end_ns - start_ns)
    _freed(scheduler)
