"""A served model version: spec, scheduler, statistics and response cache behind one facade."""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Any, AsyncIterator, Awaitable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from pytriton.core.cache import ResponseCache, cache_key
from pytriton.core.errors import InferenceError
from pytriton.core.instances import ModelInstance
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.request_spans import TracedCall
from pytriton.core.scheduling.ensemble import EnsembleScheduler
from pytriton.core.scheduling.scheduler import Scheduler, UnrecoverableHandler
from pytriton.core.sinks import FutureSink, ResponseSink, StreamSink
from pytriton.core.spec import ModelSpec
from pytriton.core.stats import ModelStats
from pytriton.core.watch import Disconnect


class ModelState(enum.Enum):
    """Model states as the repository index reports them."""

    LOADING = "LOADING"  # warming up
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class RepositoryEntry(NamedTuple):
    """One model version in the repository index."""

    name: str
    version: str
    state: str
    ready: bool
    reason: str


class ServedModel:
    """One model version being served; lives on the engine's event loop."""

    def __init__(
        self,
        spec: ModelSpec,
        instances: List[ModelInstance],
        cache: Optional[ResponseCache],
        on_unrecoverable: UnrecoverableHandler,
    ) -> None:
        """Wire a model's scheduler, statistics and cache."""
        self.spec = spec
        self.stats = ModelStats()
        self.state = ModelState.READY
        self.cache = cache if spec.response_cache and not spec.decoupled else None
        if spec.ensemble is not None:
            self.scheduler: Scheduler = EnsembleScheduler(spec, self.stats, on_unrecoverable)
        else:
            self.scheduler = Scheduler(spec, instances, self.stats, on_unrecoverable)
        # The binding that replaced this one (a load with a config override): a request that found this one
        # before the swap goes there; those queued or running here finish here.
        self.successor: Optional[ServedModel] = None
        # UNLOADING, but the runs under way of the ensembles on it still call it (core/engine.Engine.unload):
        # only they find it (Engine.step_model), everyone else is refused before they reach it.
        self.ensemble_runs_only = False

    @property
    def out_of_date(self) -> bool:
        """Whether it was unloaded or replaced (by a load) since a request found it."""
        return self.state is not ModelState.READY

    @property
    def ready(self) -> bool:
        """Whether the model takes requests: loaded, and some instance up (processes may be restarting)."""
        return self.state is ModelState.READY and self.scheduler.has_live_instance

    def admit(self, request: InferenceRequest) -> InferenceRequest:
        """A request checked against an earlier binding's spec, checked against this one's batch size limit.

        Only the batching limits may differ between the two: the inputs and outputs are the same.
        """
        spec = self.spec
        if spec.batching and request.batch_size > spec.max_batch_size:
            raise InferenceError.invalid_input(
                f"inference request batch-size must be <= {spec.max_batch_size} for '{spec.name}'"
            )
        return request

    def retire(self, successor: ServedModel) -> None:
        """Hand new requests to `successor` from now on; those queued or running here finish here."""
        self.successor = successor
        self.state = ModelState.UNLOADING

    def _check_ready(self) -> None:
        """Refuse requests unless the model is ready."""
        if self.state is not ModelState.READY:
            raise InferenceError.unavailable(f"Request for unknown model: '{self.spec.name}' is not ready")

    async def infer(self, request: InferenceRequest, gone: Optional[Disconnect] = None) -> InferenceResponse:
        """Run one request and return its single response (cache first, when enabled).

        `gone()` returns once the client has disconnected; it is awaited only while the request waits in
        the queue, and then takes the request out of it (CANCELLED).
        """
        if self.state is not ModelState.READY:
            if self.successor is not None:
                return await self.successor.infer(self.successor.admit(request), gone)
            self._check_ready()
        key = None
        lookup_ns = 0
        if self.cache is not None:
            key, cached, lookup_ns = self._look_up(request)
            if cached is not None:
                response, traced = self._traced_hit(request, cached, lookup_ns)
                if traced is not None:
                    traced.finish(None)  # the transport that awaits the response claims its record first
                return response
        future: asyncio.Future[InferenceResponse] = self.scheduler.loop.create_future()
        sink = FutureSink(future)
        run_now = self.scheduler.submit_inline(request, sink, gone)
        if run_now is not None:
            try:
                await run_now
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    future.exception()  # the caller went away: nobody will read the error
                raise
        try:
            response = await future
        except asyncio.CancelledError:
            self.scheduler.withdraw(sink)  # the caller left (gRPC cancel or deadline): leave the queue
            raise
        except BaseException:
            # The future holds the error, whose traceback holds this frame: without the future and its sink here,
            # that is no reference cycle, so the caller's frames it holds (a request's inputs, its body) go with
            # the error rather than at the cycle collector's next full pass (a client that left while its request
            # of 16 MiB waited held it until then).
            del future, sink
            raise
        if key is not None:
            self.remember(key, response, lookup_ns)
        return response

    def _look_up(self, request: InferenceRequest) -> Tuple[bytes, Optional[InferenceResponse], int]:
        """The request's cache key, its response when the cache has it (counted as a hit), and the lookup's ns."""
        assert self.cache is not None
        lookup_start = time.monotonic_ns()
        key = cache_key(self.spec.name, self.spec.version_str, request.inputs, self._outputs_asked(request))
        cached = self.cache.get(key)
        lookup_ns = time.monotonic_ns() - lookup_start
        if cached is not None:
            self.stats.record_cache_hit(lookup_ns)  # Triton counts no inference for a cache hit
        return key, cached, lookup_ns

    def _traced_hit(
        self, request: InferenceRequest, cached: InferenceResponse, lookup_ns: int
    ) -> Tuple[InferenceResponse, Optional[TracedCall]]:
        """A cached response for `request`, through its trace when the request is sampled (and that trace).

        tritonserver samples a request the cache answers, and counts it against `trace_count`: its record has
        REQUEST_START, QUEUE_START, its tensors, INFER_RESPONSE_COMPLETE and REQUEST_END, and no compute.
        """
        spans = self.scheduler.spans
        if spans is None:
            return cached, None
        origin = request.origin
        arrived_ns = time.monotonic_ns() - lookup_ns  # about when the lookup began
        traced = spans.start(arrived_ns, origin[2] if origin is not None else None, _CacheHit(request, arrived_ns))
        if traced is None:
            return cached, None
        return traced.responded(cached), traced

    def _outputs_asked(self, request: InferenceRequest) -> Optional[List[str]]:
        """The outputs a request's response carries, for its cache key: None for every declared one.

        A response carries them in the callable's order whatever order the request named them in (core/outputs.py),
        so a request naming every output, in any order, shares the entry of one naming none.
        """
        requested = request.requested_outputs
        if requested is None:
            return None
        names = set(requested)
        return None if names >= self.spec.output_by_name.keys() else sorted(names)

    def remember(self, key: bytes, response: InferenceResponse, lookup_ns: int) -> None:
        """Put a missed request's response into the cache, counted as Triton's DelegateResponse counts it.

        A cache miss, lasting the lookup and the insertion, unless an answer to the same inputs was put in
        meanwhile (requests alike that missed together): tritonserver's insert then finds the key there and
        counts neither a miss nor a hit.
        """
        if self.cache is not None:
            insert_start = time.monotonic_ns()
            if self.cache.put(key, response, self.spec.name):
                self.stats.record_cache_miss(lookup_ns + time.monotonic_ns() - insert_start)

    def submit(self, request: InferenceRequest, sink: ResponseSink, streaming: bool) -> Optional[ResponseSink]:
        """Queue a request whose responses go to `sink` (a frontend process's, on the hub); the cache answers first.

        As `infer` (`streaming` False) or `stream` would run it, without a task of the caller's to await it.
        Returns the sink queued (`sink`, or one that fills the cache on the way), which `scheduler.withdraw`
        takes; None when the cache answered (a stream's caller then ends it: its only response is there).
        """
        if self.state is not ModelState.READY and not self.ensemble_runs_only:
            if self.successor is not None:
                return self.successor.submit(self.successor.admit(request), sink, streaming)
            self._check_ready()
        if self.cache is not None:
            key, cached, lookup_ns = self._look_up(request)
            if cached is not None:
                response, traced = self._traced_hit(request, cached, lookup_ns)
                sink.deliver(response)
                if traced is not None:
                    traced.finish(None)
                return None
            sink = _CachingSink(sink, self, key, lookup_ns)
        self.scheduler.submit(request, sink)
        return sink

    def run_here(
        self,
        caller: Any,
        inputs: Dict[str, Any],
        parameters: Dict[str, Any],
        requested: Optional[List[str]],
        batch_size: int,
    ) -> Optional[Dict[str, Any]]:
        """Run an inner call on its caller's thread if the model is idle (Scheduler.run_here); else None. Any thread.

        The call's request is given as its checked parts (core/composition/direct.py). Returns its outputs by name.
        """
        if self.state is not ModelState.READY or self.cache is not None:
            return None
        outputs: Optional[Dict[str, Any]] = self.scheduler.run_here(caller, inputs, parameters, requested, batch_size)
        return outputs

    def may_await_here(self) -> bool:
        """Whether a sync caller's call may be awaited on the loop now (Scheduler.may_await_here): a hint."""
        return self.state is ModelState.READY and self.cache is None and bool(self.scheduler.may_await_here())

    def await_here(self, request: InferenceRequest, caller: Any, answer: Any) -> bool:
        """On the loop: await a sync caller's call to this idle async model now (Scheduler.await_here); else False."""
        if self.state is not ModelState.READY or self.cache is not None:
            return False
        return bool(self.scheduler.await_here(request, caller, answer))

    def await_inline(self, request: InferenceRequest, caller: Any) -> Optional[Awaitable[Dict[str, Any]]]:
        """On the loop: an async caller's call to this idle async model, to await in its task (Scheduler.await_inline).

        None when the model cannot take it so now.
        """
        if self.state is not ModelState.READY or self.cache is not None:
            return None
        inline: Optional[Awaitable[Dict[str, Any]]] = self.scheduler.await_inline(request, caller)
        return inline

    def start_here(
        self,
        caller: Any,
        inputs: Dict[str, Any],
        parameters: Dict[str, Any],
        requested: Optional[List[str]],
        batch_size: int,
    ) -> Optional[Tuple[Any, Any]]:
        """On the loop: run an inner call in an idle instance's thread (Scheduler.start_here); else None.

        The call's request is given as `run_here` takes it.
        """
        if self.state is not ModelState.READY or self.cache is not None:
            return None
        started: Optional[Tuple[Any, Any]] = self.scheduler.start_here(
            caller, inputs, parameters, requested, batch_size
        )
        return started

    def record_tokens(
        self, first_token_ns: int, gaps_ns: Sequence[int], output_tokens: int, prompt_tokens: int
    ) -> None:
        """Count one generation of the OpenAI API (core/stats.TokenStats)."""
        self.stats.tokens.record(first_token_ns, gaps_ns, output_tokens, prompt_tokens)

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Run one request and iterate over its responses (any model; decoupled ones may give 0..n)."""
        if self.state is not ModelState.READY and self.successor is not None:
            return self.successor.stream(self.successor.admit(request))
        self._check_ready()
        if self.cache is None:
            sink = StreamSink(self.scheduler.withdraw)
            self.scheduler.submit(request, sink)
            return sink.responses()
        # A model with the response cache is never decoupled: as tritonserver's, a stream's request is looked
        # up and its response cached as a plain request's.
        queued: List[ResponseSink] = []
        stream = StreamSink(lambda _: self.scheduler.withdraw(queued[0]) if queued else None)
        taken = self.submit(request, stream, streaming=True)
        if taken is None:
            stream.finish()
        else:
            queued.append(taken)
        return stream.responses()


class _CacheHit:
    """What a trace reads of a request the cache answered (as of a queue entry): it never waited, nor computed."""

    __slots__ = ("enqueue_ns", "request")

    queue_ns = 0
    compute_ns = None  # a trace file's record then has no compute timestamps

    def __init__(self, request: InferenceRequest, enqueue_ns: int) -> None:
        self.request = request
        self.enqueue_ns = enqueue_ns


class _CachingSink(ResponseSink):
    """Puts a request's response into the model's cache on its way to the sink that waits for it."""

    __slots__ = ("_key", "_lookup_ns", "_model", "_sink")

    def __init__(self, sink: ResponseSink, model: ServedModel, key: bytes, lookup_ns: int) -> None:
        self._sink = sink
        self._model = model
        self._key = key
        self._lookup_ns = lookup_ns

    def done(self) -> bool:
        """Whether the sink it feeds is done."""
        return self._sink.done()

    def deliver(self, response: InferenceResponse) -> None:
        """Cache the response, then hand it over."""
        self._model.remember(self._key, response, self._lookup_ns)
        self._sink.deliver(response)

    def fail(self, error: InferenceError) -> None:
        """End the request with an error."""
        self._sink.fail(error)

    def finish(self) -> None:
        """End the request."""
        self._sink.finish()

    def has_room(self) -> bool:
        """Whether the sink it feeds has room."""
        return self._sink.has_room()

    async def room(self) -> None:
        """Wait for the sink it feeds to have room."""
        await self._sink.room()

    def overrun(self) -> bool:
        """Whether the sink it feeds is overrun."""
        return self._sink.overrun()
