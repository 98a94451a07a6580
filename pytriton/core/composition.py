"""Calls from a callable (or a custom route) to another bound model, in-process, through that model's queue.

The call path travels with each request: a batch's `CallPath` names the models on its way (a call to one of
them again is a cycle and is refused), the earliest deadline of its requests (which bounds its inner calls),
and the inner calls in flight (cancelled when the batch ends or is cancelled). The scheduler hands the
instance a `PathSource` with each batch (core/running.RunningBatch), which the instance makes `CURRENT` in the
thread or coroutine that runs the callable; the `CallPath` itself is made from it only when the callable calls a
model. Most batches never do: making one for each cost about 2 us of the server's CPU per request (the
loop, its inbox, the requests' origins and deadlines looked up, a registry entry), 2 % of a small request's.

An inner call is a request like any client's: it joins the inner model's queue and batches with the others,
and the inner model's statistics count it. It starts on the engine's loop; a sync callable's thread waits on a
doorbell of its own (the loop is never blocked), an async one awaits it on the loop.

Except one case, the commonest: a sync callable calling a sync model that is idle (nothing queued, a free
instance, no batching delay, no sequence or ordering to keep) runs the call on its own thread (`call_here`,
Scheduler.run_here). The other way took four wake-ups, each a context switch and a wait for the GIL: the
caller's thread to the loop, the loop to the inner instance's thread, back to the loop, back to the caller;
98 us per call on the bench VM (`python -m bench.composition`, a sync callable calling a sync identity 2,000
times), 34-120 us from run to run. On the caller's thread it costs 9-16 us, none of them a wake-up: the call
takes the instance off the free list for its time (one call at a time on it, as ever; a request that comes
meanwhile queues and batches as usual), puts it back itself, and posts its statistics to the loop quietly
(LoopInbox.post_quietly), to be counted when the caller's own call ends, which wakes the loop anyway. With a
wake-up of the loop per call for its statistics, the same direct call cost 29-37 us: the GIL went to the loop
and back each time. (Not measured: the inner answer sent from the inner instance's thread straight to the
caller's doorbell, which by count still leaves three wake-ups.) A call with a deadline, a traced one, or one
that cannot run at once goes the loop's way, which keeps the deadline's timer and the spans.

An async callable calling an idle sync model cannot run it on its own thread (the loop's), but the call skips
the batch's task and the sink (`call_here_async`, Scheduler.start_here): the instance's thread runs it as
`run_here` would and its answer settles the caller's future. 22 us per call instead of 36-79 us; the async
pipeline's p50 over one hop's, pinned to one core, from 46 us to 30 us.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
)

import numpy as np

from pytriton.core.datatypes import datatype_of_dtype
from pytriton.core.doorbell import Doorbell, LoopInbox, inbox_of
from pytriton.core.errors import InferenceError, Status
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.sinks import ResponseSink
from pytriton.core.spec import ModelSpec

# The models on a request's way in, the monotonic time it must be answered by (0: none), and the span its caller's
# request runs under when traced (its spans nest under it), else None.
Origin = Tuple[Tuple[str, ...], int, Any]


class CalledModel(Protocol):
    """What an inner call needs of a served model version (core/model.ServedModel)."""

    spec: ModelSpec

    def submit(self, request: InferenceRequest, sink: ResponseSink, streaming: bool) -> Optional[ResponseSink]:
        """Queue a request whose responses go to `sink`; the sink queued (None when the cache answered)."""

    @property
    def scheduler(self) -> Any:
        """The model's scheduler (`withdraw(sink)` takes a queued request out)."""


class Models(Protocol):
    """Where inner calls find their model (core/engine.Engine, on its loop)."""

    def model(self, name: str, version: str = "") -> Any:
        """The model version named (latest when the version is empty), or NOT_FOUND."""


class ModelCallError(InferenceError):
    """An inner call failed; its message is the inner model's (or the refusal's), its status the inner one's.

    Raised from a callable and not caught, it fails the outer request with the same status and message.
    """


class Cancellable(Protocol):
    """An inner call in flight, as its call path sees it."""

    def cancel(self, reason: str) -> None:
        """Give up the call (the outer request ended or was cancelled)."""


class CallArguments(NamedTuple):
    """What a callable asks of an inner call (pytriton.compose), carried as one value down to the inner request.

    An instance process sends it to the server in its MODEL_CALL message, its inputs packed.
    """

    name: str
    inputs: Dict[str, Any]
    version: Optional[str]  # as the engine names it; None: the latest
    parameters: Optional[Dict[str, Any]]
    requested_outputs: Optional[Sequence[str]]
    timeout_s: Optional[float]
    streaming: bool  # iterated as a stream (stream_model): a decoupled model is called only so


class CallPath:
    """What a running batch (or a custom route's request) hands to the inner calls it makes."""

    __slots__ = ("cancelled", "chain", "deadline_ns", "inbox", "inner", "loop", "models", "span")

    def __init__(
        self,
        models: Models,
        chain: Tuple[str, ...],
        deadline_ns: int,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        inbox: Optional[LoopInbox] = None,
    ) -> None:
        """Create the path; `chain`: the models on it, outermost first; `loop`: the engine's (else the running one)."""
        self.models = models
        self.chain = chain
        self.deadline_ns = deadline_ns
        self.loop = asyncio.get_running_loop() if loop is None else loop
        self.inbox: LoopInbox = inbox_of(self.loop) if inbox is None else inbox
        self.inner: Set[Cancellable] = set()
        self.cancelled = False
        self.span: Any = None  # the span of a traced request of the batch: inner requests' spans nest under it

    def call_path(self) -> CallPath:
        """Itself (a CallPath is its own PathSource)."""
        return self

    def close(self, reason: str) -> None:
        """On the loop: the batch ended or was cancelled; cancel its inner calls still in flight and refuse new ones."""
        self.cancelled = True
        for call in list(self.inner):
            call.cancel(reason)


class PathSource(Protocol):
    """What `CURRENT` holds: a call path, or what makes one when the callable first calls a model."""

    def call_path(self) -> CallPath:
        """The call path (made on the first call; from any thread)."""


CURRENT: contextvars.ContextVar[Optional[PathSource]] = contextvars.ContextVar("pytriton_call_path", default=None)


class PathMaker:
    """What the call paths of one model's batches share: the engine's models, the model's name, the loop."""

    __slots__ = ("inbox", "loop", "models", "name")

    def __init__(
        self,
        models: Models,
        name: str,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        inbox: Optional[LoopInbox] = None,
    ) -> None:
        """Made on the engine's loop (its inbox is opened there), or anywhere given the loop and its inbox."""
        self.models = models
        self.name = name
        self.loop = asyncio.get_running_loop() if loop is None else loop
        self.inbox = inbox_of(self.loop) if inbox is None else inbox

    def plain(self) -> CallPath:
        """The call path of a batch of clients' requests without a deadline; any thread."""
        return CallPath(self.models, (self.name,), 0, self.loop, self.inbox)

    def path_of(self, origins: Sequence[Optional[Origin]], deadlines: Sequence[int]) -> CallPath:
        """The call path of a batch whose requests have these origins and deadlines (0: none); any thread."""
        if any(origin is not None for origin in origins) or any(deadlines):
            chain, deadline = _joined(self.name, origins, deadlines)
            return CallPath(self.models, chain, deadline, self.loop, self.inbox)
        return CallPath(self.models, (self.name,), 0, self.loop, self.inbox)  # clients' requests without a timeout


def _joined(name: str, origins: Sequence[Optional[Origin]], deadlines: Sequence[int]) -> Tuple[Tuple[str, ...], int]:
    """The requests' paths joined, then `name`; their earliest deadline (0: none)."""
    chain: List[str] = []
    deadline = 0
    for origin in origins:
        if origin is not None:
            for step in origin[0]:
                if step not in chain:
                    chain.append(step)
            if origin[1] and (not deadline or origin[1] < deadline):
                deadline = origin[1]
    for own in deadlines:
        if own and (not deadline or own < deadline):
            deadline = own
    chain.append(name)
    return tuple(chain), deadline


def run_in_path(path: Optional[PathSource], fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` (in an instance thread) with `path` as the current call path."""
    token = CURRENT.set(path)
    try:
        return fn(*args)
    finally:
        CURRENT.reset(token)


class InnerCall(ResponseSink):
    """One inner call's sink: responses (or the error) gathered on the loop, `wake()` called on each change."""

    __slots__ = (
        "_path",
        "_timer",
        "compute",
        "ended",
        "error",
        "items",
        "model",
        "outer",
        "queued",
        "streaming",
        "wake",
    )

    def __init__(self, wake: Callable[[], None]) -> None:
        """Create the sink; `wake` runs on the loop after each response and at the end."""
        self.wake = wake
        self.items: Deque[InferenceResponse] = deque()
        self.ended = False
        self.error: Optional[InferenceError] = None
        self.model: Any = None
        self.queued: Optional[ResponseSink] = None
        self.streaming = False  # a stream's reader is woken by each response; a single call's by its end only
        # An ensemble step's: where its model adds the request's compute times (input, infer, output ns).
        self.compute: Optional[List[int]] = None
        # An ensemble step's: the ensemble's request, whose id, priority, timeout and sequence parameters the step's
        # request takes, as Triton's ensemble scheduler gives them to its steps.
        self.outer: Optional[InferenceRequest] = None
        self._path: Optional[CallPath] = None
        self._timer: Optional[asyncio.TimerHandle] = None

    def done(self) -> bool:
        """Whether the call ended."""
        return self.ended

    def deliver(self, response: InferenceResponse) -> None:
        """Keep one response."""
        if not self.ended:
            self.items.append(response)
            if self.streaming:
                self.wake()

    def fail(self, error: InferenceError) -> None:
        """End the call with the inner model's error."""
        if not self.ended:
            self.error = ModelCallError(error.status, error.message, error.reason)
            self._end()

    def finish(self) -> None:
        """End the call after its last response."""
        if not self.ended:
            self._end()

    def cancel(self, reason: str) -> None:
        """Give up the call (the outer request ended or was cancelled): out of the queue if still there."""
        self._give_up(InferenceError.cancelled(reason))

    def expire(self, reason: str) -> None:
        """Give up the call at its deadline (UNAVAILABLE, as Triton's queue timeout)."""
        self._give_up(InferenceError.unavailable(reason))

    def _give_up(self, error: InferenceError) -> None:
        if self.ended:
            return
        self.fail(error)  # first: the inner model's scheduler then sees this sink done
        if self.model is not None and self.queued is not None:
            self.model.scheduler.withdraw(self.queued)  # out of the queue; or its batch's own inner calls cancelled

    def _end(self) -> None:
        self.ended = True
        if self._timer is not None:
            self._timer.cancel()
        if self._path is not None:
            self._path.inner.discard(self)
        self.wake()

    def start(self, path: CallPath, arguments: CallArguments) -> None:
        """On the loop: queue the call; a refusal ends it at once with its error."""
        self.streaming = arguments.streaming
        try:
            self._start(path, arguments)
        except InferenceError as error:
            self.fail(error)
        except Exception as error:  # noqa: BLE001 - a bad argument fails this call, never the loop
            self.fail(InferenceError.invalid(f"{type(error).__name__}: {error}"))

    def _start(self, path: CallPath, arguments: CallArguments) -> None:
        name, inputs, version, parameters, requested_outputs, timeout_s, streaming = arguments
        if path.cancelled:
            raise InferenceError.cancelled(f"the request that calls model '{name}' was cancelled or has ended")
        if name in path.chain:
            way = " -> ".join((*path.chain, name))
            raise InferenceError.invalid(f"model '{name}' is already on the call path ({way}): a cycle is refused")
        model = path.models.model(name, "" if version is None else str(version))
        spec: ModelSpec = model.spec
        if not streaming and spec.decoupled:
            raise InferenceError.invalid(f"model '{name}' is decoupled: stream its responses (stream_model)")
        now = time.monotonic_ns()
        deadline = path.deadline_ns
        if timeout_s is not None:
            own = now + int(timeout_s * 1e9)
            deadline = own if not deadline else min(deadline, own)
        if deadline and deadline <= now:
            raise InferenceError.unavailable(f"the deadline passed before model '{name}' was called")
        request = build_request(spec, inputs, parameters, requested_outputs)
        request.origin = (path.chain, deadline, path.span)
        request.compute_sink = self.compute
        outer = self.outer
        if outer is not None:
            request.id = outer.id
            request.priority = outer.priority
            request.timeout_us = outer.timeout_us
            request.sequence = outer.sequence
        self.model = model
        self.queued = model.submit(request, self, streaming)
        if self.queued is None:  # the response cache answered: that response is the call's only one
            self.finish()
        if self.ended:
            return
        self._path = path
        path.inner.add(self)
        if deadline:
            self._timer = path.loop.call_later(
                (deadline - now) / 1e9, self.expire, f"the deadline passed before model '{name}' answered"
            )

    def outputs(self) -> Dict[str, np.ndarray]:
        """The single response's outputs by name; raises the call's error."""
        if self.error is not None:
            raise self.error
        if not self.items:
            raise ModelCallError(Status.INTERNAL, "the model returned no response")
        return outputs_of(self.items[-1])


def _direct_request(path: CallPath, arguments: CallArguments) -> Optional[Tuple[Any, InferenceRequest]]:
    """The model and request of a call that may run without the loop; None for one the loop must take.

    The loop takes any call with a deadline, a traced one, a cycle, or an error in its arguments (it answers it).
    """
    name = arguments.name
    if arguments.timeout_s is not None or path.deadline_ns or path.cancelled or path.span is not None:
        return None
    if name in path.chain:
        return None
    try:
        model = path.models.model(name, "" if arguments.version is None else arguments.version)
        request = build_request(model.spec, arguments.inputs, arguments.parameters, arguments.requested_outputs)
    except Exception:  # noqa: BLE001 - the loop's way reports it
        return None
    request.origin = (path.chain, 0, None)
    return model, request


def call_here(path: CallPath, arguments: CallArguments) -> Optional[Dict[str, np.ndarray]]:
    """From a sync callable's thread: run the call on this thread if its model is idle; None if it cannot now.

    The model's scheduler decides (Scheduler.run_here); what it cannot take goes through the loop instead.
    Raises ModelCallError as the call fails.
    """
    direct = _direct_request(path, arguments)
    if direct is None:
        return None
    model, request = direct
    response = model.run_here(request, path)
    return None if response is None else outputs_of(response)


def call_here_async(path: CallPath, arguments: CallArguments) -> Optional[Awaitable[Dict[str, np.ndarray]]]:
    """On the loop (an async callable): run the call in its idle model's instance thread; None if it cannot now.

    As `call_here` decides, for a sync model (Scheduler.start_here): the answer comes from that thread to the
    caller without the batch's task and the sink in between. Await what it returns for the outputs.
    """
    direct = _direct_request(path, arguments)
    if direct is None:
        return None
    model, request = direct
    started = model.start_here(request, path)
    return None if started is None else _answer_of(*started)


async def _answer_of(future: asyncio.Future[InferenceResponse], call: Cancellable) -> Dict[str, np.ndarray]:
    """The outputs of a call started in an instance's thread; cancelling the waiter cancels the call."""
    try:
        response = await future
    except asyncio.CancelledError:
        call.cancel("the caller was cancelled")
        raise
    return outputs_of(response)


def outputs_of(response: InferenceResponse) -> Dict[str, np.ndarray]:
    """A response's outputs by name (the arrays themselves, not copies)."""
    return {output.name: output.array for output in response.outputs}


def build_request(
    spec: ModelSpec,
    inputs: Dict[str, Any],
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
) -> InferenceRequest:
    """An inner call's request, its inputs checked against the model as a client's are (Triton's messages)."""
    arrays: Dict[str, np.ndarray] = {}
    batch_sizes: List[int] = []
    if not spec.input_count_fits(len(inputs)):
        spec.check_input_count(list(inputs))
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        datatype = datatype_of_dtype(array.dtype)
        if datatype is None:
            raise InferenceError.invalid(f"input '{name}' for model '{spec.name}' has unsupported dtype {array.dtype}")
        batch_sizes.append(spec.check_input(name, datatype, array.shape))
        arrays[name] = array
    batch_size = spec.check_input_set(list(arrays), batch_sizes)
    requested: Optional[List[str]] = None
    if requested_outputs is not None:
        requested = list(requested_outputs)
        for output in requested:
            if output not in spec.output_names:
                raise InferenceError.invalid(f"unexpected inference output '{output}' for model '{spec.name}'")
    return InferenceRequest(
        request_id="",
        inputs=arrays,
        parameters=dict(parameters or {}),
        requested_outputs=requested,
        batch_size=batch_size,
    )


# In an instance process: how its callable calls models of the server (core/process_instances/host.py): each
# response's outputs, as they come.
ProcessCaller = Callable[[CallArguments], Iterator[Dict[str, np.ndarray]]]
_PROCESS_CALLER: List[ProcessCaller] = []
# A RemoteTriton process serves several instances (and route handlers) at once: each thread's own caller.
_THREAD_CALLER: contextvars.ContextVar[Optional[ProcessCaller]] = contextvars.ContextVar(
    "pytriton_process_caller", default=None
)


def set_process_caller(caller: Optional[ProcessCaller]) -> None:
    """Make this process's calls go to the server through `caller` (an instance process's host sets it; None: not)."""
    _PROCESS_CALLER[:] = [caller] if caller is not None else []


def use_caller_here(caller: Optional[ProcessCaller]) -> contextvars.Token[Optional[ProcessCaller]]:
    """Make the calls of this thread (or task) go through `caller`, whatever the process's is; reset with the token."""
    return _THREAD_CALLER.set(caller)


# An async route handler in a RemoteTriton's process awaits its calls on its own loop: each response's outputs.
AsyncProcessCaller = Callable[[CallArguments], AsyncIterator[Dict[str, np.ndarray]]]
_ASYNC_CALLER: contextvars.ContextVar[Optional[AsyncProcessCaller]] = contextvars.ContextVar(
    "pytriton_async_process_caller", default=None
)


def use_async_caller_here(caller: AsyncProcessCaller) -> contextvars.Token[Optional[AsyncProcessCaller]]:
    """Make the awaited calls (call_model_async, async for over stream_model) of this task go through `caller`."""
    return _ASYNC_CALLER.set(caller)


def async_process_caller() -> Optional[AsyncProcessCaller]:
    """The async caller of this task, if it is a RemoteTriton's async route handler."""
    return _ASYNC_CALLER.get()


def process_caller() -> Optional[ProcessCaller]:
    """The caller of this thread or task, else the one set in this process (an instance process's), if any."""
    caller = _THREAD_CALLER.get()
    if caller is not None:
        return caller
    return _PROCESS_CALLER[0] if _PROCESS_CALLER else None


_WAITERS = threading.local()


def thread_doorbell() -> Doorbell:
    """This thread's doorbell for waiting on inner calls (opened with its first call)."""
    doorbell: Optional[Doorbell] = getattr(_WAITERS, "doorbell", None)
    if doorbell is None:
        doorbell = _WAITERS.doorbell = Doorbell(blocking=True)
    return doorbell
