"""A served model version: spec, scheduler, statistics and response cache behind one facade."""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Deque, List, Optional

from pytriton.core.cache import ResponseCache, cache_key
from pytriton.core.errors import InferenceError
from pytriton.core.instances import Instance
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.scheduler import Scheduler, UnrecoverableHandler
from pytriton.core.sinks import FutureSink, StreamSink
from pytriton.core.spec import ModelSpec
from pytriton.core.stats import ModelStats

Disconnect = Callable[[], Awaitable[Any]]
# A request waiting longer than this for its response starts watching for its client's disconnect.
WATCH_AFTER_S = 0.1


class ModelState(enum.Enum):
    """Model states as the repository index reports them."""

    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class ServedModel:
    """One model version being served; lives on the engine's event loop."""

    def __init__(
        self,
        spec: ModelSpec,
        instances: List[Instance],
        cache: Optional[ResponseCache],
        on_unrecoverable: UnrecoverableHandler,
    ) -> None:
        """Wire a model's scheduler, statistics and cache."""
        self.spec = spec
        self.stats = ModelStats()
        self.state = ModelState.READY
        self.cache = cache if spec.response_cache and not spec.decoupled else None
        self.scheduler = Scheduler(spec, instances, self.stats, on_unrecoverable)
        self._watches = _DisconnectWatches()

    @property
    def ready(self) -> bool:
        """Whether the model takes requests."""
        return self.state is ModelState.READY

    def _check_ready(self) -> None:
        """Refuse requests unless the model is ready."""
        if self.state is not ModelState.READY:
            raise InferenceError.unavailable(f"Request for unknown model: '{self.spec.name}' is not ready")

    async def infer(self, request: InferenceRequest, gone: Optional[Disconnect] = None) -> InferenceResponse:
        """Run one request and return its single response (cache first, when enabled).

        `gone()` returns once the client has disconnected; it is awaited only while the request waits
        for a free instance or its response, and then cancels the request (CANCELLED).
        """
        self._check_ready()
        key = None
        if self.cache is not None:
            lookup_start = time.monotonic_ns()
            key = cache_key(self.spec.name, self.spec.version_str, request.inputs)
            cached = self.cache.get(key)
            lookup_ns = time.monotonic_ns() - lookup_start
            if cached is not None:
                self.stats.inference["cache_hit"].add(lookup_ns)
                self.stats.record_success(lookup_ns, 0)
                return cached
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        sink = FutureSink(future)
        run_now = self.scheduler.submit_inline(request, sink)
        if run_now is not None:
            try:
                await run_now
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    future.exception()  # the caller went away: nobody will read the error
                raise
        watch = None
        if gone is not None and not future.done():
            watch = self._watches.add(future, gone)
        try:
            response = await future
        except asyncio.CancelledError:
            self.scheduler.withdraw(sink)  # the caller left (gRPC cancel or deadline, HTTP disconnect): leave the queue
            if watch is not None and watch.client_gone:
                raise InferenceError.cancelled("the client disconnected before its response was ready") from None
            raise
        finally:
            if watch is not None:
                watch.stop()
        if key is not None and self.cache is not None:
            insert_start = time.monotonic_ns()
            self.cache.put(key, response)
            self.stats.inference["cache_miss"].add(time.monotonic_ns() - insert_start)
        return response

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Run one request and iterate over its responses (any model; decoupled ones may give 0..n)."""
        self._check_ready()
        sink = StreamSink(self.scheduler.withdraw)
        self.scheduler.submit(request, sink)
        return sink.responses()


class _DisconnectWatch:
    """Awaits `gone()` in a task once started; the request's future is cancelled when the client left."""

    __slots__ = ("client_gone", "due", "future", "gone", "task")

    def __init__(self, future: asyncio.Future[InferenceResponse], gone: Disconnect, due: float) -> None:
        """Watch on behalf of the request whose response `future` will hold, from loop time `due` on."""
        self.future: Optional[asyncio.Future[InferenceResponse]] = future
        self.gone: Optional[Disconnect] = gone
        self.due = due
        self.task: Optional[asyncio.Future[Any]] = None
        self.client_gone = False

    @property
    def waiting(self) -> bool:
        """Whether the request still waits for its response."""
        return self.future is not None and not self.future.done()

    def start(self) -> None:
        """Start watching."""
        assert self.gone is not None
        self.task = asyncio.ensure_future(self.gone())
        self.task.add_done_callback(self._on_gone)

    def _on_gone(self, task: asyncio.Future[Any]) -> None:
        """The client left (or the watcher failed, which counts the same): cancel the request."""
        if task.cancelled():
            return
        task.exception()  # read, so that a failed watcher is not reported as never retrieved
        if self.waiting:
            assert self.future is not None
            self.client_gone = True
            self.future.cancel()

    def stop(self) -> None:
        """Stop watching, and let go of the request (the watch may wait in the queue of watches a while)."""
        if self.task is not None:
            self.task.cancel()
        self.future = self.gone = None


class _DisconnectWatches:
    """A model's requests whose client may leave while they wait, oldest first.

    A timer per model, every WATCH_AFTER_S while requests wait, starts the watcher of each request
    still waiting at least WATCH_AFTER_S after it arrived; a request answered sooner costs a deque
    entry, not a timer or a task.
    """

    def __init__(self) -> None:
        """No request waits yet."""
        self._waiting: Deque[_DisconnectWatch] = deque()
        self._timer: Optional[asyncio.TimerHandle] = None

    def add(self, future: asyncio.Future[InferenceResponse], gone: Disconnect) -> _DisconnectWatch:
        """Watch a request from WATCH_AFTER_S on, unless its response comes first."""
        loop = asyncio.get_running_loop()
        watch = _DisconnectWatch(future, gone, loop.time() + WATCH_AFTER_S)
        self._waiting.append(watch)
        if self._timer is None:
            self._timer = loop.call_at(watch.due, self._sweep)
        return watch

    def _sweep(self) -> None:
        """Start the watchers that are due; forget requests already answered."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = self._waiting
        while waiting and (waiting[0].due <= now or not waiting[0].waiting):
            watch = waiting.popleft()
            if watch.waiting:
                watch.start()
        if waiting:
            self._timer = loop.call_later(WATCH_AFTER_S, self._sweep)
