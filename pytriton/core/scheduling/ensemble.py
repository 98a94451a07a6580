"""An ensemble's scheduler: each request runs its steps as inner calls to the step models, as Triton's does.

A step starts once every ensemble tensor it reads is available, so independent steps run at once; each is a
request like a client's (core/composition/inner_call.py), which joins its model's queue, batches with the model's other
requests and counts in its statistics. The ensemble has no queue and no instances of its own. Its statistics are
Triton's for an ensemble: per successful request one execution of the request's batch size, whose compute times
are the sums of its steps' compute times; a failed request counts twice, as in Triton (once when steps still ran
as it failed). A step's error fails the request at once: "in ensemble '<name>', " followed by the step model's
message, with its status; as in Triton, the steps still running go on to their end (counted in their models'
statistics) and no further step starts. An output a step's model leaves out of its response holds nothing, as in
Triton: the ensemble answers without it, and a step that reads it gets a request without that input (which fails
as a client's would, unless the input is optional).

A decoupled step's responses each flow on through the steps after it (the ensemble is then decoupled, as Triton
makes it, and answers once per set of outputs). A step's request takes the ensemble request's id, priority, timeout
and sequence (correlation) parameters, as Triton's ensemble scheduler copies them into its steps' requests: the
timeout applies in each step model's queue (its queue policy), never to the run as a whole. The tensors a step
writes carry its request's sequence parameters (or those its response gives, as an ensemble step's does), and
the ensemble answers with those of its outputs. A client that leaves (a gRPC cancel, an HTTP
client that disconnects once its request has waited WATCH_AFTER_S) fails the request CANCELLED, and its steps in
flight leave their models' queues or are cancelled where they run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from typing import Any, Coroutine, Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from pytriton.core.composition.inner_call import InnerCall, outputs_of
from pytriton.core.composition.path import CallArguments, CallPath, Models, PathMaker
from pytriton.core.ensemble_graph import (
    EnsembleGraph,
    EnsembleStepDef,
    StepModel,
    check_steps,
    check_structure,
)
from pytriton.core.errors import FailureReason, InferenceError
from pytriton.core.request import InferenceRequest, InferenceResponse, OutputTensor, SequenceMark
from pytriton.core.request_spans import TracedSink
from pytriton.core.scheduling.scheduler import Scheduler, UnrecoverableHandler
from pytriton.core.sinks import ResponseSink
from pytriton.core.spec import ModelSpec
from pytriton.core.stats import ModelStats
from pytriton.core.watch import Disconnect, QueueWatch

_CLIENT_GONE = "the client disconnected before its response was ready"


class EnsembleScheduler(Scheduler):
    """Runs an ensemble's requests through its steps; a Scheduler with no instances and no queue."""

    def __init__(self, spec: ModelSpec, stats: ModelStats, on_unrecoverable: UnrecoverableHandler) -> None:
        """Create the scheduler of an ensemble's spec (its `ensemble` set)."""
        super().__init__(spec, [], stats, on_unrecoverable)
        assert spec.ensemble is not None
        self.graph: EnsembleGraph = spec.ensemble
        readers: Dict[str, List[int]] = {}
        for index, step in enumerate(self.graph.steps):
            for _, tensor in step.input_map:
                if index not in readers.setdefault(tensor, []):
                    readers[tensor].append(index)
        self.input_names = tuple(tensor.name for tensor in spec.inputs)
        # Per ensemble tensor: the steps that read it.
        self.readers: Dict[str, Tuple[int, ...]] = {tensor: tuple(steps) for tensor, steps in readers.items()}
        # The readers left once the steps an output set does not need are left out, by output set (`readers_for`).
        self._readers_for: Dict[Tuple[str, ...], Dict[str, Tuple[int, ...]]] = {}
        self._runs: Dict[ResponseSink, EnsembleRun] = {}
        # No queue: the runs' clients are watched as a model's running requests are.
        self._run_watch: QueueWatch[EnsembleRun] = QueueWatch((), self._runs.values, self._run_client_left)

    def submit_inline(
        self, request: InferenceRequest, sink: ResponseSink, gone: Optional[Disconnect] = None
    ) -> Optional[Coroutine[Any, Any, None]]:
        """Start a request's steps; its response goes to `sink` once the last one answered (never run inline).

        A request whose client leaves (`gone()` returns; watched once it has run WATCH_AFTER_S) is cancelled.
        """
        if not self._accepting:
            self.stats.record_failure(0, FailureReason.REJECTED.value)
            raise InferenceError.unavailable(f"model '{self.spec.name}' is not accepting requests")
        if self.models is None:
            raise InferenceError.unavailable(f"ensemble '{self.spec.name}' is not served by an engine")
        run = EnsembleRun(self, request, sink)
        self._runs[sink] = run
        spans = self.spans
        if spans is not None:
            origin = request.origin
            traced = spans.start(run.enqueue_ns, origin[2] if origin is not None else None, run)
            if traced is not None:  # its steps' requests are traced with it, as a traced callable's inner calls
                run.sink = TracedSink(sink, traced)
                run.path.span = traced.span if traced.span is not None else traced
        if gone is not None:
            self._run_watch.watch(run, gone)
        run.start()
        return None

    def wanted_of(self, request: InferenceRequest) -> Sequence[str]:
        """The ensemble outputs a request asks for (all of them when it names none)."""
        names = request.requested_outputs
        return self.spec.output_names if names is None else names

    def readers_for(self, wanted: Sequence[str]) -> Dict[str, Tuple[int, ...]]:
        """Per ensemble tensor, the steps that read it among those the `wanted` outputs need.

        As Triton's ensemble scheduler, a request runs only the steps its requested outputs need: a step whose
        outputs no needed step reads and no wanted output is runs not (nor counts in its model's statistics).
        """
        key = tuple(wanted)
        readers = self._readers_for.get(key)
        if readers is None:
            needed = _needed_steps(self.graph, wanted)
            readers = {}
            for tensor, steps in self.readers.items():
                kept = tuple(index for index in steps if index in needed)
                if kept:
                    readers[tensor] = kept
            if len(self._readers_for) < _KEPT_OUTPUT_SETS:  # clients choose the sets: a few are kept
                self._readers_for[key] = readers
        return readers

    def step_spec(self, step: EnsembleStepDef) -> Optional[ModelSpec]:
        """The spec of a step's model; None when it is unloaded meanwhile (the step's call fails in Triton's words)."""
        assert self.models is not None
        try:
            spec: ModelSpec = self.models.model(
                step.model_name, "" if step.model_version < 0 else str(step.model_version)
            ).spec
        except InferenceError:
            return None
        return spec

    def _run_client_left(self, run: EnsembleRun) -> None:
        """A run's client disconnected: its steps are cancelled."""
        run.fail(InferenceError.cancelled(_CLIENT_GONE))

    def withdraw(self, sink: ResponseSink) -> None:
        """The caller left: cancel its steps still running."""
        run = self._runs.get(sink)
        if run is not None:
            run.fail(InferenceError.cancelled(f"request to model '{self.spec.name}' was cancelled"))

    def ended(self, run: EnsembleRun) -> None:
        """A request's run has answered."""
        self._runs.pop(run.queued, None)
        self._update_idle()

    @property
    def _idle(self) -> bool:
        """Whether no request runs."""
        return not self._runs

    @property
    def has_live_instance(self) -> bool:
        """An ensemble has no instances: it takes requests whenever it is loaded."""
        return True

    @property
    def open_requests(self) -> Tuple[int, int]:
        """None waits in a queue; the requests running."""
        return 0, len(self._runs)

    def cut_off(self) -> int:
        """Fail every request still running (UNAVAILABLE) now; return how many there were.

        The steps a failed request left running are cancelled.
        """
        self._accepting = False
        runs = list(self._runs.values())
        failed = 0
        for run in runs:
            if run.answered and not run.done:
                continue  # answered: it ends with its steps, which their models end
            if run.done:
                run.release_steps()
            else:
                run.fail(self._stopped())
                failed += 1
        self._run_watch.stop()
        return failed

    def resume(self) -> None:
        """Take requests again (a load after an unload)."""
        self._accepting = True


_KEPT_OUTPUT_SETS = 64


def _needed_steps(graph: EnsembleGraph, wanted: Sequence[str]) -> Set[int]:
    """The steps that write the `wanted` tensors, and those that write what they read, transitively."""
    tensors = set(wanted)
    needed: Set[int] = set()
    grew = True
    while grew:
        grew = False
        for index, step in enumerate(graph.steps):
            if index not in needed and any(tensor in tensors for _, tensor in step.output_map):
                needed.add(index)
                tensors.update(tensor for _, tensor in step.input_map)
                grew = True
    return needed


class _Value:
    """One version of an ensemble tensor (Triton's iteration).

    Its array, the sequence mark of the step request that wrote it (None: the ensemble request's), and how many
    readers (steps, and the answer for a requested output) still have to take it.
    """

    __slots__ = ("array", "batch_size", "mark", "readers")

    def __init__(
        self, array: Optional[np.ndarray], batch_size: int, mark: Optional[SequenceMark], readers: int
    ) -> None:
        self.array = array  # None: an optional ensemble input the request left out
        # The batch size of the request that made it (0: a model without batching made it), as Triton keeps it to
        # convert the tensor for a model that batches otherwise (`_reshaped`).
        self.batch_size = batch_size
        self.mark = mark
        self.readers = readers


class EnsembleRun:
    """One request through an ensemble's steps, on the engine's loop.

    As Triton's ensemble scheduler, each ensemble tensor holds numbered versions: each response of the step that
    writes it adds the next one (a decoupled step's responses add several), and a step runs once for every number
    all the tensors it reads have. The ensemble answers once its requested outputs have a version of one number;
    the answer is final when no step runs any more (else the run ends later with an empty final response).
    """

    __slots__ = (
        "__weakref__",  # the client's watcher holds it weakly (watch.py)
        "answered",
        "batch_size",
        "batch_sizes",
        "busy",
        "compute",
        "done",
        "draining",
        "enqueue_ns",
        "gone",
        "path",
        "queued",
        "readers",
        "request",
        "responded",
        "running",
        "scheduler",
        "sink",
        "started_ns",
        "values",
        "versions",
        "watcher",
        "woken",
    )

    def __init__(self, scheduler: EnsembleScheduler, request: InferenceRequest, sink: ResponseSink) -> None:
        """Prepare the run: the request's inputs are the first ensemble tensors."""
        self.scheduler = scheduler
        self.request = request
        self.queued = sink  # the sink the request was submitted with: the run's key in the scheduler
        self.sink = sink  # where its answers go: `queued`, or a traced request's TracedSink around it
        self.readers = scheduler.readers_for(scheduler.wanted_of(request))  # the steps this request runs read
        self.enqueue_ns = time.monotonic_ns()
        self.started_ns = 0
        self.values: Dict[str, Dict[int, _Value]] = {}
        self.versions: Dict[str, int] = {}
        self.running: Dict[InnerCall, int] = {}
        self.batch_sizes: Dict[InnerCall, int] = {}  # per step's call: its request's batch size (0: no batching)
        self.batch_size = 0  # the request's, as the ensemble's tensors carry it (0: no batching; start sets it)
        self.woken: Deque[InnerCall] = deque()
        self.busy = False  # steps' responses are being taken (a step that ends meanwhile waits in `woken`)
        self.responded = False
        self.answered = False  # its final answer is out: it ends once its steps have ended
        self.compute = [0, 0, 0]
        self.done = False  # answered: its last response or its error is out
        self.draining = False  # answered with a step's error; the steps still running go on to their end
        self.gone: Optional[Disconnect] = None  # returns once the client has disconnected
        self.watcher: Optional[asyncio.Future[Any]] = None  # awaits `gone()` once the run is open WATCH_AFTER_S
        assert scheduler.models is not None
        # The request's timeout is no bound on the run: as in Triton, each step's request carries it into its
        # model's queue. Only a calling model's deadline (a request from another model) bounds the run.
        self.path: CallPath = PathMaker(scheduler.models, scheduler.spec.name).path_of([request.origin], [0])

    def start(self) -> None:
        """Start the steps that read only the request's inputs."""
        self.started_ns = time.monotonic_ns()
        given = self.request.inputs
        spec = self.scheduler.spec
        batch_size = self.request.batch_size if spec.batching and not _without_batch_dimension(spec, given) else 0
        self.batch_size = batch_size
        added: List[Tuple[str, int]] = []
        for tensor in self.scheduler.input_names:
            if tensor in self.readers:
                added.append((tensor, self._add(tensor, given.get(tensor), batch_size, None)))
        self.busy = True
        try:
            self._start_ready(added)
            self._drain()
        finally:
            self.busy = False
        self._settle()

    def _add(self, tensor: str, array: Optional[np.ndarray], batch_size: int, mark: Optional[SequenceMark]) -> int:
        """Keep the next version of `tensor` (made by a request of `batch_size`); return its number."""
        version = self.versions.get(tensor, 0)
        self.versions[tensor] = version + 1
        readers = len(self.readers.get(tensor, ())) + (tensor in self.scheduler.wanted_of(self.request))
        if readers:
            self.values.setdefault(tensor, {})[version] = _Value(array, batch_size, mark, readers)
        return version

    def _start_ready(self, added: List[Tuple[str, int]]) -> None:
        """Start each step that reads an added tensor and now has every tensor it reads at that version."""
        graph = self.scheduler.graph
        ready = sorted(
            {
                (index, version)
                for tensor, version in added
                for index in self.readers.get(tensor, ())
                if all(version in self.values.get(t, {}) for _, t in graph.steps[index].input_map)
            }
        )
        for index, version in ready:
            if self.done:
                return
            self._start_step(index, version)

    def _start_step(self, index: int, version: int) -> None:
        step = self.scheduler.graph.steps[index]
        step_spec = self.scheduler.step_spec(step)
        inputs: Dict[str, np.ndarray] = {}
        mark: Optional[SequenceMark] = None
        for model_input, tensor in step.input_map:
            versions = self.values[tensor]
            value = versions[version]
            if value.array is not None:
                declared = step_spec.input_by_name.get(model_input) if step_spec is not None else None
                inputs[model_input] = (
                    value.array
                    if declared is None or step_spec is None
                    else _reshaped(value.array, declared.dims, step_spec.batching, value.batch_size)
                )
            if mark is None:  # Triton keeps the first mark a step's tensors carry (it logs any other)
                mark = value.mark
            value.readers -= 1
            if not value.readers:
                del versions[version]
        model_version = None if step.model_version < 0 else str(step.model_version)
        call = InnerCall(lambda: self._woke(call))
        call.answered = False
        call.compute = self.compute
        call.outer = self.request if mark is None else _with_mark(self.request, mark)
        self.running[call] = index
        requested = [model_output for model_output, _ in step.output_map]
        streaming = step_spec is not None and step_spec.decoupled
        # As Triton records a step request's batch size with the tensors it writes: its inputs' first dimension.
        batching = step_spec is not None and step_spec.batching
        self.batch_sizes[call] = next((len(array) for array in inputs.values() if array.ndim), 0) if batching else 0
        call.start(
            self.path,
            CallArguments(step.model_name, inputs, model_version, self.request.parameters, requested, None, streaming),
        )

    def _woke(self, call: InnerCall) -> None:
        """A step answered or ended: take what it gave (a step started meanwhile is taken after)."""
        if self.done:
            if self.draining:
                self._drained(call)
            return
        self.woken.append(call)
        if self.busy:
            return
        self.busy = True
        try:
            self._drain()
        finally:
            self.busy = False
        self._settle()

    def _drain(self) -> None:
        while self.woken and not self.done:
            self._take(self.woken.popleft())

    def _take(self, call: InnerCall) -> None:
        """Take a step's new responses (or its error), and start the steps they make ready."""
        index = self.running.get(call)
        if index is None:
            return
        if call.error is not None:
            del self.running[call]
            # Triton's reason for a failed ensemble request is OTHER, whatever the step's.
            error = InferenceError(call.error.status, f"in ensemble '{self.scheduler.spec.name}', {call.error.message}")
            self.fail(error, drain=True)
            return
        if call.ended:
            del self.running[call]
        step = self.scheduler.graph.steps[index]
        outer = call.outer
        mark = outer.sequence if outer is not None else None
        while call.items and not self.done:
            response = call.items.popleft()
            outputs = outputs_of(response)
            written = _overridden(mark, response.parameters)
            added: List[Tuple[str, int]] = []
            batch_size = self.batch_sizes.get(call, 0)
            for model_output, tensor in step.output_map:  # one the step left out holds nothing (None)
                added.append((tensor, self._add(tensor, outputs.get(model_output), batch_size, written)))
            self._start_ready(added)
            if not self.done:
                self._answer_ready(added)

    def _answer_ready(self, added: List[Tuple[str, int]]) -> None:
        """Answer with the ensemble's requested outputs once they all have a version of an added number."""
        spec = self.scheduler.spec
        wanted = self.scheduler.wanted_of(self.request)
        versions = sorted({version for tensor, version in added if tensor in wanted})
        for version in versions:
            if not all(version in self.values.get(name, {}) for name in wanted):
                continue
            outputs: List[OutputTensor] = []
            mark: Optional[SequenceMark] = None
            for name in wanted:
                held = self.values[name]
                value = held[version]
                if value.array is not None:  # else a step left it out: so is it from the answer, as in Triton
                    declared = spec.output_by_name[name]
                    array = _reshaped(value.array, declared.dims, self.batch_size != 0, value.batch_size)
                    outputs.append(OutputTensor(name, declared.datatype, array))
                    mark = value.mark if value.mark is not None else mark
                value.readers -= 1
                if not value.readers:
                    del held[version]
            # Final once every step still running gave its final response: as in Triton, the answer goes before
            # the last step's request ends, and the ensemble's request ends after it (`_settle`).
            final = not self.woken and all(call.answered for call in self.running)
            self.responded = True
            # Triton's answer without outputs has no parameters either.
            parameters = _sequence_parameters(self.request, mark) if outputs else None
            self.sink.deliver(InferenceResponse(outputs, final, parameters))
            if final:
                self.answered = True
                if not self.running:
                    self._succeed()
                return

    def _settle(self) -> None:
        """Once no step runs and none is left to take, end the run (its last answer was not final)."""
        if self.done or self.running or self.woken:
            return
        if not self.responded and not self.scheduler.spec.decoupled:
            logged = f"[request id: {self.request.id}] " if self.request.id else ""
            self.fail(
                InferenceError.invalid(
                    f"in ensemble '{self.scheduler.spec.name}', {logged}unexpected deadlock, at least one output is "
                    "not set while no more ensemble steps can be made"
                )
            )
            return
        self._succeed()

    def _succeed(self) -> None:
        """End the request (its last response is out), counted as Triton counts it."""
        self._end()
        stats = self.scheduler.stats
        spec = self.scheduler.spec
        batch_size = max(1, self.request.batch_size) if spec.batching else 1
        compute = (self.compute[0], self.compute[1], self.compute[2])
        stats.record_success(
            time.monotonic_ns() - self.enqueue_ns, self.started_ns - self.enqueue_ns, compute, batch_size
        )
        stats.record_execution(batch_size, *compute)
        self.sink.finish()

    def fail(self, error: InferenceError, drain: bool = False) -> None:
        """End the request with `error`; its steps still running are cancelled, or with `drain` go on to their end.

        A step's error drains, as Triton's ensemble scheduler lets the steps in flight finish; a client that left,
        or a server that stops, cancels them.
        """
        if self.done or self.answered:  # answered: its steps' ends end it (they come with their final responses)
            return
        # Steps that ended but are not taken yet (in `woken`, cleared below) are not waited for, nor those that gave
        # their final response (Triton's count of steps in flight drops at a step's final response).
        self.running = {call: index for call, index in self.running.items() if not (call.ended or call.answered)}
        in_flight = bool(self.running)
        self.draining = drain and in_flight
        self._end()
        # Counted as Triton 2.51 counts a failed ensemble request: once as its error response is sent (with its
        # reason), and once more (OTHER) unless steps were still running then.
        stats = self.scheduler.stats
        total_ns = time.monotonic_ns() - self.enqueue_ns
        stats.record_failure(total_ns, error.reason.value)
        if not (drain and in_flight):
            stats.record_failure(total_ns, FailureReason.OTHER.value)
        self.sink.fail(error)

    def _drained(self, call: InnerCall) -> None:
        """A step still running after the request failed answered or ended: its responses are dropped."""
        call.items.clear()
        if call.ended:
            self.running.pop(call, None)
            if not self.running:
                self.release_steps()

    def release_steps(self) -> None:
        """The steps of a failed request have ended (or must end now: they are cancelled); the run is over."""
        self.draining = False
        self.running = {}
        self.path.close(f"the request to ensemble '{self.scheduler.spec.name}' has ended")
        self.scheduler.ended(self)

    def _end(self) -> None:
        self.done = True
        self.values = {}
        self.woken.clear()
        self.gone = None  # answered: a draining run's client is watched no more
        if self.watcher is not None:
            self.watcher.cancel()
        if not self.draining:
            self.release_steps()


def _without_batch_dimension(spec: ModelSpec, inputs: Dict[str, np.ndarray]) -> bool:
    """Whether a batching ensemble's request has no batch dimension: one of batch size 0 that 2.51 serves.

    Its inputs come in their shape past the batch dimension (ModelSpec.empty_batch_rows), and its batch size counts
    one. Triton's ensemble scheduler runs it as a request of batch size 0: a step that batches gets its tensors
    with a batch dimension of 1, and the answer loses that of a step's outputs (_reshaped).
    """
    for name, array in inputs.items():
        return array.ndim == len(spec.input_by_name[name].dims)
    return False


def _reshaped(array: np.ndarray, dims: Tuple[int, ...], batching: bool, batch_size: int) -> np.ndarray:
    """A tensor as Triton's ensemble scheduler hands it to a model (or answers it) that batches otherwise.

    Triton's ReshapeTensorDims: a tensor made without batching (`batch_size` 0) for a batching model gets a batch
    dimension of 1 when its shape is the model's `dims`; a tensor made by a batch of 1 for a model without
    batching loses its batch dimension when its shape is not the model's `dims`. Any other tensor goes as it is.
    """
    if batching == (batch_size != 0):
        return array
    if batching:
        return array.reshape((1, *array.shape)) if _dims_agree(dims, array.shape) else array
    if batch_size == 1 and array.ndim and not _dims_agree(dims, array.shape):
        return array.reshape(array.shape[1:])
    return array


def _dims_agree(dims: Tuple[int, ...], shape: Tuple[int, ...]) -> bool:
    """Triton's CompareDimsWithWildcard: the same rank, each dimension equal or -1 on either side."""
    return len(dims) == len(shape) and all(a == b or a == -1 or b == -1 for a, b in zip(dims, shape))


def _with_mark(request: InferenceRequest, mark: SequenceMark) -> InferenceRequest:
    """What a step's request takes of the ensemble's request (id, priority, timeout), with another sequence mark."""
    if mark == request.sequence:
        return request
    return InferenceRequest(
        request_id=request.id,
        inputs={},
        parameters={},
        requested_outputs=None,
        batch_size=0,
        priority=request.priority,
        timeout_us=request.timeout_us,
        sequence=mark,
    )


def _overridden(mark: Optional[SequenceMark], parameters: Optional[Dict[str, Any]]) -> Optional[SequenceMark]:
    """The mark a step's response writes its tensors with: its request's, or the sequence parameters it answered.

    As Triton's: a response that names any of `sequence_id`, `sequence_start`, `sequence_end` sets them (the flags
    it leaves out are false); the id it leaves out is its request's.
    """
    if not parameters or not any(key in parameters for key in _SEQUENCE_KEYS):
        return mark
    sequence_id = mark[0] if mark is not None else 0
    given = parameters.get("sequence_id", sequence_id)
    return (
        given if isinstance(given, (int, str)) and not isinstance(given, bool) else sequence_id,
        parameters.get("sequence_start") is True,
        parameters.get("sequence_end") is True,
    )


_SEQUENCE_KEYS = ("sequence_id", "sequence_start", "sequence_end")


def _sequence_parameters(request: InferenceRequest, mark: Optional[SequenceMark]) -> Dict[str, Any]:
    """An ensemble response's parameters: the sequence mark of the step requests that wrote its outputs.

    As Triton's, `sequence_id` takes the type of the ensemble request's id (a string, or else an integer).
    """
    sequence_id, start, end = mark if mark is not None else (request.sequence or (0, False, False))
    if request.sequence is not None and isinstance(request.sequence[0], str):
        sequence_id = str(sequence_id)
    elif isinstance(sequence_id, str):
        sequence_id = 0
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


def check_ensemble(spec: ModelSpec, models: Models) -> ModelSpec:
    """Check an ensemble against the models bound now, as Triton does when it loads one; return its spec resolved.

    The spec returned is decoupled when a step's model is (Triton sets the ensemble's transaction policy so).

    Raises:
        ValueError: Triton's message.
    """
    graph = spec.ensemble
    assert graph is not None
    check_structure(spec.name, graph, [t.name for t in spec.inputs], [t.name for t in spec.outputs])
    _check_dependencies(spec.name, graph, models)

    def model_of(step: EnsembleStepDef) -> StepModel:
        version = "" if step.model_version < 0 else str(step.model_version)
        step_spec: ModelSpec = models.model(step.model_name, version).spec
        return StepModel(
            step_spec.max_batch_size,
            [(t.name, t.datatype, t.dims, t.optional) for t in step_spec.inputs],
            [(t.name, t.datatype, t.dims) for t in step_spec.outputs],
            step_spec.decoupled,
        )

    decoupled = check_steps(
        spec.name,
        spec.max_batch_size,
        [(t.name, t.datatype, t.dims) for t in spec.inputs],
        [(t.name, t.datatype, t.dims) for t in spec.outputs],
        graph,
        model_of,
    )
    return spec if spec.decoupled == decoupled else dataclasses.replace(spec, decoupled=decoupled)


def _check_dependencies(name: str, graph: EnsembleGraph, models: Models) -> None:
    """Triton's checks of an ensemble's dependencies, in its order: every step model known, no cycle, each version.

    Raises:
        ValueError: Triton's message (its model repository's words for a model it cannot find).
    """
    for step in graph.steps:
        if step.model_name == name:
            continue
        try:
            models.model(step.model_name)
        except InferenceError:
            raise ValueError(
                f"ensemble {name} contains models that are not available or ambiguous: {step.model_name}"
            ) from None
    if any(step.model_name == name for step in graph.steps):
        raise ValueError(f"circular dependency between ensembles: {name} -> ... -> {name} -> {name}")
    for step in graph.steps:
        if step.model_version >= 0:
            try:
                models.model(step.model_name, str(step.model_version))
            except InferenceError:
                raise ValueError(
                    f"ensemble '{name}' depends on '{step.model_name}' whose required version {step.model_version} "
                    "is not loaded."
                ) from None


def steps_on(spec: ModelSpec, name: str) -> bool:
    """Whether an ensemble's spec has a step on model `name`."""
    return spec.ensemble is not None and any(step.model_name == name for step in spec.ensemble.steps)
