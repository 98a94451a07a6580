"""Inner calls to an idle model that skip its queue: run on the caller's thread, or answered straight to it.

A sync callable calling a sync model that is idle (nothing queued, a free
instance, no batching delay, no sequence or ordering to keep) runs the call on its own thread (`call_here`,
Scheduler.run_here). The other way took four wake-ups, each a context switch and a wait for the GIL: the
caller's thread to the loop, the loop to the inner instance's thread, back to the loop, back to the caller;
98 us per call on the bench VM (`python -m bench.composition`, a sync callable calling a sync identity 2,000
times), 34-120 us from run to run. On the caller's thread it costs 9-16 us, none of them a wake-up: the call
takes the instance off the free list for its time (one call at a time on it, as ever; a request that comes
meanwhile queues and batches as usual), puts it back itself, and counts its success itself, without the loop
(ModelStats.lone_successes). With a wake-up of the loop per call for its statistics, the same direct call cost
29-37 us: the GIL went to the loop and back each time. (A failed or cancelled call's statistics, or those of a
model whose latencies metrics observe, wait with the caller's batch, CallPath.later, and are counted on the loop
once that batch is answered.) (Not measured: the inner answer sent
from the inner instance's thread straight to the caller's doorbell, which by count still leaves three
wake-ups.) A call with a deadline, a traced one, or one that cannot run at once goes the loop's way, which
keeps the deadline's timer and the spans.

An async callable calling an idle sync model cannot run it on its own thread (the loop's), but the call skips
the batch's task and the sink (`call_here_async`, Scheduler.start_here): the instance's thread runs it as
`run_here` would and its answer settles the caller's future. 22 us per call instead of 36-79 us; the async
pipeline's p50 over one hop's, pinned to one core, from 46 us to 30 us.

An async callable calling an idle async model awaits its callable in its own task (`call_here_async`,
Scheduler.await_inline), in a copy of its context and shielded from its cancel as a batch's callable is
(core/scheduling/async_call.CancelShieldedCall): no queue entry, no task, no loop turn, no sink, no response. 98k
instructions per call instead of 232k (`python -m bench instr_ab REF . --composition async-async`).

A sync callable calling an idle async model posts the call to the loop, which awaits it at once in a task of
its own (`call_here`, Scheduler.await_here) and wakes the caller's thread with its answer (`DirectAnswer`): the
two thread crossings stay, the queue's entry, the batch's task and shield, the sink and the response go; 17 us
of server CPU per call instead of 28. Should the model be busy by the time the loop looks, the caller goes the
queue's way. The server's cut-off answers such a call at once (UNAVAILABLE), as it answers a running batch's.

Either way the call answers the outputs by name, checked and selected as a response's are
(core/outputs.checked_outputs, its first test inline) but with no response made for them to be taken out of again.
The checks' verdicts are remembered by the inputs' and outputs' signatures (names, dtypes, shapes:
`ModelSpec.passed_inputs` and `passed_outputs`), and the call leaves no reference cycle to the garbage collector.
A sync model's call makes two objects, the callable's Request and a LoneCall (core/scheduling/running.py), which stands
for its queue entry, sink and running batch; its request is passed as its checked parts, no InferenceRequest made. Its
success is counted from the caller's thread (ModelStats.lone_successes, folded into the counters when they are
read); the loop is woken only where requests queued meanwhile. 42k instructions per sync -> sync call, 94k per
async -> sync (`python -m bench instr_ab REF . --composition [async-sync]`), 72k and 126k before (2026-12-07);
docs/performance.md#composition.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.composition.inner_call import build_request, thread_doorbell
from pytriton.core.composition.path import CallPath, Cancellable
from pytriton.core.doorbell import Doorbell
from pytriton.core.request import InferenceRequest

# A call that may run without the loop: its model, then its request's checked parts (Scheduler.run_here's).
Direct = Tuple[Any, Dict[str, Any], Dict[str, Any], Optional[List[str]], int]


def _direct_call(
    path: CallPath,
    name: str,
    inputs: Dict[str, Any],
    version: Any,
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
    timeout_s: Optional[float],
) -> Optional[Direct]:
    """The model of a call that may run without the loop, and its request's checked parts; None for one the loop takes.

    The parts are the inputs (a dict of the call's own), the parameters the callable sees, the outputs asked for
    (None: all) and the batch size. The loop takes any call with a deadline, a traced one, a cycle, or an error in
    its arguments (it answers it).
    """
    if timeout_s is not None or path.deadline_ns or path.cancelled or path.span is not None or name in path.chain:
        return None
    try:
        model = path.models.model(name, "" if version is None else str(version))
        if requested_outputs is None and len(inputs) == 1:  # the commonest call: build_request's first test, inline
            for input_name, value in inputs.items():
                if type(value) is np.ndarray:
                    try:
                        batch_size = model.spec.passed_inputs.get((input_name, value.dtype, value.shape))
                    except TypeError:  # a dtype numpy cannot hash: build_request checks it in full
                        batch_size = None
                    if batch_size is not None:
                        return (
                            model,
                            {input_name: value},
                            {} if parameters is None else dict(parameters),
                            None,
                            batch_size,
                        )
        request = build_request(model.spec, inputs, parameters, requested_outputs)
    except Exception:  # noqa: BLE001 - the loop's way reports it
        return None
    return model, request.inputs, request.parameters, request.requested_outputs, request.batch_size


def _request_of(path: CallPath, direct: Direct) -> InferenceRequest:
    """The InferenceRequest of a direct call's parts, for the ways that take one (an async model's)."""
    _, inputs, parameters, requested, batch_size = direct
    request = InferenceRequest(
        request_id="", inputs=inputs, parameters=parameters, requested_outputs=requested, batch_size=batch_size
    )
    request.origin = (path.chain, 0, None)
    return request


def call_here(
    path: CallPath,
    name: str,
    inputs: Dict[str, Any],
    version: Any,
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
    timeout_s: Optional[float],
) -> Optional[Dict[str, np.ndarray]]:
    """From a sync callable's thread: run the call on this thread if its model is idle; None if it cannot now.

    The call's arguments are call_model's (`version` as given, None: the latest). The model's scheduler decides
    (Scheduler.run_here); what it cannot take goes through the loop instead. An idle async model's call is awaited
    on the loop in a task of its own (Scheduler.await_here), this thread woken by its answer. Raises ModelCallError
    as the call fails.
    """
    # _direct_call, inline: a frame and a tuple less per call (an async caller's is not on a thread's way to wait)
    if timeout_s is not None or path.deadline_ns or path.cancelled or path.span is not None or name in path.chain:
        return None
    try:
        model = path.models.model(name, "" if version is None else str(version))
        batch_size: Optional[int] = None
        if requested_outputs is None and len(inputs) == 1:  # the commonest call: build_request's first test, inline
            for input_name, value in inputs.items():
                if type(value) is np.ndarray:
                    try:
                        batch_size = model.spec.passed_inputs.get((input_name, value.dtype, value.shape))
                    except TypeError:  # a dtype numpy cannot hash: build_request checks it in full
                        pass
        if batch_size is not None:
            arrays: Dict[str, Any] = {input_name: value}
            called: Dict[str, Any] = {} if parameters is None else dict(parameters)
            requested: Optional[List[str]] = None
        else:
            request = build_request(model.spec, inputs, parameters, requested_outputs)
            arrays, called, requested, batch_size = (
                request.inputs,
                request.parameters,
                request.requested_outputs,
                request.batch_size,
            )
    except Exception:  # noqa: BLE001 - the loop's way reports it
        return None
    outputs: Optional[Dict[str, np.ndarray]] = model.run_here(path, arrays, called, requested, batch_size)
    if outputs is None and model.may_await_here():
        outputs = _awaited_on_loop(path, model, _request_of(path, (model, arrays, called, requested, batch_size)))
    return outputs


class DirectAnswer:
    """What a call awaited on the loop answers the sync caller's thread waiting for it: outputs or an error."""

    __slots__ = ("done", "doorbell", "error", "outputs")

    def __init__(self, doorbell: Doorbell) -> None:
        """Not answered yet; `doorbell` is the waiting thread's."""
        self.doorbell = doorbell
        self.done = False
        self.outputs: Optional[Dict[str, np.ndarray]] = None  # None once done: the model was busy by then
        self.error: Optional[BaseException] = None

    def settle(self, outputs: Optional[Dict[str, np.ndarray]]) -> None:
        """On the loop: answer the outputs (None: the call did not run), waking the caller's thread; once."""
        if self.done:
            return  # answered already (the server's cut-off)
        self.outputs = outputs
        self.done = True
        self.doorbell.ring()

    def fail(self, error: BaseException) -> None:
        """On the loop: answer the call's error, waking the caller's thread; once."""
        if self.done:
            return
        self.error = error
        self.done = True
        self.doorbell.ring()


def _awaited_on_loop(path: CallPath, model: Any, request: InferenceRequest) -> Optional[Dict[str, np.ndarray]]:
    """An idle async model's call, awaited on the loop; None when the model was busy by the time the loop looked."""
    answer = DirectAnswer(thread_doorbell())
    path.inbox.post(_await_on_loop, model, request, path, answer)
    doorbell = answer.doorbell
    while not answer.done:  # rings of this thread's earlier calls may wake it early
        doorbell.take()
    if answer.error is not None:
        raise answer.error
    return answer.outputs


def _await_on_loop(model: Any, request: InferenceRequest, path: CallPath, answer: DirectAnswer) -> None:
    """On the loop: start the call if the model is still idle, else let the caller go the queue's way."""
    try:
        started = model.await_here(request, path, answer)
    except BaseException:
        answer.settle(None)  # the queue's way reports what went wrong
        raise
    if not started:
        answer.settle(None)


def call_here_async(
    path: CallPath,
    name: str,
    inputs: Dict[str, Any],
    version: Any,
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
    timeout_s: Optional[float],
) -> Optional[Awaitable[Dict[str, np.ndarray]]]:
    """On the loop (an async callable): run the call at once if its model is idle; None if it cannot now.

    As `call_here` decides. A sync model's call runs in its instance's thread (Scheduler.start_here): the answer
    comes from that thread to the caller without the batch's task and the sink in between. An async model's
    callable is awaited in the caller's own task (Scheduler.await_inline). Await what it returns for the outputs.
    """
    direct = _direct_call(path, name, inputs, version, parameters, requested_outputs, timeout_s)
    if direct is None:
        return None
    model = direct[0]
    started = model.start_here(path, *direct[1:])
    if started is not None:
        return _answer_of(*started)
    inline: Optional[Awaitable[Dict[str, np.ndarray]]] = model.await_inline(_request_of(path, direct), path)
    return inline


async def _answer_of(future: asyncio.Future[Dict[str, np.ndarray]], call: Cancellable) -> Dict[str, np.ndarray]:
    """The outputs of a call started in an instance's thread; cancelling the waiter cancels the call."""
    try:
        return await future
    except asyncio.CancelledError:
        call.cancel("the caller was cancelled")
        raise
