"""One gRPC call on an HTTP/2 stream: its request messages, its handler, and the servicer context it gets."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncIterator, Coroutine, Deque, List, NoReturn, Optional, Sequence, Tuple, Union

import grpc

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.core.waiters import wake
from pytriton.transport.deflate import OFF_LOOP_BYTES
from pytriton.transport.deflate import compressed as deflated
from pytriton.transport.grpc.flow import STREAM_WINDOW
from pytriton.transport.grpc.headers import Header
from pytriton.transport.grpc.messages import (
    UNPARSED,
    Compressed,
    Message,
    MessageError,
    MessageReader,
    encoding_wbits,
)
from pytriton.transport.grpc.streams import HALF_CLOSED_LOCAL, OPEN

if TYPE_CHECKING:
    from pytriton.transport.grpc.handlers import Method
    from pytriton.transport.grpc.session import Http2Session

LOGGER = logging.getLogger(__name__)

# Headers the transport consumes; the rest is the call's metadata.
_TRANSPORT_HEADERS = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_TIMEOUT = re.compile(rb" *([0-9]+) *([HMSmun]) *")
_TIMEOUT_MOST = 10**9  # units grpc's C-core reads; more is no deadline
Metadata = Tuple[Tuple[str, Union[str, bytes]], ...]


class RpcAbort(Exception):
    """Raised by `GrpcCall.abort`: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with `code` and `details`."""
        super().__init__(details)
        self.code = code
        self.details = details


def parse_timeout(value: bytes) -> Optional[float]:
    """Seconds of a grpc-timeout header ("100m", "5S"...) as grpc's C-core reads it; None when endless.

    Spaces before, between and after the number and its unit are skipped, and more than 10**9 units is no deadline
    (tritonserver 2.51 answers DEADLINE_EXCEEDED to " 0n" and "000000000n", probed).

    Raises:
        ValueError: a value grpc's C-core cannot read ("", "abc", "10x", "-1S", "1.5S"): tritonserver 2.51
            resets its stream (INTERNAL_ERROR).
    """
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        found = _TIMEOUT.fullmatch(value)
        if found is None:
            raise ValueError(f"malformed grpc-timeout {value!r}")
        if int(found.group(1)) > _TIMEOUT_MOST:
            return None
        digits, unit = found.group(1), _TIMEOUT_UNITS[found.group(2)]
    return int(digits) * unit


class GrpcCall:
    """A call on one HTTP/2 stream: gives the handler its requests and the context grpc.aio's servicers expect.

    A unary call's handler starts as soon as its request message is whole; a second message ends the call
    with UNIMPLEMENTED (gRPC's status for a cardinality violation). A streaming call's handler starts with the call
    and pulls its requests; what waits in its inbox holds the stream's flow-control window.
    """

    __slots__ = (
        "_headers",
        "_inbox",
        "_inbox_error",
        "_metadata",
        "_reader",
        "_waiter",
        "deadline",
        "encoding",
        "ended",
        "held",
        "method",
        "outbox",
        "partial",
        "recv_window",
        "request_memory",
        "send_window",
        "session",
        "stalled",
        "started",
        "state",
        "stream_id",
        "task",
        "writable",
    )

    def __init__(
        self,
        session: Http2Session,
        stream_id: int,
        method: Method,
        headers: List[Header],
        reader: MessageReader,
        send_window: int,
    ) -> None:
        """A call on stream `stream_id` of `method`, with the request's headers."""
        self.session = session
        self.stream_id = stream_id
        self.method = method
        self._headers = headers
        self._reader = reader
        reader.granted = self._granted
        self._metadata: Optional[Metadata] = None
        self._inbox: Deque[Message] = deque()  # request messages not yet taken by a streaming handler
        self._inbox_error: Optional[MessageError] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self.state = OPEN  # of the HTTP/2 stream (streams.py), moved by the session
        self.recv_window = STREAM_WINDOW  # what the client may still send on the stream
        self.held = 0  # bytes received that the handler has not consumed (counted in the windows)
        self.partial = 0  # bytes of a message still arriving, buffered (the connection bounds them: session.py)
        self.stalled = 0  # bytes consumed whose stream window waits for the connection to buffer less (flow.py)
        self.send_window = send_window
        self.outbox: Deque[Any] = deque()  # DATA and trailers waiting for flow-control window
        self.request_memory: Any = None  # what a unary request message lies in: outputs there go out uncopied
        self.writable: Optional[asyncio.Future[None]] = None  # a streaming handler waits on it for the outbox
        self.encoding: Optional[str] = None  # the responses' compression
        self.deadline: Optional[asyncio.TimerHandle] = None
        self.task: Optional[asyncio.Task[None]] = None
        self.started = False  # response headers sent
        self.ended = False  # the status is decided (sent or queued) or the stream reset: nothing more goes out

    # -- what the session feeds in ---------------------------------------------------------

    @property
    def remote_open(self) -> bool:
        """Whether the client may still send on the stream."""
        return self.state == OPEN or self.state == HALF_CLOSED_LOCAL

    def receive(self, pieces: Sequence[Buffer], length: int, in_place: bool = False) -> None:
        """DATA of the stream in pieces (`length` with padding): messages for the handler, consumed as it reads them.

        `in_place`: no pieces, the `length` bytes were read into the room `room` gave (they are all message bytes).
        Bytes of a message under way are consumed at once (the handler waits for it), but past the
        connection's bound on such bytes only the oldest message's window comes back; whole messages a
        streaming handler has not taken hold the window until it takes them; a unary call refuses a second one.
        """
        inflow = self.session.inflow
        size = length if in_place else len(pieces[0]) if len(pieces) == 1 else sum(map(len, pieces))
        if self.ended:
            inflow.dropped(length)
            return
        if self.task is not None and not self.method.streaming:
            inflow.dropped(length)
            if size:
                self._too_many_requests()
            return
        reader = self._reader
        try:
            if in_place:
                messages: Optional[List[Message]] = reader.filled(length)
            elif not size:
                messages = None
            else:
                messages = reader.feed(pieces[0]) if len(pieces) == 1 else reader.feed_pieces(pieces)
        except MessageError as error:
            inflow.dropped(length)
            if self.method.streaming:  # the requests before the one refused are served, as tritonserver 2.51 does
                self._inbox.extend(error.completed)
            self.fail_requests(error)
            return
        stalled = False
        if self.partial or (size and not messages):  # a message in pieces (the usual one comes whole)
            stalled = self._buffering(size, bool(messages))
        if not self.method.streaming:
            if stalled:
                inflow.stall(self, length)
            else:
                inflow.consumed(self, length, self.state == OPEN)
            if messages:
                if len(messages) > 1 or reader.partial:
                    self._too_many_requests()
                else:
                    self._start(self._unary(messages[0]))
            return
        self.held += length
        if messages:
            self._inbox.extend(messages)
            wake(self._waiter)
        elif not self._inbox:
            if stalled:
                held, self.held = self.held, 0
                inflow.stall(self, held)
            else:
                self._consume_held()

    def room(self, limit: int) -> Optional[memoryview]:
        """Where up to `limit` bytes of the message under way may be read in place (None: nowhere, read as usual)."""
        if self.ended or (self.task is not None and not self.method.streaming):
            return None
        return self._reader.room(limit)

    def _buffering(self, size: int, completed: bool) -> bool:
        """Count the bytes of a message still arriving after `size` more; whether their stream's room must wait.

        After a message completes, the start of the next one is counted as the whole DATA (at most a frame more).
        """
        before = self.partial
        if not self._reader.partial:
            after = 0
        elif completed:
            after = size
        else:
            after = before + size
        self.partial = after
        return self.session.buffering(self, before, after) or self._reader.waiting

    @property
    def waiting(self) -> bool:
        """Whether the message under way waits for room in the server's receive budget (its stream's room waits)."""
        return self._reader.waiting

    def _granted(self) -> None:
        """The message under way has its share of the receive budget: its stream's room may come back."""
        if not self.ended:
            self.session.granted(self)

    def end_share(self) -> None:
        """The call is over: what its latest large message holds of the receive budget comes back."""
        self._reader.end_share()

    def _too_many_requests(self) -> None:
        """A unary call got (the start of) a second request message: a cardinality violation, as gRPC names it.

        gRPC's status codes give UNIMPLEMENTED for it; grpc's C-core answers the first message and drops the
        rest unread, which lets a client stream data nobody reads on a call that looks unary.
        """
        self.session.end_call(self, grpc.StatusCode.UNIMPLEMENTED, "a unary call got more than one request message")

    def _consume_held(self) -> None:
        """The handler took (or waits for) everything whole: the bytes held come back to the client.

        Unless the message under way waits for the receive budget: then only the connection's room does.
        """
        held, self.held = self.held, 0
        if self._reader.waiting:
            self.session.inflow.stall(self, held)
        else:
            self.session.inflow.consumed(self, held, self.remote_open)

    def close_remote(self) -> None:
        """The client sent its last message (END_STREAM)."""
        if self.ended or (self.task is not None and not self.method.streaming):
            return  # a unary call that has its message (or an ended call): nothing more is read
        streaming = self.method.streaming
        if streaming and self._reader.partial:
            self.fail_requests(MessageError(grpc.StatusCode.INTERNAL, "the stream ended inside a message"))
        elif streaming:
            wake(self._waiter)
        else:  # no whole message: grpc's C-core has none to parse (tritonserver 2.51's words, probed)
            self.session.end_call(self, grpc.StatusCode.INTERNAL, UNPARSED)

    def fail_requests(self, error: MessageError) -> None:
        """A request message could not be taken: end a unary call now, make a streaming handler's iterator raise."""
        if self.method.streaming and self.task is not None:
            self._inbox_error = error
            wake(self._waiter)
        else:
            self.session.end_call(self, error.code, error.details)

    def start_streaming(self) -> None:
        """Run a streaming handler from the start of the call."""
        self._start(self._streaming())

    def _start(self, handler: Coroutine[Any, Any, None]) -> None:
        """Run a handler coroutine as the call's task."""
        self.task = self.session.start_handler(handler)

    def stop_task(self) -> None:
        """Cancel the handler's task if it still runs; once it ends, it lets go of the cancellation.

        Only a cancelled task keeps a cancellation (`_forget_cancellation`), so a call that ends of itself pays
        nothing for this.
        """
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            task.add_done_callback(_forget_cancellation)

    def cancel(self) -> None:
        """The call is over for the client (reset, deadline, lost connection): stop its handler, drop its partial."""
        self.ended = True
        self._reader.drop()
        if self.deadline is not None:
            self.deadline.cancel()
        self.stop_task()
        wake(self.writable)

    def expire(self) -> None:
        """The client's deadline passed."""
        self.deadline = None
        self.session.end_call(self, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- running the handler --------------------------------------------------------------------

    async def _unary(self, request: Message) -> None:
        """Run the handler on the request message (inflated first when compressed), send its response and the status."""
        method = self.method
        try:
            if isinstance(request, Compressed):
                request = await request.inflated()
            self.request_memory = request.obj if isinstance(request, memoryview) else request
            response = await method.behaviour(method.deserialize(request), self)
            parts, size = method.serialize(response)
            if self.encoding is None or size < OFF_LOOP_BYTES:
                self.session.send_unary_response(self, parts, size)
            else:  # compressed in a worker thread: zlib on the loop held every other client (transport/deflate.py)
                parts, size = await self._compressed(parts)
                self.session.send_unary_response(self, parts, size, True)
        except Exception as error:  # noqa: BLE001 - every failure must reach the client as a status
            self._failed(error)

    async def _compressed(self, parts: Sequence[Buffer]) -> Tuple[List[Buffer], int]:
        """A response message's parts compressed with the call's encoding, in a worker thread: one part, its size."""
        assert self.encoding is not None
        body = await deflated(b"".join(parts), encoding_wbits(self.encoding))
        return [body], len(body)

    async def _streaming(self) -> None:
        """Run a streaming handler over the request iterator; its writes are the responses."""
        try:
            await self.method.behaviour(self._requests(), self)
            self.session.end_call(self, grpc.StatusCode.OK, "")
        except Exception as error:  # noqa: BLE001 - every failure must reach the client as a status
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        """End the call with the status of what its handler raised (cancellation is not an Exception)."""
        if isinstance(error, (RpcAbort, MessageError)):
            self.session.end_call(self, error.code, error.details)
        else:
            self._unexpected(error)

    def _unexpected(self, error: Exception) -> None:
        """A handler raised what no servicer wrapper mapped: UNKNOWN, as grpc.aio answers."""
        LOGGER.error("unexpected error in gRPC method %s: %r", self.method.name, error, exc_info=error)
        self.session.end_call(self, grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}: {error}")

    async def _requests(self) -> AsyncIterator[Any]:
        """The request messages of a streaming call, parsed, until the client half-closes."""
        inbox = self._inbox
        deserialize = self.method.deserialize
        while True:
            while inbox:
                message: Any = inbox.popleft()
                if not inbox and self.held:
                    self._consume_held()  # the inbox is empty: the client may send more
                if isinstance(message, Compressed):
                    message = await message.inflated()
                request, message = deserialize(message), None
                yield request
                # Not held here while the next one is awaited: a large message's bytes hold a share of the receive
                # budget until they go, and the next one may wait for that share.
                request = None
            if self._inbox_error is not None:
                raise self._inbox_error
            if not self.remote_open:
                return
            self._waiter = self.session.loop.create_future()
            await self._waiter

    # -- the servicer context -------------------------------------------------------------------

    def invocation_metadata(self) -> Metadata:
        """The call's metadata: its headers less HTTP/2's and gRPC's own; `-bin` values decoded."""
        if self._metadata is None:
            items: List[Tuple[str, Union[str, bytes]]] = []
            for name, value in self._headers:
                if name[:1] == b":" or name in _TRANSPORT_HEADERS:
                    continue
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    items.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                else:
                    items.append((key, value.decode("latin-1")))
            self._metadata = tuple(items)
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with a status (raises, like grpc.aio's)."""
        raise RpcAbort(code, details)

    async def write(self, message: Any) -> None:
        """Send one response of a streaming call; waits while flow control holds earlier ones back."""
        if self.ended:
            raise asyncio.CancelledError()
        parts, size = self.method.serialize(message)
        compressed = self.encoding is not None and size >= OFF_LOOP_BYTES
        if compressed:
            parts, size = await self._compressed(parts)
            if self.ended:
                raise asyncio.CancelledError()
        session = self.session
        session.send_message(self, parts, size, compressed)
        del message, parts  # a cancelled wait's traceback holds this frame: not the answer too
        if self.outbox or session.write_paused:
            self.writable = session.loop.create_future()
            await self.writable
            self.writable = None


def _forget_cancellation(task: asyncio.Task[None]) -> None:
    """Let go of what a cancelled handler's frames hold, which its task would keep for as long as the call lives.

    The task keeps its cancellation, whose traceback holds the handler's frames, and so the call (their `context`)
    and the call's task: a reference cycle, which only the cycle collector frees, maybe minutes later, with the
    request and answers those frames hold (16 unary calls of 3 MiB whose client left while they waited held 96 MB).
    Asking the task for its result hands the kept cancellation over on Python 3.11+; 3.9 and 3.10 keep it and chain
    it to a new one, so the frames of both are cleared.
    """
    if task.cancelled():
        try:
            task.result()
        except asyncio.CancelledError as error:
            kept = error.__context__
            traceback.clear_frames(error.__traceback__)
            if kept is not None:
                traceback.clear_frames(kept.__traceback__)
