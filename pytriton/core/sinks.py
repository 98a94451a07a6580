"""Where a request's responses go: a future for one response, a queue for a stream."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Optional, Union

from pytriton.core.backlog import Backlog
from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceResponse
from pytriton.core.waiters import Room

# Responses (or bytes of them) a stream's consumer may leave untaken before the model's generator waits for it: a
# client that reads its stream slower than the model writes it holds the generator, not an ever longer queue.
STREAM_BACKLOG, STREAM_BACKLOG_BYTES = 128, 8 << 20


class ResponseSink:
    """The receiving end of one request; the scheduler delivers into it on the event loop."""

    def done(self) -> bool:
        """Whether nobody waits for more responses (finished or cancelled)."""
        raise NotImplementedError

    def deliver(self, response: InferenceResponse) -> None:
        """Hand over one response."""
        raise NotImplementedError

    def fail(self, error: InferenceError) -> None:
        """End the request with an error."""
        raise NotImplementedError

    def finish(self) -> None:
        """End the request after its last response."""
        raise NotImplementedError

    def has_room(self) -> bool:
        """Whether the producer may deliver more now (a sink without a backlog always has room)."""
        return True

    async def room(self) -> None:
        """Wait until the producer may deliver more (has_room), or nobody waits for more (done)."""

    def overrun(self) -> bool:
        """Whether the consumer fell so far behind (Backlog.overrun) that it is cut off rather than hold its batch."""
        return False


class FutureSink(ResponseSink):
    """A sink for exactly one response, awaited by the transport."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[InferenceResponse]) -> None:
        """Wrap a future created on the engine's loop."""
        self.future = future

    def done(self) -> bool:
        """Whether the future is settled or cancelled."""
        return self.future.done()

    def deliver(self, response: InferenceResponse) -> None:
        """Settle the future with the response."""
        if not self.future.done():
            self.future.set_result(response)

    def fail(self, error: InferenceError) -> None:
        """Settle the future with the error (the request's answer: `in_response`)."""
        if not self.future.done():
            error.in_response = True
            self.future.set_exception(error)

    def finish(self) -> None:
        """Nothing to do: the response settled the future."""
        if not self.future.done():
            self.fail(InferenceError.internal("model returned no response"))


_END = object()
StreamItem = Union[InferenceResponse, InferenceError, object]


class StreamSink(ResponseSink):
    """A sink for zero or more responses, consumed as an async iterator."""

    def __init__(self, on_cancel: Optional[Callable[[ResponseSink], None]] = None) -> None:
        """Create an empty stream; `on_cancel(sink)` runs when the consumer leaves before the end."""
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._closed = False
        self._cancelled = False
        self._on_cancel = on_cancel
        self._backlog = Backlog(STREAM_BACKLOG, STREAM_BACKLOG_BYTES)  # the responses queued, not yet taken
        self._room = Room()  # the producer waits there while the backlog is full

    def done(self) -> bool:
        """Whether the stream ended or its consumer went away."""
        return self._closed or self._cancelled

    def cancel(self) -> None:
        """The consumer went away: the producer stops at its next step."""
        if not self.done() and self._on_cancel is not None:
            self._on_cancel(self)
        self._cancelled = True
        self._room.wake()

    def has_room(self) -> bool:
        """Whether the responses waiting for the consumer leave room (core/backlog.py), or the stream is done."""
        return not self._backlog.full() or self.done()

    async def room(self) -> None:
        """Wait until the consumer took responses enough (has_room)."""
        await self._room.until(self.has_room)

    def overrun(self) -> bool:
        """Whether the responses waiting for the consumer passed the backlog's hard bound (Backlog.overrun)."""
        return self._backlog.overrun() and not self.done()

    def deliver(self, response: InferenceResponse) -> None:
        """Queue one response."""
        if not self.done():
            self._queue.put_nowait(response)
            self._backlog.add(response.nbytes())

    def fail(self, error: InferenceError) -> None:
        """Queue an error; it ends the stream."""
        if not self.done():
            self._closed = True
            self._queue.put_nowait(error)

    def finish(self) -> None:
        """End the stream."""
        if not self.done():
            self._closed = True
            self._queue.put_nowait(_END)

    async def responses(self) -> AsyncIterator[InferenceResponse]:
        """Yield responses until the end; an error is raised where it happened."""
        try:
            while True:
                item = await self._queue.get()
                backlog = self._backlog
                if backlog:
                    backlog.take()
                    if backlog.drained():  # the producer goes on once half was taken, not per response
                        self._room.wake()
                if item is _END:
                    return
                if isinstance(item, InferenceError):
                    try:
                        raise item
                    finally:
                        # The error's traceback holds this frame: not the error too. That reference cycle kept the
                        # frames it passed (a generate_stream handler's, with its request's body) until a full
                        # collection.
                        del item
                assert isinstance(item, InferenceResponse)
                yield item
        finally:
            self.cancel()
