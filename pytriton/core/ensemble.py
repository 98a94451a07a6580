"""An ensemble's scheduler: each request runs its steps as inner calls to the step models, as Triton's does.

A step starts once every ensemble tensor it reads is available, so independent steps run at once; each is a
request like a client's (core/composition.py), which joins its model's queue, batches with the model's other
requests and counts in its statistics. The ensemble has no queue and no instances of its own. Its statistics are
Triton's for an ensemble: per successful request one execution of the request's batch size, whose compute times
are the sums of its steps' compute times; a failed request counts twice, as in Triton. A step's error fails the
request: "in ensemble '<name>', " followed by the step model's message, with its status.

A step's request takes the ensemble request's id, priority, timeout and sequence (correlation) parameters, as
Triton's ensemble scheduler copies them into its steps' requests. A client that leaves (a gRPC cancel, an HTTP
client that disconnects once its request has waited WATCH_AFTER_S) fails the request CANCELLED, and its steps in
flight leave their models' queues or are cancelled where they run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Coroutine, Dict, List, Optional, Tuple

import numpy as np

from pytriton.core.composition import CallArguments, CallPath, InnerCall, Models, PathMaker, outputs_of
from pytriton.core.ensemble_graph import EnsembleGraph, EnsembleStepDef, StepModel, check_steps, check_structure
from pytriton.core.errors import FailureReason, InferenceError
from pytriton.core.request import InferenceRequest, InferenceResponse, OutputTensor
from pytriton.core.scheduler import Scheduler, UnrecoverableHandler
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
        if gone is not None:
            self._run_watch.watch(run, gone)
        run.start()
        return None

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
        self._runs.pop(run.sink, None)
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
        """Fail every request still running (UNAVAILABLE) now; return how many there were."""
        self._accepting = False
        runs = list(self._runs.values())
        for run in runs:
            run.fail(self._stopped())
        self._run_watch.stop()
        return len(runs)

    def resume(self) -> None:
        """Take requests again (a load after an unload)."""
        self._accepting = True


class EnsembleRun:
    """One request through an ensemble's steps, on the engine's loop."""

    __slots__ = (
        "again",
        "compute",
        "done",
        "enqueue_ns",
        "gone",
        "path",
        "pending",
        "request",
        "running",
        "scheduler",
        "sink",
        "started_ns",
        "starting",
        "tensors",
        "watcher",
    )

    def __init__(self, scheduler: EnsembleScheduler, request: InferenceRequest, sink: ResponseSink) -> None:
        """Prepare the run: the request's inputs are the first ensemble tensors."""
        self.scheduler = scheduler
        self.request = request
        self.sink = sink
        self.enqueue_ns = time.monotonic_ns()
        self.started_ns = 0
        self.tensors: Dict[str, np.ndarray] = dict(request.inputs)
        self.pending: List[int] = list(range(len(scheduler.graph.steps)))
        self.running: Dict[InnerCall, int] = {}
        self.compute = [0, 0, 0]
        self.done = False
        self.starting = False  # steps are being started (a step that ends meanwhile leaves the rest to that loop)
        self.again = False
        self.gone: Optional[Disconnect] = None  # returns once the client has disconnected
        self.watcher: Optional[asyncio.Future[Any]] = None  # awaits `gone()` once the run is open WATCH_AFTER_S
        deadline = self.enqueue_ns + request.timeout_us * 1000 if request.timeout_us else 0
        assert scheduler.models is not None
        self.path: CallPath = PathMaker(scheduler.models, scheduler.spec.name).path_of([request.origin], [deadline])

    def start(self) -> None:
        """Start the steps whose inputs are available (the request's inputs, at first)."""
        self.started_ns = time.monotonic_ns()
        self._start_ready()

    def _start_ready(self) -> None:
        """Start every step whose tensors are there; answer once none is left and none runs.

        A step may end while it starts (the response cache answered it, or its model refused it): its outputs
        are kept, and the loop here looks again rather than starting steps from inside the one starting.
        """
        if self.starting:
            self.again = True
            return
        graph = self.scheduler.graph
        given = self.request.inputs
        ensemble_inputs = self.scheduler.spec.input_by_name
        self.starting = True
        try:
            self.again = True
            while self.again and not self.done:
                self.again = False
                # An optional ensemble input the request left out is left out of the steps that read it.
                ready = [
                    index
                    for index in self.pending
                    if all(
                        t in self.tensors or (t in ensemble_inputs and t not in given)
                        for _, t in graph.steps[index].input_map
                    )
                ]
                for index in ready:
                    self.pending.remove(index)
                for index in ready:
                    if self.done:
                        return
                    self._start_step(index, graph.steps[index])
        finally:
            self.starting = False
        if self.done or self.running:
            return
        if self.pending:
            step = graph.steps[self.pending[0]]
            missing = [t for _, t in step.input_map if t not in self.tensors]
            self.fail(
                InferenceError.invalid(
                    f"in ensemble '{self.scheduler.spec.name}', step of model '{step.model_name}' cannot run: "
                    f"no step wrote ensemble tensor '{missing[0]}'"
                )
            )
        else:
            self._finish()

    def _start_step(self, index: int, step: EnsembleStepDef) -> None:
        inputs = {model_input: self.tensors[t] for model_input, t in step.input_map if t in self.tensors}
        version = None if step.model_version < 0 else str(step.model_version)
        call = InnerCall(lambda: self._step_ended(call))
        call.compute = self.compute
        call.outer = self.request
        self.running[call] = index
        requested = [model_output for model_output, _ in step.output_map]
        call.start(
            self.path, CallArguments(step.model_name, inputs, version, self.request.parameters, requested, None, False)
        )

    def _step_ended(self, call: InnerCall) -> None:
        index = self.running.pop(call, None)
        if index is None or self.done:
            return
        if call.error is not None:
            error = call.error
            self.fail(InferenceError(error.status, f"in ensemble '{self.scheduler.spec.name}', {error.message}"))
            return
        step = self.scheduler.graph.steps[index]
        outputs = outputs_of(call.items[-1]) if call.items else {}
        for model_output, tensor in step.output_map:
            array = outputs.get(model_output)
            if array is None:
                self.fail(
                    InferenceError.internal(
                        f"in ensemble '{self.scheduler.spec.name}', model '{step.model_name}' gave no output "
                        f"'{model_output}'"
                    )
                )
                return
            self.tensors[tensor] = array
        self._start_ready()

    def _finish(self) -> None:
        """Answer with the ensemble's outputs (those requested), and count the request as Triton does."""
        spec = self.scheduler.spec
        names = self.request.requested_outputs
        wanted = list(spec.output_names) if names is None else names
        outputs: List[OutputTensor] = []
        for name in wanted:
            array = self.tensors.get(name)
            if array is None:
                self.fail(InferenceError.internal(f"in ensemble '{spec.name}', no step wrote output '{name}'"))
                return
            outputs.append(OutputTensor(name, spec.output_by_name[name].datatype, array))
        self._end()
        stats = self.scheduler.stats
        batch_size = max(1, self.request.batch_size) if spec.batching else 1
        compute = (self.compute[0], self.compute[1], self.compute[2])
        stats.record_success(
            time.monotonic_ns() - self.enqueue_ns, self.started_ns - self.enqueue_ns, compute, batch_size
        )
        stats.record_execution(batch_size, *compute)
        self.sink.deliver(InferenceResponse(outputs))
        self.sink.finish()

    def fail(self, error: InferenceError) -> None:
        """End the request with `error`; its steps still running are cancelled."""
        if self.done:
            return
        self._end()
        # Counted twice, as Triton 2.51 counts a failed ensemble request: once as its error response is sent
        # (with its reason), once as the request is released (OTHER).
        stats = self.scheduler.stats
        total_ns = time.monotonic_ns() - self.enqueue_ns
        stats.record_failure(total_ns, error.reason.value)
        stats.record_failure(total_ns, FailureReason.OTHER.value)
        self.sink.fail(error)

    def _end(self) -> None:
        self.done = True
        self.path.close(f"the request to ensemble '{self.scheduler.spec.name}' has ended")
        self.tensors = {}
        if self.watcher is not None:
            self.watcher.cancel()
        self.scheduler.ended(self)


def check_ensemble(spec: ModelSpec, models: Models) -> None:
    """Check an ensemble against the models bound now, as Triton does when it loads one.

    Raises:
        ValueError: Triton's message (a step model that is not bound: this server's).
    """
    graph = spec.ensemble
    assert graph is not None
    check_structure(spec.name, graph, [t.name for t in spec.inputs], [t.name for t in spec.outputs])

    def model_of(step: EnsembleStepDef) -> StepModel:
        version = "" if step.model_version < 0 else str(step.model_version)
        if step.model_name == spec.name:
            raise ValueError(f"in ensemble {spec.name}, a step runs the ensemble itself: a cycle is refused")
        try:
            step_spec: ModelSpec = models.model(step.model_name, version).spec
        except InferenceError as error:
            raise ValueError(
                f"in ensemble {spec.name}, step model '{step.model_name}'"
                f"{'' if not version else ' version ' + version} is not available: {error.message}"
            ) from None
        return StepModel(
            step_spec.max_batch_size,
            [(t.name, t.datatype, t.dims, t.optional) for t in step_spec.inputs],
            [(t.name, t.datatype, t.dims) for t in step_spec.outputs],
            step_spec.decoupled,
        )

    check_steps(
        spec.name,
        spec.max_batch_size,
        [(t.name, t.datatype, t.dims) for t in spec.inputs],
        [(t.name, t.datatype, t.dims) for t in spec.outputs],
        graph,
        model_of,
    )


def steps_on(spec: ModelSpec, name: str) -> bool:
    """Whether an ensemble's spec has a step on model `name`."""
    return spec.ensemble is not None and any(step.model_name == name for step in spec.ensemble.steps)
