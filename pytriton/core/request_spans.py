"""Spans of traced requests: what the scheduler asks of a model's tracer, and the sink that ends the spans.

A model is traced when the runtime gives its scheduler a `SpanSource` (trace level on: OpenTelemetry spans in
mode opentelemetry, a trace file's records in mode triton); each request that leaves the queue then asks it for a
`TracedCall`, whose span the callable's Request carries (`Request.span`, `Request.traced_span`; None for a trace
file), and which ends when the request does. A traced request's responses pass through `TracedCall.responded`:
a trace file's hands back a `TracedResponse`, through which the transport adds its own timestamps.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Tuple

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

    def responded(self, response: InferenceResponse) -> InferenceResponse:
        """One response of the request, before it is handed over: the response, or a `TracedResponse` of it."""


class SpanSource(Protocol):
    """A traced model's tracer: decides which requests are traced and opens their spans."""

    def start(self, enqueue_ns: int, parent: Any = None, entry: Any = None) -> Optional[TracedCall]:
        """The spans of a request queued at `enqueue_ns` (monotonic) that starts now; None when not sampled.

        `parent`: the span of the request whose callable made this one (core/composition/), which they nest under.
        `entry`: the request's queue entry (core/queues.py), whose request and compute times a trace file records.
        """


class FrontendTrace(Protocol):
    """A traced request's record that waits for its transport's timestamps (a trace file's)."""

    def claim(self) -> bool:
        """The transport will add its timestamps (`sent`); False when the record is written already."""

    def sent(self, protocol: str, stamps: Tuple[int, int, int, int]) -> None:
        """The transport's timestamps: received from, to, sent from, to (monotonic ns); `protocol` HTTP or GRPC."""

    def abandon(self) -> None:
        """The transport that claimed the record adds no timestamps after all: written without them."""


class FixedStamps:
    """What a transport without trace settings knows of trace files: whether its requests are timed for them.

    A frontend process's (runtime/frontends/): the hub, which traces, has the settings and tells its frontends
    whether it writes trace files (`stamps`); while it does, the frontend's transports time a request's arrival
    (`InferenceRequest.arrival_ns`, see `mark_arrival`) and the send of a traced request's response.
    """

    __slots__ = ("stamps",)

    def __init__(self, stamps: bool) -> None:
        """Time requests or not."""
        self.stamps = stamps


NO_STAMPS = FixedStamps(False)


def mark_arrival(request: Any, received_ns: int, grpc: bool) -> None:
    """Note when a request arrived, for a trace file's record that its transport does not take (frontend processes).

    gRPC's arrival is noted negative: the record then names it GRPC_WAITREAD_START/_END, not HTTP_RECV_START/_END.
    """
    request.arrival_ns = -received_ns if grpc else received_ns


def arrival_stamps(arrival_ns: int) -> List[Tuple[str, int]]:
    """The receive timestamps `mark_arrival` noted (none when it noted none)."""
    if arrival_ns > 0:
        return [("HTTP_RECV_START", arrival_ns), ("HTTP_RECV_END", arrival_ns)]
    if arrival_ns < 0:
        return [("GRPC_WAITREAD_START", -arrival_ns), ("GRPC_WAITREAD_END", -arrival_ns)]
    return []


class TracedResponse(InferenceResponse):
    """A traced request's response, with the record its transport adds its timestamps to."""

    __slots__ = ("trace",)

    def __init__(self, response: InferenceResponse, trace: FrontendTrace) -> None:
        """The same response, carrying `trace`."""
        super().__init__(response.outputs, response.final, response.parameters)
        self.trace = trace


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
        self.sink.deliver(self.call.responded(response))

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

    def overrun(self) -> bool:
        """Whether the sink it wraps is overrun."""
        return self.sink.overrun()


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
