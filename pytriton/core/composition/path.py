"""The call path of a running batch (or a custom route's request), which bounds the inner calls its callable makes.

The call path travels with each request: a batch's `CallPath` names the models on its way (a call to one of
them again is a cycle and is refused), the earliest deadline of its requests (which bounds its inner calls),
and the inner calls in flight (cancelled when the batch ends or is cancelled). The scheduler hands the
instance a `PathSource` with each batch (core/scheduling/running.RunningBatch), which the instance makes `CURRENT` in
the thread or coroutine that runs the callable; the `CallPath` itself is made from it only when the callable calls a
model. Most batches never do: making one for each cost about 2 us of the server's CPU per request (the
loop, its inbox, the requests' origins and deadlines looked up, a registry entry), 2 % of a small request's.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Protocol, Sequence, Set, Tuple

from pytriton.core.doorbell import QUIET_CALLS, LoopInbox, inbox_of
from pytriton.core.errors import InferenceError

# The models on a request's way in, the monotonic time it must be answered by (0: none), and the span its caller's
# request runs under when traced (its spans nest under it), else None.
Origin = Tuple[Tuple[str, ...], int, Any]


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

    __slots__ = ("after_answer", "cancelled", "chain", "deadline_ns", "inbox", "inner", "loop", "models", "span")

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
        # A batch's path (None for others): what the loop does once the batch is answered (RunningBatch.end).
        self.after_answer: Optional[Deque[Tuple[Callable[..., Any], Tuple[Any, ...]]]] = None

    def call_path(self) -> CallPath:
        """Itself (a CallPath is its own PathSource)."""
        return self

    def later(self, fn: Callable[..., Any], *args: Any) -> None:
        """From the callable's thread: call `fn(*args)` on the loop after the batch's answers, off their way.

        A direct inner call's statistics wait there (core/scheduling/direct_runs.py). A batch that ended already (its
        callable's thread outlived it), or one whose calls left QUIET_CALLS waiting, has them run at once.
        """
        after = self.after_answer
        if after is None:
            self.inbox.post_quietly(self.loop.call_soon, fn, *args)
            return
        after.append((fn, args))
        # A batch that may have ended before the append, or a long call's many inner calls: run what waits now.
        if self.cancelled or len(after) == QUIET_CALLS:
            self.inbox.post(self.answered)

    def answered(self) -> None:
        """On the loop: the batch is answered; run what waited for it (RunningBatch.end, soon after)."""
        after = self.after_answer
        while after:
            fn, args = after.popleft()
            try:
                fn(*args)
            except Exception as error:  # noqa: BLE001 - reported as a failed callback; the others still run
                self.loop.call_exception_handler({"message": f"exception in {fn!r}", "exception": error})

    def close(self, reason: str) -> None:
        """On the loop: the batch ended or was cancelled; cancel its inner calls still in flight and refuse new ones."""
        self.cancelled = True
        for call in list(self.inner):
            call.cancel(reason)


class PathSource(Protocol):
    """What `CURRENT` holds: a call path, or what makes one when the callable first calls a model.

    One that makes it keeps it in its `path` attribute (None until made), which call_model reads without a call.
    """

    def call_path(self) -> CallPath:
        """The call path (made on the first call; from any thread)."""


CURRENT: contextvars.ContextVar[Optional[PathSource]] = contextvars.ContextVar("pytriton_call_path", default=None)


class PathMaker:
    """What the call paths of one model's batches share: the engine's models, the model's name, the loop."""

    __slots__ = ("chain", "inbox", "loop", "models", "name")

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
        self.chain = (name,)  # the chain of a batch of clients' requests
        self.loop = asyncio.get_running_loop() if loop is None else loop
        self.inbox = inbox_of(self.loop) if inbox is None else inbox

    def plain(self) -> CallPath:
        """The call path of a batch of clients' requests without a deadline; any thread."""
        return CallPath(self.models, self.chain, 0, self.loop, self.inbox)

    def path_of(self, origins: Sequence[Optional[Origin]], deadlines: Sequence[int]) -> CallPath:
        """The call path of a batch whose requests have these origins and deadlines (0: none); any thread."""
        if any(origin is not None for origin in origins) or any(deadlines):
            chain, deadline = _joined(self.name, origins, deadlines)
            return CallPath(self.models, chain, deadline, self.loop, self.inbox)
        return CallPath(self.models, self.chain, 0, self.loop, self.inbox)  # clients' requests without a timeout


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
