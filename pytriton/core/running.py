"""The batches of a model whose call runs, so that a client's cancel reaches its request there.

A cancelled request's call goes on: its `Request.is_cancelled()` says so (as in Triton's Python backend), and the
callable may stop early. A decoupled generator is closed at its next step once every request of its batch is
cancelled: the others of a batch still want its responses. The request counts as cancelled when its batch ends,
whatever the callable returned.
"""

from __future__ import annotations

import threading
from typing import Iterator, List, Optional, Set

from pytriton.core.instances import ModelInstance
from pytriton.core.queues import Entry
from pytriton.core.sinks import ResponseSink


class RunningBatch:
    """One batch whose call runs on an instance; `stop` ends a decoupled model's generator (None for others)."""

    __slots__ = ("entries", "instance", "stop")

    def __init__(self, entries: List[Entry], instance: ModelInstance, decoupled: bool) -> None:
        """A batch that starts now on `instance`."""
        self.entries = entries
        self.instance = instance
        self.stop: Optional[threading.Event] = threading.Event() if decoupled else None

    def cancel(self, entry: Entry) -> None:
        """The client of one of its requests cancelled it: the callable is told; a generator nobody wants stops."""
        if entry.cancelled:
            return
        entry.cancelled = True
        if entry.call is not None:
            self.instance.cancel(entry.call)
        if self.stop is not None and all(other.cancelled for other in self.entries):
            self.stop.set()  # closed at its next step


class RunningBatches:
    """The model's running batches; looked through only when a client cancels (rare), never per request."""

    def __init__(self) -> None:
        """None runs yet."""
        self._batches: Set[RunningBatch] = set()

    def __bool__(self) -> bool:
        """Whether some batch runs."""
        return bool(self._batches)

    def add(self, batch: RunningBatch) -> None:
        """A batch started."""
        self._batches.add(batch)

    def discard(self, batch: RunningBatch) -> None:
        """A batch ended."""
        self._batches.discard(batch)

    def entries(self) -> Iterator[Entry]:
        """The requests of every running batch."""
        for batch in list(self._batches):
            yield from batch.entries

    def cancel(self, sink: ResponseSink) -> bool:
        """Cancel the running request whose responses go to `sink`; False when none runs."""
        for batch in self._batches:
            for entry in batch.entries:
                if entry.sink is sink or getattr(entry.sink, "sink", None) is sink:  # a traced request's wraps it
                    batch.cancel(entry)
                    return True
        return False

    def cancel_entry(self, entry: Entry) -> None:
        """Cancel a request whose client left, if it still runs."""
        for batch in self._batches:
            if entry in batch.entries:
                batch.cancel(entry)
                return
