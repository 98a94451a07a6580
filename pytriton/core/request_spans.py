"""Spans of traced requests: what the scheduler asks of a model's tracer, and the sink that ends the spans.

A model is traced when the runtime gives its scheduler a `SpanSource` (trace_config mode=opentelemetry, trace
level on); each request that leaves the queue then asks it for a `TracedCall`, whose span the callable's
Request carries (`Request.span`, `Request.traced_span`), and which ends when the request does.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceResponse
from pytriton.core.sinks import ResponseSink
from pytriton.proxy.types import Request


class TracedCall(Protocol):
    """The spans of one sampled request while its callable runs."""

    span: Any  # the span the callable's child spans nest under
    tracer: Any  # the tracer that makes them

    def finish(self, error: Optional[str]) -> None:
        """End the spans, with an error status when the request failed."""


class SpanSource(Protocol):
    """A traced model's tracer: decides which requests are traced and opens their spans."""

    def start(self, enqueue_ns: int, parent: Any = None) -> Optional[TracedCall]:
        """The spans of a request queued at `enqueue_ns` (monotonic) that starts now; None when not sampled.

        `parent`: the span of the request whose callable made this one (core/composition/), which they nest under.
        """


class TracedRequest(Request):
    """A Request whose span was made by the server's tracer, which `traced_span` uses for the child spans."""

    tracer: Any


class TracedSink(ResponseSink):
    """A request's sink that ends its spans when the request ends."""

    __slots__ = ("call", "sink")

    def __init__(self, sink: ResponseSink, call: TracedCall) -> None:
        """Wrap the sink a request's responses go to."""
        self.sink = sink
        self.call = call

    def done(self) -> bool:
        """Whether nobody waits for more responses."""
        return self.sink.done()

    def deliver(self, response: InferenceResponse) -> None:
        """Hand over one response."""
        self.sink.deliver(response)

    def fail(self, error: InferenceError) -> None:
        """End the request and its spans with an error."""
        self.call.finish(error.message)
        self.sink.fail(error)

    def finish(self) -> None:
        """End the request and its spans after its last response."""
        self.call.finish(None)
        self.sink.finish()

    def has_room(self) -> bool:
        """Whether the sink it wraps has room."""
        return self.sink.has_room()

    async def room(self) -> None:
        """Wait for the sink it wraps to have room."""
        await self.sink.room()


def traced_request(request: Request, call: TracedCall) -> TracedRequest:
    """The Request a traced callable gets: the same data, with the call's span and tracer."""
    traced = TracedRequest(
        request.data,
        request.parameters,
        call.span,
        request.requested_output_names,
        request.sequence_id,
        request.sequence_start,
        request.sequence_end,
        request.sequence_state,
        request.sequence_serial,
    )
    traced.tracer = call.tracer
    return traced
