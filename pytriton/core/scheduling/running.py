"""The batches of a model whose call runs, so that a client's cancel reaches its request there.

A cancelled request's call goes on: its `Request.is_cancelled()` says so (as in Triton's Python backend), and the
callable may stop early. A decoupled generator is closed at its next step once every request of its batch is
cancelled: the others of a batch still want its responses. The request counts as cancelled when its batch ends,
whatever the callable returned; a streamed one unless its generator ended by itself and lost no response to the
cancel (core/scheduling/scheduler.py).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Iterator, List, Optional, Set, Tuple

from pytriton.core.composition.path import CallPath, PathMaker
from pytriton.core.instances import ModelInstance, StreamStop
from pytriton.core.queues import Entry
from pytriton.core.sinks import ResponseSink
from pytriton.proxy.types import Request, mark_cancelled

# Held while a batch's call path is made: two threads of one callable calling models at once get the same one.
_MAKING = threading.Lock()


class RunningBatch:
    """One batch whose call runs on an instance; `stop` ends a decoupled model's generator (None for others).

    It is the PathSource of its callable (core/composition/path.py): the call path is made on the first inner call.
    """

    __slots__ = ("ended", "entries", "instance", "path", "paths", "span", "stop")

    def __init__(
        self, entries: List[Entry], instance: ModelInstance, decoupled: bool, paths: Optional[PathMaker] = None
    ) -> None:
        """A batch that starts now on `instance`; `paths` makes its call path (None: it calls no model)."""
        self.entries = entries
        self.instance = instance
        self.stop: Optional[StreamStop] = StreamStop() if decoupled else None
        self.paths = paths
        self.path: Optional[CallPath] = None  # made by call_path()
        self.span: Any = None  # a traced request's span: the inner calls' spans nest under it
        self.ended = False  # set on the loop when the batch's requests are answered

    def call_path(self) -> CallPath:
        """The batch's call path, made now if this is its first inner call (from the callable's thread or task)."""
        path = self.path
        if path is not None:
            return path
        assert self.paths is not None
        with _MAKING:
            if self.path is None:
                made = self._made(self.paths)
                made.span = self.span
                self.path = made
                if self.ended:  # the loop closed the batch before it saw the path (it reads `path` after `ended`)
                    made.cancelled = True
            return self.path

    def _made(self, paths: PathMaker) -> CallPath:
        """A new call path for the batch's requests."""
        for entry in self.entries:
            if entry.request.origin is not None or entry.request.timeout_us:
                break
        else:  # clients' requests without a timeout: the usual batch
            return _answered_later(paths.plain())
        origins = [entry.request.origin for entry in self.entries]
        deadlines = [
            entry.enqueue_ns + entry.request.timeout_us * 1000 if entry.request.timeout_us else 0
            for entry in self.entries
        ]
        return _answered_later(paths.path_of(origins, deadlines))

    def end(self, model: str) -> None:
        """On the loop: the batch of `model` is answered; its inner calls still in flight are cancelled.

        The scheduler sets `ended` itself and calls this only when the batch made a path (most make none).
        """
        self.ended = True
        if self.path is not None:
            _close(self.path, model)

    def cancel(self, entry: Entry) -> None:
        """The client of one of its requests cancelled it: the callable is told; a generator nobody wants stops."""
        if entry.cancelled:
            return
        entry.cancelled = True
        if entry.call is not None:
            self.instance.cancel(entry.call)
        if self.stop is not None and all(other.cancelled for other in self.entries):
            self.stop.set()  # closed at its next step


class LoneCall:
    """A direct inner call (direct_runs.run_here): one request that runs at once, outside the model's queue.

    What a RunningBatch of one entry and the entry's sink were to it, in one object: the Cancellable its caller's
    call path holds (`cancel`, on the loop, as the caller's request ends or is cancelled) and the PathSource of the
    callable it runs (`call_path`, made on the callable's first inner call: the caller's models, then this one).
    """

    __slots__ = ("cancelled", "chain", "ended", "path", "paths", "reason", "request")

    def __init__(self, chain: Tuple[str, ...], paths: Optional[PathMaker]) -> None:
        """A call to `paths`' model from a request whose call path has `chain` (which that model is not on).

        `paths` None: a scheduler outside an engine; its callable has no call path (calls no model).
        """
        self.chain = chain
        self.paths = paths
        self.path: Optional[CallPath] = None  # made by call_path()
        self.request: Optional[Request] = None  # what the callable gets, once made
        self.ended = False  # set by the caller's thread once the callable returned
        self.cancelled = False  # the caller's request ended or was cancelled while it ran
        self.reason = ""  # why it was cancelled

    def call_path(self) -> CallPath:
        """The call path of the callable's own inner calls, made now if this is the first (from its thread or task).

        As a RunningBatch's of this one request (whose origin is the caller's chain, without a deadline or a span).
        """
        path = self.path
        if path is not None:
            return path
        assert self.paths is not None
        with _MAKING:
            if self.path is None:
                paths = self.paths
                made = CallPath(paths.models, (*self.chain, paths.name), 0, paths.loop, paths.inbox)
                made.after_answer = deque()
                self.path = made
                if self.ended:
                    made.cancelled = True
            return self.path

    def cancel(self, reason: str) -> None:
        """On the loop: the caller's request ended or was cancelled; the callable's `is_cancelled()` says so."""
        if self.ended:
            return
        self.reason = reason
        request = self.request
        if request is None:
            return  # not started yet: it fails as it starts
        self.cancelled = True
        mark_cancelled(request)
        if self.path is not None:
            self.path.close(reason)

    def end(self, model: str) -> None:
        """On the loop: the call has ended (as RunningBatch.end); the inner calls its callable left are cancelled."""
        self.ended = True
        if self.path is not None:
            _close(self.path, model)


def _close(path: CallPath, model: str) -> None:
    """On the loop: the path of a batch (or a direct call) of `model` that has been answered is closed."""
    path.cancelled = True  # first: a call that a thread adds after the test below sees it and stops
    if path.after_answer:  # after what the answers wake (a handler's write): off their way
        path.loop.call_soon(path.answered)
    if path.inner:  # else nothing in flight to tell why (the commonest end): no message to make
        path.close(f"the request to model '{model}' that made the call has ended")


def _answered_later(path: CallPath) -> CallPath:
    """A batch's call path, which keeps what its direct inner calls leave the loop until the batch is answered."""
    path.after_answer = deque()
    return path


class RunningBatches(Set[RunningBatch]):
    """The model's running batches, looked through only when a client cancels (rare), never per request.

    A set: `add` and `discard` cost a batch no Python call.
    """

    def entries(self) -> Iterator[Entry]:
        """The requests of every running batch."""
        for batch in list(self):
            yield from batch.entries

    def cancel(self, sink: ResponseSink) -> bool:
        """Cancel the running request whose responses go to `sink`; False when none runs."""
        for batch in self:
            for entry in batch.entries:
                if entry.sink is sink or getattr(entry.sink, "sink", None) is sink:  # a traced request's wraps it
                    batch.cancel(entry)
                    return True
        return False

    def cancel_entry(self, entry: Entry) -> None:
        """Cancel a request whose client left, if it still runs."""
        for batch in self:
            if entry in batch.entries:
                batch.cancel(entry)
                return
