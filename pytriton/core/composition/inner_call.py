"""An inner call through its model's queue: its request built and checked, its responses gathered on the loop.

An inner call is a request like any client's: it joins the inner model's queue and batches with the others,
and the inner model's statistics count it. It starts on the engine's loop; a sync callable's thread waits on a
doorbell of its own (the loop is never blocked), an async one awaits it on the loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from pytriton.core.composition.path import CallArguments, CallPath, ModelCallError
from pytriton.core.doorbell import Doorbell
from pytriton.core.errors import InferenceError, Status
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.sinks import ResponseSink
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.datatypes import datatype_of_dtype


class CalledModel(Protocol):
    """What an inner call needs of a served model version (core/model.ServedModel)."""

    spec: ModelSpec

    def submit(self, request: InferenceRequest, sink: ResponseSink, streaming: bool) -> Optional[ResponseSink]:
        """Queue a request whose responses go to `sink`; the sink queued (None when the cache answered)."""

    @property
    def scheduler(self) -> Any:
        """The model's scheduler (`withdraw(sink)` takes a queued request out)."""


class InnerCall(ResponseSink):
    """One inner call's sink: responses (or the error) gathered on the loop, `wake()` called on each change."""

    __slots__ = (
        "_path",
        "_timer",
        "answered",
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
        # An ensemble step's (None: another caller's): whether its final response came (a single call's), which
        # wakes it then, before the call ends: as Triton's ensemble answers from its last step's response callback.
        self.answered: Optional[bool] = None
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
            elif self.answered is not None and response.final:
                self.answered = True
                self._let_go()  # answered: nothing is left to cancel, nor a deadline to keep
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

    def refuse(self, error: InferenceError) -> None:
        """Give up the call with `error`: what it answered cannot reach its caller."""
        self._give_up(error)

    def _give_up(self, error: InferenceError) -> None:
        if self.ended:
            return
        self.fail(error)  # first: the inner model's scheduler then sees this sink done
        if self.model is not None and self.queued is not None:
            self.model.scheduler.withdraw(self.queued)  # out of the queue; or its batch's own inner calls cancelled

    def _end(self) -> None:
        self.ended = True
        self._let_go()
        self.wake()

    def _let_go(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._path is not None:
            self._path.inner.discard(self)

    def start(self, path: CallPath, arguments: CallArguments, unsent: Optional[str] = None) -> None:
        """On the loop: queue the call; a refusal ends it at once with its error.

        `unsent`: why some of the caller's arguments could not reach this process (they did not pickle; stand-ins
        came in their place): the call is checked against the model all the same, then refused (INVALID_ARGUMENT).
        """
        self.streaming = arguments.streaming
        try:
            self._start(path, arguments, unsent)
        except InferenceError as error:
            outer = self.outer
            # An ensemble step's request that does not fit its model names the ensemble's request, as Triton's.
            self.fail(error.for_request(outer.id) if outer is not None and error.of_request else error)
        except Exception as error:  # noqa: BLE001 - a bad argument fails this call, never the loop
            self.fail(InferenceError.invalid(f"{type(error).__name__}: {error}"))

    def _start(self, path: CallPath, arguments: CallArguments, unsent: Optional[str]) -> None:
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
        if unsent is not None:
            raise InferenceError.invalid(unsent)
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


def outputs_of(response: InferenceResponse) -> Dict[str, np.ndarray]:
    """A response's outputs by name (the arrays themselves, not copies)."""
    return {output.name: output.array for output in response.outputs}


def build_request(
    spec: ModelSpec,
    inputs: Dict[str, Any],
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
) -> InferenceRequest:
    """An inner call's request, its inputs checked against the model as a client's are (Triton's messages).

    The checks' verdict is a function of the inputs' names, dtypes and shapes alone: one that passed is remembered
    by that signature (`spec.passed_inputs`), so that a model called again and again checks each kind of call once.
    """
    signature: Optional[Tuple[Any, ...]] = None
    if len(inputs) == 1:  # the commonest call, its signature made inline
        for name, value in inputs.items():
            if type(value) is np.ndarray:
                signature = (name, value.dtype, value.shape)
    else:
        signature = _signature(inputs)
    if signature is not None:
        try:
            batch_size = spec.passed_inputs.get(signature)
        except TypeError:  # a dtype numpy cannot hash (structured, with unhashable metadata): checked in full
            batch_size = signature = None
        if batch_size is not None:
            if requested_outputs is None:
                return InferenceRequest(
                    request_id="",
                    inputs=dict(inputs),
                    parameters={} if parameters is None else dict(parameters),
                    requested_outputs=None,
                    batch_size=batch_size,
                )
            return _request(dict(inputs), batch_size, spec, parameters, requested_outputs)
    if len(inputs) == 1 and len(spec.inputs) == 1:  # the commonest call: one input of a one-input model
        for name, value in inputs.items():
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            datatype = datatype_of_dtype(array.dtype)
            if datatype is None:
                raise _unsupported(spec, name, array)
            batch_size = spec.check_input(name, datatype, array.shape)
            _remember(spec, signature, batch_size)
            return _request({name: array}, batch_size, spec, parameters, requested_outputs)
    arrays: Dict[str, np.ndarray] = {}
    batch_sizes: List[int] = []
    if not spec.input_count_fits(len(inputs)):
        spec.check_input_count(list(inputs))
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        datatype = datatype_of_dtype(array.dtype)
        if datatype is None:
            raise _unsupported(spec, name, array)
        batch_sizes.append(spec.check_input(name, datatype, array.shape))
        arrays[name] = array
    batch_size = spec.check_input_set(list(arrays), batch_sizes)
    _remember(spec, signature, batch_size)
    return _request(arrays, batch_size, spec, parameters, requested_outputs)


# Signatures remembered per model; past that (a model called with ever new shapes) the memory starts over.
PASSED_LIMIT = 256


def _signature(inputs: Dict[str, Any]) -> Optional[Tuple[Any, ...]]:
    """The inputs' (name, dtype, shape) in order, flattened; None when one is not a numpy array."""
    signature: Tuple[Any, ...] = ()
    for name, value in inputs.items():
        if type(value) is not np.ndarray:
            return None
        signature += (name, value.dtype, value.shape)
    return signature


def _remember(spec: ModelSpec, signature: Optional[Tuple[Any, ...]], batch_size: int) -> None:
    """Remember that inputs of `signature` passed the checks (None: not numpy arrays only; not remembered)."""
    if signature is not None:
        passed = spec.passed_inputs
        if len(passed) >= PASSED_LIMIT:
            passed.clear()
        passed[signature] = batch_size  # hashable: its lookup did not fail


def _unsupported(spec: ModelSpec, name: str, array: np.ndarray) -> InferenceError:
    """The error of an input whose dtype has no Triton datatype."""
    return InferenceError.invalid(f"input '{name}' for model '{spec.name}' has unsupported dtype {array.dtype}")


def _request(
    arrays: Dict[str, np.ndarray],
    batch_size: int,
    spec: ModelSpec,
    parameters: Optional[Dict[str, Any]],
    requested_outputs: Optional[Sequence[str]],
) -> InferenceRequest:
    """The request of checked inputs; the outputs asked for checked too."""
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


_WAITERS = threading.local()


def thread_doorbell() -> Doorbell:
    """This thread's doorbell for waiting on inner calls (opened with its first call)."""
    doorbell: Optional[Doorbell] = getattr(_WAITERS, "doorbell", None)
    if doorbell is None:
        doorbell = _WAITERS.doorbell = Doorbell(blocking=True)
    return doorbell
