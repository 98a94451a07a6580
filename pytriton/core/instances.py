"""Model instances: one user callable each, called off the event loop in the right way for its kind."""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, List, Optional, Protocol, Tuple

from pytriton.core.composition.path import CURRENT, PathSource, run_in_path
from pytriton.core.custom_metrics import MODEL_SCOPE, end_model_scope, model_scope, stay_in_model_scope
from pytriton.core.doorbell import inbox_of
from pytriton.core.errors import CONTROL_FLOW, CallableRaised
from pytriton.core.sequences.states import SequenceStates
from pytriton.core.tensors.host_arrays import host_step
from pytriton.core.worker import WorkerThread
from pytriton.proxy.types import Request, mark_cancelled

# Steps of a sync generator its instance thread runs ahead of the loop taking them (_sync_generator_steps). With 4,
# each given back as taken, the OpenAI bench's 64-token streams lost 5-10 % of their tokens/s (2-core VM); with
# 64, a stream of 64 tokens never waits.
STEPS_AHEAD = 64

Step = Any  # what one call (or one generator step) returns: a list of response dicts


class StreamStop(threading.Event):
    """Set to end a decoupled batch's generator after its current step; `cut` says whether that ended it.

    Once the steps are over, `cut` True means the generator was closed at a step (it did not end by itself); False
    means it returned (or a plain callable answered), though the event may have been set meanwhile: a cancel that
    came after the generator's last step cost its client nothing (core/scheduling/scheduler.py counts it so).
    """

    def __init__(self) -> None:
        super().__init__()
        self.cut = False  # written by whoever runs the steps (the loop), read once they are over


class CallableKind(enum.Enum):
    """How a callable produces its results."""

    SYNC = "sync"
    ASYNC = "async"
    SYNC_GENERATOR = "sync generator"
    ASYNC_GENERATOR = "async generator"

    @property
    def streams(self) -> bool:
        """Whether the callable yields several steps."""
        return self in (CallableKind.SYNC_GENERATOR, CallableKind.ASYNC_GENERATOR)

    @property
    def uses_thread(self) -> bool:
        """Whether it runs in the instance's thread (sync kinds) rather than on the loop."""
        return self in (CallableKind.SYNC, CallableKind.SYNC_GENERATOR)


def callable_kind(fn: Callable[..., Any]) -> CallableKind:
    """Classify a function, bound method, callable object or wrapt-decorated callable."""
    target: Any = fn
    if not inspect.isfunction(target) and not inspect.ismethod(target) and callable(target):
        target = target.__call__
    if inspect.isasyncgenfunction(target):
        return CallableKind.ASYNC_GENERATOR
    if inspect.iscoroutinefunction(target):
        return CallableKind.ASYNC
    if inspect.isgeneratorfunction(target):
        return CallableKind.SYNC_GENERATOR
    return CallableKind.SYNC


class ModelInstance(Protocol):
    """What the scheduler needs of an instance, whether a thread of this process (Instance) or another process."""

    name: str
    call_started_ns: int  # when the call it runs started (0: idle); set by the scheduler
    reported_call_ns: int  # the call a hang warning was logged for
    # The state of the sequences whose slots it holds, when kept in this process (None: in the instance's own).
    sequence_states: Optional[SequenceStates]

    @property
    def kind(self) -> CallableKind:
        """How its callable produces results (a generator streams them)."""

    @property
    def alive(self) -> bool:
        """Whether it can take work (a process instance is not while its process restarts)."""

    @property
    def label(self) -> str:
        """How logs name it: its thread or its process."""

    def when_idle(self, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(*args)` once every call it was given has finished and it can take work."""

    def forget_sequences(self, serials: List[int]) -> None:
        """Drop the state of sequences that ended without their END request running on it."""

    def start(
        self, requests: List[Request], hand_over: bool = False, source: Optional[PathSource] = None
    ) -> Awaitable[Step]:
        """Start a non-streaming call; await its result. `source`: the batch's call path (core/composition/path.py)."""

    def steps(self, requests: List[Request], stop: StreamStop) -> AsyncIterator[Step]:
        """Each step of any callable; setting `stop` ends a generator after its current step (`stop.cut` then)."""

    def cancel(self, request: Request) -> None:
        """A request of the call it runs was cancelled: the callable's `request.is_cancelled()` says so."""

    async def close(self, deadline: Optional[float] = None) -> None:
        """Stop taking work; end whatever runs it (a thread after its call, a process at once if busy).

        `deadline` (time.monotonic()) is when a process told to exit is killed if it has not; a thread ignores it.
        """


class Instance:
    """One instance of a model: its callable and, for sync kinds, the one thread that runs it."""

    def __init__(
        self, fn: Callable[..., Any], name: str, model: Tuple[str, str] = ("", ""), count_strings: bool = False
    ) -> None:
        """Wrap a user callable; `name` names its thread; `model` (name, version) is what its custom metrics say.

        `count_strings`: the model answers BYTES outputs, whose long ones' bytes its thread counts (counted_strings.py).
        """
        self.fn = fn
        self.count_strings = count_strings
        self.name = name
        self.model = model
        self.kind = callable_kind(fn)
        # The thread runs this instance's calls only: it is in the model's scope (its custom metrics) for good.
        self._worker = WorkerThread(name, functools.partial(stay_in_model_scope, model))
        if self.kind.uses_thread:
            self._worker.open()  # now: out of file descriptors, binding fails and not the first request
        self.call_started_ns = 0  # when the call it is running started (0: idle); set by the scheduler
        self.reported_call_ns = 0  # the call a hang warning was logged for
        self.sequence_states: Optional[SequenceStates] = SequenceStates()

    @property
    def alive(self) -> bool:
        """A thread instance can always take work."""
        return True

    @property
    def label(self) -> str:
        """How logs name it."""
        return f"thread {self.name}"

    def forget_sequences(self, serials: List[int]) -> None:
        """Drop the state of sequences that ended without their END request running here."""
        if self.sequence_states is not None:
            self.sequence_states.forget(serials)

    def when_idle(self, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(*args)` once the instance thread finished every call, also those nobody waits for now."""
        self._worker.when_idle(callback, *args)

    def start(
        self, requests: List[Request], hand_over: bool = False, source: Optional[PathSource] = None
    ) -> Awaitable[Step]:
        """Start a non-streaming call now; await the result (`hand_over`: see WorkerThread.submit).

        A sync callable starts in the instance thread before this returns; an async one runs when awaited.
        Either runs with `source` (the batch's call path, core/composition/path.py) as its current one.
        """
        if self.kind is CallableKind.ASYNC:
            return _scoped_async_call(self.fn, requests, self.model, source)
        return self._worker.submit(_thread_call, self.fn, requests, source, self.count_strings, hand_over=hand_over)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` in the instance's thread (its scheduler's own jobs); the future settles on the loop."""
        return self._worker.submit(fn, *args)

    def cancel(self, request: Request) -> None:
        """A request of the running call was cancelled: the callable sees it at its next `is_cancelled()`."""
        mark_cancelled(request)

    async def steps(self, requests: List[Request], stop: StreamStop) -> AsyncIterator[Step]:
        """Yield each step of any callable; a plain callable yields once. Setting `stop` ends a generator (`cut`)."""
        if self.kind is CallableKind.ASYNC_GENERATOR:
            scope = model_scope(*self.model)  # this batch's own task: the generator runs in its context
            generator = self.fn(requests)
            try:
                async for step in generator:
                    yield step
                    if stop.is_set():
                        stop.cut = True
                        break
            except asyncio.CancelledError as error:
                if _not_cancelled():
                    raise CallableRaised(error) from None
                raise
            finally:
                await generator.aclose()
                end_model_scope(scope)
        elif self.kind is CallableKind.SYNC_GENERATOR:
            async for step in self._sync_generator_steps(requests, stop):
                yield step
        else:
            yield await self.start(requests)

    async def _sync_generator_steps(self, requests: List[Request], stop: StreamStop) -> AsyncIterator[Step]:
        """Iterate a sync generator in the instance thread, handing each step to the loop."""
        inbox = inbox_of(asyncio.get_running_loop())
        queue: asyncio.Queue[Tuple[str, Any]] = asyncio.Queue()
        path = CURRENT.get()
        # Steps handed over that the loop has not taken yet: the thread waits at STEPS_AHEAD, so a batch whose
        # consumers fell behind (the scheduler then takes no step) holds its generator, not a growing queue.
        gate = _StepGate()

        def produce() -> None:
            stay_in_model_scope(self.model)
            try:
                generator = self.fn(requests)
                cut = False  # closed at a step, not ended by itself
                try:
                    for step in generator:
                        inbox.post(queue.put_nowait, ("step", host_step(step, self.count_strings)))
                        gate.posted += 1
                        if gate.posted - gate.taken >= STEPS_AHEAD:
                            gate.wait(stop)
                        if stop.is_set():
                            cut = True
                            break
                finally:
                    generator.close()
                inbox.post(queue.put_nowait, ("end", cut))
            except BaseException as error:  # noqa: BLE001 - handed to the loop and raised there
                inbox.post(
                    queue.put_nowait, ("error", CallableRaised(error) if isinstance(error, CONTROL_FLOW) else error)
                )

        self._worker.submit(run_in_path, path, produce)
        try:
            while True:
                kind, value = await queue.get()
                if kind == "end":
                    stop.cut = value
                    return
                if kind == "error":
                    try:
                        raise value
                    finally:
                        # The error's traceback holds this frame: not the error too. That reference cycle kept the
                        # frames it passed (the batch's requests and their inputs) until a full collection.
                        value = None
                gate.taken += 1
                if gate.waiting and gate.posted - gate.taken <= STEPS_AHEAD // 2:
                    gate.open.set()
                yield value
        finally:
            stop.set()  # whoever stopped taking steps: the thread, waiting or not, ends after its step
            gate.open.set()

    async def close(self, deadline: Optional[float] = None) -> None:
        """Let the worker thread end after any call still running in it (a daemon: it never holds the exit)."""
        self._worker.close()


def call_in_scope(
    fn: Callable[..., Any], requests: List[Request], model: Tuple[str, str], source: Optional[PathSource]
) -> Any:
    """Call `fn(requests)` as model `model` with `source` as its call path (in a context of its own, Context.run).

    A direct inner call runs its model's callable so on its caller's thread (core/scheduling/direct_runs.run_here), in a
    copy of the caller's context: the callable sees the caller's context variables, and what it sets stays in the copy,
    dropped after (undoing the two sets would cost about half as much again).
    """
    MODEL_SCOPE.set(model)
    CURRENT.set(source)
    try:
        return fn(requests)
    except CONTROL_FLOW as error:
        raise CallableRaised(error) from None


def _thread_call(
    fn: Callable[..., Any], requests: List[Request], source: Optional[PathSource], count_strings: bool
) -> Any:
    """Call a sync callable in its instance thread (in its model's scope already) with `source` as its call path.

    `count_strings`: count its long BYTES outputs' bytes here, not on the loop (host_step).
    """
    try:
        if source is None:
            return host_step(fn(requests), count_strings)
        CURRENT.set(source)
        try:
            return host_step(fn(requests), count_strings)
        finally:
            CURRENT.set(None)  # not the batch's requests held until the next call
    except CONTROL_FLOW as error:
        raise CallableRaised(error) from None


async def _scoped_async_call(
    fn: Callable[..., Any], requests: List[Request], model: Tuple[str, str], source: Optional[PathSource]
) -> Any:
    """Await an async callable as model `model` with `source` as its call path, in the batch's task.

    The scope and the path end with the call. The coroutine may end in another context than it began in: a
    call whose client cancelled goes on in a task of its own (core/scheduling/async_call.py), and one closed at the
    server's stop ends wherever it is closed. That context's values are left as they are; the one it began in
    belongs to a task that has been cancelled.
    """
    scope = model_scope(*model)
    path = CURRENT.set(source)
    try:
        return await fn(requests)
    except asyncio.CancelledError as error:
        if _not_cancelled():
            raise CallableRaised(error) from None
        raise
    finally:
        end_model_scope(scope)
        try:
            CURRENT.reset(path)
        except ValueError:
            pass


def _not_cancelled() -> bool:
    """Whether no cancel of the running task is under way: a CancelledError passing now is one a callable raised.

    Tasks count the cancels asked of them from Python 3.11 (`Task.cancelling`); before, every CancelledError
    is taken as the task's own cancel.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is not None and not cancelling()


class _StepGate:
    """Where a sync generator's thread waits while the loop has STEPS_AHEAD of its steps to take.

    Two counters, each written by one thread (the GIL keeps each write whole), and an event set only for a
    thread that waits, once the loop took half of them: no lock per step (a threading.Semaphore takes a lock and
    a Condition per step), one wake-up per STEPS_AHEAD / 2 steps.
    """

    __slots__ = ("open", "posted", "taken", "waiting")

    def __init__(self) -> None:
        self.posted = 0  # written by the instance thread
        self.taken = 0  # written by the loop
        self.waiting = False
        self.open = threading.Event()

    def wait(self, stop: StreamStop) -> None:
        """In the instance thread: wait until the loop took half of what waits, or the steps are to stop."""
        self.open.clear()
        self.waiting = True  # after the clear: a set from now on is for this wait
        while self.posted - self.taken > STEPS_AHEAD // 2 and not stop.is_set():
            self.open.wait()
            self.open.clear()
        self.waiting = False
