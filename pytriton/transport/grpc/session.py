"""The HTTP/2 side of one gRPC connection: what each of the client's frames does, and what the calls send.

The parts live apart: `framing.py` cuts frames and header blocks, `streams.py` holds the stream states
and what a frame does in each, `flow.py` the windows both ways, `responses.py` what goes out on a
call, `keepalive.py` the pings, `floods.py` the flood counters, `goaway.py` the GOAWAYs. The session
ties them to the calls; its connection (`connection.py`) ties it to the transport.

A session must receive its client's preface and SETTINGS within grpc_handshake_timeout_s, then its first
call within as long again (or grpc_idle_timeout_s, if shorter), says GOAWAY after grpc_idle_timeout_s
without a call, and takes at most grpc_max_concurrent_streams calls at once
(REFUSED_STREAM beyond). Its calls buffer at most grpc_max_buffered_bytes of messages still arriving
before all but the oldest such message wait (flow.py). A connection one over grpc_max_connections
answers its first call UNAVAILABLE, then says GOAWAY (its debug data says why: grpc's clients show it);
one that opens no call says it at the first call's deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Dict, List, Optional, Sequence, Tuple

import grpc

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.core.waiters import wake
from pytriton.transport.deadline import APP, PhaseDeadline
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc import streams as st
from pytriton.transport.grpc.call import GrpcCall, parse_timeout
from pytriton.transport.grpc.floods import WINDOW_UPDATES_FREE, FloodGauges, window_updates_earned
from pytriton.transport.grpc.flow import STREAM_WINDOW, ReceiveWindows
from pytriton.transport.grpc.framing import MAX_FRAME, FrameReader
from pytriton.transport.grpc.goaway import GOAWAY_PING, Goaway
from pytriton.transport.grpc.headers import Header, HeaderBlockDecoder, HeaderListTooLarge, MalformedHeaders
from pytriton.transport.grpc.keepalive import Keepalive
from pytriton.transport.grpc.messages import MessageError, MessageReader, request_encoding, response_encoding
from pytriton.transport.grpc.responses import ResponseSender
from pytriton.transport.grpc.sized import SizedCall

if TYPE_CHECKING:
    from pytriton.transport.grpc.server import GrpcServerState

LOGGER = logging.getLogger(__name__)

# What the session waits for from its client (APP: nothing, calls are in progress).
HANDSHAKE, FIRST_CALL, IDLE = 1, 2, 3
# The RPCs whose responses grpc_infer_response_compression_level compresses: tritonserver sets it on its infer
# handlers alone (its other RPCs answer uncompressed whatever the client accepts; 2.51, probed).
_COMPRESSED_RPCS = frozenset(("ModelInfer", "ModelStreamInfer"))


_SCHEMES = (b"http", b"https")


def _grpc_content(content_type: bytes) -> bool:
    """Whether a content-type is gRPC's as grpc's C-core reads it: `application/grpc`, then nothing, `+` or `;`."""
    return content_type.startswith(b"application/grpc") and content_type[16:17] in (b"", b"+", b";")


def _malformed(method: Optional[bytes], te: Optional[bytes], scheme: Optional[bytes], path: Optional[bytes]) -> str:
    """The words of grpc's C-core (tritonserver 2.51, probed) for a request a gRPC client never sends.

    They are checked in its order; a request that passes the first four has no :authority (nor Host).
    Where 2.51 cannot read a value (a :method other than POST, GET or PUT, a :scheme other than http or
    https) it resets the stream, then sends trailers saying "Missing :method header" on it again and again:
    this server answers once, naming the header. A te other than "trailers" never comes here: it makes the
    request malformed (headers.py), its stream reset PROTOCOL_ERROR (2.51 resets it INTERNAL_ERROR).
    """
    if method is None:
        return "Missing :method header"
    if method != b"POST":
        return "Bad method header"
    if te is None:
        return "Missing :te header"
    if scheme is None:
        return "Missing :scheme header"
    if scheme not in _SCHEMES:
        return "Bad :scheme header"
    if path is None:
        return "Missing :path header"
    return "Missing :authority header"


class Http2Session:
    """The streams and calls of one connection (framing.FrameHandler: the reader hands it every frame)."""

    def __init__(
        self,
        state: GrpcServerState,
        loop: asyncio.AbstractEventLoop,
        *,
        write: Callable[[Buffer], None],
        write_all: Callable[[List[Buffer], int], None],
        close: Callable[[], None],
        abort: Callable[[], None],
        cut_off: Callable[[str], None],
        placeless: Callable[[], None],
    ) -> None:
        """A session sending through `write` or `write_all(pieces, size)`; `close()` ends gracefully, `abort()` at once.

        `cut_off(reason)` reports a connection ended for what its client did (logged once, cutoffs.py);
        `placeless()` that it holds no place under the cap any more (OpenConnections.placeless).
        """
        self._state = state
        self._placeless = placeless
        self._cut_off = cut_off
        self.loop = loop
        self._write = write
        self._close = close
        self.reader = FrameReader(self, state.max_header_block_bytes, state.max_continuations)
        self._decoder = HeaderBlockDecoder(state.max_header_list_bytes)
        self._streams: st.StreamTable[GrpcCall] = st.StreamTable()
        self.calls = self._streams.live
        self._partials: Dict[int, GrpcCall] = {}  # calls with a message still arriving, oldest first
        self._partial_bytes = 0  # what they buffer of them
        self._keepalive = Keepalive(state.keepalive, loop, send=write, busy=self._busy, abort=abort)
        self.inflow = ReceiveWindows(self._write_window_update)
        self.sender = ResponseSender(
            write,
            write_all,
            data_sent=self._keepalive.data_sent,
            ended=self._sent_end_stream,
            max_message_bytes=state.max_message_bytes,
            stalled=self._watch_windows,
            backlog=self._backlog,
        )
        # How a call's handler starts: at once, or (while the calls' answers wait past their bound) once they fall.
        self.start_handler: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] = loop.create_task
        self._sendable: Optional[asyncio.Future[None]] = None  # handlers held back wait on it
        self._window_timer: Optional[asyncio.TimerHandle] = None
        self._window_opened = 0  # WINDOW_UPDATE and SETTINGS frames from the client: it reads (windows_watch)
        self._window_looked = 0  # _window_opened at the last look
        # What _window_opened may reach before a WINDOW_UPDATE is a glitch (floods.py), as last counted, and what
        # the client's WINDOW_UPDATEs added to the connection's send window (with it, the bytes sent).
        self._window_earned = WINDOW_UPDATES_FREE
        self._connection_raised = 0
        self._floods = FloodGauges()
        self._clock = PhaseDeadline(loop, self._on_deadline)
        self._abort = abort
        self.over_cap = False  # one connection more than grpc_max_connections: calls get UNAVAILABLE
        self.lingers = False  # its close lingers (connection.py): it went away with the client still sending
        self.goaway = Goaway(loop, write)
        self.closed = False

    def start(self) -> None:
        """Send this server's settings and open the connection window; the client's preface must follow."""
        state = self._state
        settings = {
            h2.SETTINGS_MAX_CONCURRENT_STREAMS: state.max_concurrent_streams,
            h2.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.SETTINGS_MAX_HEADER_LIST_SIZE: state.max_header_list_bytes,
            h2.SETTINGS_MAX_FRAME_SIZE: MAX_FRAME,
        }
        self._write(h2.settings_frame(settings) + ReceiveWindows.opening())
        self._clock.enter(HANDSHAKE, state.handshake_timeout_s)
        self._keepalive.start()

    def stop(self) -> None:
        """Nothing more is read or sent but what is queued: timers stop (the connection is closing)."""
        self.closed = True
        self.reader.stopped = True
        self._clock.cancel()
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        self._keepalive.stop()
        self.goaway.done()

    def _watch_windows(self) -> None:
        """Answers began to wait for the client's flow-control windows: it must open one within send_timeout_s.

        The transport's send watch (send_watch.py) sees a client that reads nothing only once the socket's
        buffer is full; one that keeps its HTTP/2 windows shut never fills it, yet holds every answer of its
        calls in their outboxes (a stream's up to its bound of requests): without this, for as long as the
        connection lives. A client that sends no WINDOW_UPDATE (nor SETTINGS) for send_timeout_s while answers
        wait is let go, as one that reads none of a full buffer.
        """
        timeout_s = self._state.send_timeout_s
        if timeout_s and self._window_timer is None and not self.closed:
            self._window_looked = self._window_opened
            self._window_timer = self.loop.call_later(timeout_s, self._look_at_windows)

    def _look_at_windows(self) -> None:
        """send_timeout_s after answers began to wait (or after the last look): give up on a client that read none."""
        self._window_timer = None
        if self.closed or not self.sender.blocked:
            return
        if self._window_opened == self._window_looked:
            self._cut_off(f"it opened no window for its responses for {self._state.send_timeout_s:g} s")
            self._abort()
            return
        self._watch_windows()

    def _backlog(self, backlogged: bool) -> None:
        """The answers waiting for the client's windows passed their bound (responses.py), or fell back to half.

        Past it, new calls' handlers wait: a client that keeps its windows shut and sends call after call would
        otherwise make the server hold every answer until the send timeout. The connection still reads, so that
        the WINDOW_UPDATEs of a client that reads its answers bring the bytes down (and the handlers back).
        """
        if backlogged:
            self.start_handler = self._start_when_sendable
        else:
            self.start_handler = self.loop.create_task
            waiter, self._sendable = self._sendable, None
            wake(waiter)

    def _start_when_sendable(self, handler: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task that runs `handler` once the connection's answers no longer wait past their bound."""
        return self.loop.create_task(self._when_sendable(handler))

    async def _when_sendable(self, handler: Coroutine[Any, Any, None]) -> None:
        """Wait while the connection is backlogged, then run `handler` (closed unrun if the call ends first)."""
        try:
            while self.sender.backlogged:
                if self._sendable is None:
                    self._sendable = self.loop.create_future()
                await self._sendable
        except BaseException:  # cancelled while waiting (reset, deadline, connection lost): the handler never runs
            handler.close()
            raise
        await handler

    def cancel_calls(self) -> None:
        """The connection is lost: every call still in progress ends, and what waited to go out is let go now.

        Now, not when the calls are collected: a cancelled handler's traceback holds its call in a reference
        cycle, which only the cycle collector frees, maybe minutes later (a stream whose client left while 58
        answers of 8 MiB waited for its window held 460 MB until a full collection).
        """
        for call in self.calls.values():
            call.cancel()
            call.outbox.clear()
        self.calls.clear()
        self.sender.blocked.clear()
        self.sender.unsent = 0
        self._partials.clear()
        self._partial_bytes = 0

    def writable_again(self) -> None:
        """The transport's buffer drained: DATA held back goes out, streaming handlers may write again."""
        sender = self.sender
        sender.paused = False
        if sender.holding:
            sender.holding = False
            sender.pump_blocked()
        for call in list(self.calls.values()):
            if not call.outbox:
                wake(call.writable)

    @property
    def write_paused(self) -> bool:
        """Whether streaming handlers must wait before writing more."""
        return self.sender.paused

    # -- frames (framing.FrameHandler) ------------------------------------------------------------

    def on_data(self, stream_id: int, pieces: Sequence[Buffer], length: int, end_stream: bool) -> None:
        """Request bytes of a call (they count against the connection window whatever their stream)."""
        call = self.calls.get(stream_id)
        if call is None or st.RECEIVED[call.state][h2.DATA] != st.ACCEPT:
            self._unwanted_data(call, stream_id, length)
            return
        self.inflow.take(call, length)
        call.receive(pieces, length)
        if end_stream:
            self._end_of_request(call)

    def data_room(self, stream_id: int, limit: int) -> Optional[memoryview]:
        """Where up to `limit` bytes of a call's DATA may be read in place: its message's buffer, once one is begun."""
        call = self.calls.get(stream_id)
        return call.room(limit) if call is not None and st.RECEIVED[call.state][h2.DATA] == st.ACCEPT else None

    def on_data_in_place(self, stream_id: int, length: int, end_stream: bool) -> None:
        """Request bytes read into the room `data_room` gave."""
        call = self.calls.get(stream_id)
        if call is None or st.RECEIVED[call.state][h2.DATA] != st.ACCEPT:
            self._unwanted_data(call, stream_id, length)
            return
        self.inflow.take(call, length)
        call.receive((), length, in_place=True)
        if end_stream:
            self._end_of_request(call)

    def _unwanted_data(self, call: Optional[GrpcCall], stream_id: int, length: int) -> None:
        """DATA its stream's state does not take: counted against the connection window, then dropped or refused.

        Raises:
            StreamError, Http2Error: what the stream's state makes of DATA (or the connection window of its size).
        """
        action = st.RECEIVED[call.state if call is not None else self._streams.state_of(stream_id)][h2.DATA]
        self.inflow.take(None, length)
        self.inflow.dropped(length)
        if action == st.DROP:
            self.glitch()  # in flight when the stream closed, or sent to a closed stream: counted, not refused
        self._refuse(action, stream_id, "DATA")

    def on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        """A whole header block: a new call, a client's trailers ending its stream, or one to drop."""
        too_large: Optional[str] = None
        try:
            headers = self._decoder.decode(block)  # even when dropped: the block may change the HPACK table
        except HeaderListTooLarge as error:  # refused on its stream alone (grpc's C-core); trailers end it all the same
            headers, too_large = [], str(error)
        except MalformedHeaders:
            self._malformed_block(stream_id)
            return
        call = self.calls.get(stream_id)
        state = call.state if call is not None else self._streams.state_of(stream_id)
        action = st.RECEIVED[state][h2.HEADERS]
        if action == st.DROP:
            self.glitch()
        elif action != st.ACCEPT:
            self._refuse(action, stream_id, "HEADERS")
        elif call is not None:  # trailers: they must end the stream, without pseudo-headers (RFC 9113 section 8.1)
            if not flags & h2.END_STREAM or any(name[:1] == b":" for name, _ in headers):
                raise h2.StreamError(stream_id, h2.PROTOCOL_ERROR)
            self._end_of_request(call)
        elif stream_id % 2 == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, f"client stream {stream_id} has an even number")
        else:
            self._open(stream_id, headers, bool(flags & h2.END_STREAM), too_large)

    def on_self_dependent(self, stream_id: int, block: bytes) -> None:
        """A header block whose stream depends on itself: a stream error PROTOCOL_ERROR (RFC 9113 5.3.1).

        The block is decoded all the same (it may change the HPACK table); see `_malformed_block`.
        """
        try:
            self._decoder.decode(block)
        except (HeaderListTooLarge, MalformedHeaders):
            pass
        self._malformed_block(stream_id)

    def _malformed_block(self, stream_id: int) -> None:
        """A header block (decoded) that is a stream error PROTOCOL_ERROR: a malformed one, or one depending on itself.

        What a HEADERS is in its stream's state comes first (dropped, or a stream or connection error). A new stream
        opens nothing: it is reset, and counts as used (a HEADERS with a lower id is a connection error after it).

        Raises:
            StreamError: on a live stream (STREAM_CLOSED where its state refuses a HEADERS).
            Http2Error: where its state makes a HEADERS a connection error (an even or reused stream id).
        """
        call = self.calls.get(stream_id)
        action = st.RECEIVED[call.state if call is not None else self._streams.state_of(stream_id)][h2.HEADERS]
        if action == st.DROP:
            self.glitch()  # after the server's reset: frames on the stream are ignored (RFC 9113 5.1)
            return
        if action != st.ACCEPT:
            self._refuse(action, stream_id, "HEADERS")
        if call is not None:
            raise h2.StreamError(stream_id, h2.PROTOCOL_ERROR)
        if stream_id % 2 == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, f"client stream {stream_id} has an even number")
        self._streams.skip(stream_id, st.RESET_BY_SERVER)
        self._reset(stream_id, h2.PROTOCOL_ERROR)

    def on_rst_stream(self, stream_id: int) -> None:
        """The client cancelled a call; resets of live calls count against the rapid-reset limit (CVE-2023-44487).

        Past the limit, as nghttp2: GOAWAY ENHANCE_YOUR_CALM, and the calls in progress are still answered (a
        process's grpc clients share one connection: one client's storm of cancels must not fail the others'
        calls); none left, the connection ends at once. A reset of a stream closed already counts as a glitch.
        """
        call = self.calls.get(stream_id)
        action = st.RECEIVED[call.state if call is not None else self._streams.state_of(stream_id)][h2.RST_STREAM]
        if action == st.PROTOCOL_ERROR:
            self._refuse(action, stream_id, "RST_STREAM")
        if call is None:
            self.glitch()  # on a stream closed already: it moves nothing
            return
        if not self._floods.resets.spend(self.loop.time()) and not self.goaway.said:
            if len(self.calls) == 1:
                raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "too many stream resets")
            self._calm_down("too many stream resets")
        self._streams.move(call, st.RECV_RESET)
        call.cancel()
        self._forget(call)

    def _calm_down(self, why: str) -> None:
        """GOAWAY ENHANCE_YOUR_CALM naming the last call taken: no new call; close once those in progress end."""
        self.lingers = True  # the client may still be sending: a close with its bytes unread would reset the GOAWAY
        self.goaway.error(h2.ENHANCE_YOUR_CALM, why)
        self._cut_off(f"{why} (GOAWAY ENHANCE_YOUR_CALM; the calls in progress are answered)")

    def on_window_update(self, stream_id: int, increment: int) -> None:
        """More room to send, on the connection or on one stream."""
        self._window_opened += 1
        if self._window_opened > self._window_earned:
            self._earn_window_updates()
        sender = self.sender
        if stream_id == 0:
            sender.windows.raise_connection(increment)
            self._connection_raised += increment
            sender.pump_blocked()
            return
        call = self.calls.get(stream_id)
        action = st.RECEIVED[call.state if call is not None else self._streams.state_of(stream_id)][h2.WINDOW_UPDATE]
        if action != st.ACCEPT or call is None:
            self._refuse(action, stream_id, "WINDOW_UPDATE")  # dropped on a closed stream: in flight, legitimately
            return
        sender.windows.raise_stream(call, increment)
        if call.outbox:
            sender.pump(call)

    def _earn_window_updates(self) -> None:
        """More WINDOW_UPDATEs came than the connection had earned: count again; a glitch if that one is still past.

        The bytes sent are what WINDOW_UPDATEs added to the connection's window and it no longer has.
        """
        sent = h2.DEFAULT_WINDOW + self._connection_raised - self.sender.windows.window
        self._window_earned = window_updates_earned((self._streams.last_id + 1) // 2, sent)
        if self._window_opened > self._window_earned:
            self.glitch()

    def on_settings(self, flags: int, settings: List[Tuple[int, int]]) -> None:
        """The client's settings (acknowledged); the first ones complete its preface."""
        self._floods.settings.check(self.loop.time())
        if flags & h2.ACK:
            return
        self._window_opened += 1
        windows = self.sender.windows
        for key, value in settings:
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                windows.settings(value, None, self.calls.values())
            elif key == h2.SETTINGS_MAX_FRAME_SIZE:
                windows.settings(None, value, ())
            elif key == h2.SETTINGS_ENABLE_PUSH and value > 1:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
        self._write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        if self._clock.phase == HANDSHAKE:
            first_call_s = self._first_call_timeout_s()
            self._clock.enter(FIRST_CALL, first_call_s)
            # One over the cap waits for its first call like any other, to answer it UNAVAILABLE: grpc's clients
            # send a call only once the server's SETTINGS have come, and a GOAWAY before it made them open a
            # connection again and again, over the cap each time, until their deadline (DEADLINE_EXCEEDED).
            if self.over_cap and not first_call_s:  # no first-call deadline: an idle one must not hold on
                self.loop.call_soon(self._leave_over_cap)
        self.sender.pump_blocked()

    def on_ping(self, flags: int, payload: bytes) -> None:
        """Answer a ping; too many of them end the connection (grpc's ping strikes, then the flood counter)."""
        now = self.loop.time()
        self._floods.pings.check(now)
        if flags & h2.ACK:
            if payload == GOAWAY_PING:  # every stream the client opened before our GOAWAY has arrived
                self.shutdown()
            else:
                self._keepalive.ack_received()
            return
        self._write(h2.frame(h2.PING, h2.ACK, 0, payload))  # the one strike too many too, as grpc does
        if not self._keepalive.ping_received(now):
            # As grpc does: the GOAWAY, then the calls learn why. A client that closes the connection at a GOAWAY
            # of ENHANCE_YOUR_CALM (grpc-js) ends its calls RESOURCE_EXHAUSTED then, as with tritonserver.
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "too_many_pings", self._end_calls_pinged_too_often)

    def _write_window_update(self, frame: bytes) -> None:
        """Send a WINDOW_UPDATE: as headers and data do in grpc, it restarts the client's ping strikes."""
        self._write(frame)
        self._keepalive.data_sent()

    def _end_calls_pinged_too_often(self) -> None:
        """End every call in progress UNAVAILABLE: its client pinged too often."""
        for call in list(self.calls.values()):
            self.end_call(call, grpc.StatusCode.UNAVAILABLE, "Too many pings")

    def on_goaway(self) -> None:
        """The client is leaving: take no new call, close once those in progress are done."""
        self.goaway.said = True
        self._close_if_done()

    def on_stream_error(self, error: h2.StreamError) -> None:
        """Reset a stream whose frame was a stream error; the connection goes on.

        A PRIORITY frame may be one on a stream in any state. One the server reset already is not reset again
        (its frames are ignored, RFC 9113 5.1); an idle one is reset but stays idle, as PRIORITY opens no stream
        (5.1): the client may still open it, or one below it.
        """
        stream_id = error.stream_id
        call = self.calls.get(stream_id)
        if call is not None:
            self._reset(stream_id, error.code)
            self._streams.move(call, st.SEND_RESET)
            call.cancel()
            self._forget(call)
            return
        state = self._streams.state_of(stream_id)
        if state == st.RESET_BY_SERVER:
            self.glitch()
            return
        self._reset(stream_id, error.code)
        if state != st.IDLE:  # closed already (by the client): what still arrives is dropped now
            self._streams.remember(stream_id, st.RESET_BY_SERVER)

    def glitch(self) -> None:
        """A frame that carries nothing: counted, so that a flood of them ends the connection."""
        self._floods.glitches.check(self.loop.time())

    def _refuse(self, action: int, stream_id: int, kind: str) -> None:
        """What a frame the stream's state does not accept does: dropped, a stream error or a connection error."""
        if action == st.DROP:
            return
        if action == st.RESET:
            raise h2.StreamError(stream_id, h2.STREAM_CLOSED)
        if action == st.CLOSED_ERROR:
            raise h2.Http2Error(h2.STREAM_CLOSED, f"{kind} on closed stream {stream_id}")
        last_id = self._streams.last_id
        if stream_id <= last_id:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, f"{kind} on stream {stream_id}, below stream {last_id} opened")
        raise h2.Http2Error(h2.PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")

    # -- streams ------------------------------------------------------------------------------------

    def _open(self, stream_id: int, headers: List[Header], ended: bool, too_large: Optional[str] = None) -> None:
        """A request's headers: start its call, answer it at once, or refuse the stream.

        `too_large` (grpc's words for a header list over the limit) answers it RESOURCE_EXHAUSTED.
        """
        state = self._state
        if self.goaway.said or len(self.calls) >= state.max_concurrent_streams:
            self._streams.skip(stream_id, st.RESET_BY_SERVER)
            self._reset(stream_id, h2.REFUSED_STREAM)
            return
        path = http_method = content_type = timeout = encoding = accepted = te = scheme = authority = None
        content_length = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                http_method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"te":
                te = value
            elif name == b":scheme":
                scheme = value
            elif name == b":authority" or name == b"host":
                authority = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-accept-encoding":
                accepted = value
            elif name == b"content-length":  # digits, once: the decoder checked (gRPC clients send none)
                content_length = int(value)
        try:
            seconds = parse_timeout(timeout) if timeout is not None else None
        except ValueError:  # grpc's C-core (Triton) resets the stream: grpc clients say INTERNAL
            self._streams.skip(stream_id, st.RESET_BY_SERVER)
            self._reset(stream_id, h2.INTERNAL_ERROR)
            return
        self.goaway.last_accepted = stream_id
        sender = self.sender
        method = state.methods.get(path) if path is not None else None
        try:
            malformed = http_method != b"POST" or te != b"trailers" or scheme not in _SCHEMES or path is None
            if too_large is not None:
                sender.answer_status(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED, too_large)
            elif malformed or authority is None:
                sender.answer_status(stream_id, grpc.StatusCode.UNKNOWN, _malformed(http_method, te, scheme, path))
            elif content_type is None or not _grpc_content(content_type):
                sender.answer_http(stream_id, b"415")
            elif self.over_cap:
                sender.answer_status(stream_id, grpc.StatusCode.UNAVAILABLE, self._over_cap_details())
            elif method is None:
                # Triton's (grpc's C++ core) answer to a method or service it does not serve: no grpc-message
                sender.answer_status(stream_id, grpc.StatusCode.UNIMPLEMENTED, "")
            else:
                reader = MessageReader(
                    request_encoding(encoding), state.max_message_bytes, state.inflation_budget, state.receive_budget
                )
                if content_length is None:
                    call = GrpcCall(self, stream_id, method, headers, reader, sender.windows.initial)
                else:  # its DATA must add up to the length (RFC 9113 8.1.1): a stream error otherwise
                    call = SizedCall(self, stream_id, method, headers, reader, sender.windows.initial, content_length)
                self._start(call, seconds, accepted)
                if ended:
                    self._end_of_request(call)
                return
        except MessageError as error:
            sender.answer_status(stream_id, error.code, error.details)
        # answered at once: the stream closes (reset when the client has not ended it)
        if ended:
            self._streams.skip(stream_id, st.ENDED)
        else:
            self._streams.skip(stream_id, st.RESET_BY_SERVER)
            self._write(h2.rst_stream(stream_id, h2.NO_ERROR))
        if self.over_cap:
            self._leave_over_cap()

    def _start(self, call: GrpcCall, seconds: Optional[float], accepted: Optional[bytes]) -> None:
        """Open a call's stream (its deadline `seconds` away); a streaming handler starts now, a unary one later.

        A unary call's handler starts when its message is whole.
        """
        if not self.calls:
            self._clock.phase = APP  # a call is in progress: the connection is not idle
            self._state.cap.busy(self)  # nor reclaimed (connection_cap.py)
        self._streams.open(call)
        compression = self._state.compression_level
        if compression and call.method.name in _COMPRESSED_RPCS:
            call.encoding = response_encoding(compression, accepted)
        if seconds is not None:
            call.deadline = self.loop.call_later(seconds, call.expire)
        if call.method.streaming:
            call.start_streaming()

    def _end_of_request(self, call: GrpcCall) -> None:
        """The client ended its side of a call (END_STREAM)."""
        if call.state > st.HALF_CLOSED_LOCAL:
            return  # reading the frame ended the call (a refused message): its stream is closed already
        self._streams.move(call, st.RECV_END_STREAM)
        call.close_remote()

    def _sent_end_stream(self, call: GrpcCall) -> None:
        """A call's END_STREAM went out; reset the stream if the client is still sending (as grpc does)."""
        if call.state == st.OPEN:
            self._streams.move(call, st.SEND_END_STREAM)
            self._write(h2.rst_stream(call.stream_id, h2.NO_ERROR))
            self._streams.move(call, st.SEND_RESET)
        else:
            self._streams.move(call, st.SEND_END_STREAM)
        self._forget(call)

    def _forget(self, call: GrpcCall) -> None:
        """A call's stream closed: nothing more goes out or comes in for it."""
        if call.outbox:  # reset with DATA still waiting for window
            self.sender.drop(call)
        if call.held:
            self.inflow.dropped(call.held)
            call.held = 0
        call.end_share()
        if call.partial:
            before, call.partial = call.partial, 0
            self.buffering(call, before, 0)
        if call.writable is not None:
            wake(call.writable)
        if not self.calls and not self.closed:
            self._clock.enter(IDLE, self._state.idle_timeout_s)
            if not self.goaway.said:
                self._state.cap.waiting(self)
            self._close_if_done()

    def buffering(self, call: GrpcCall, before: int, after: int) -> bool:
        """A call buffers `after` bytes of a message still arriving (`before` until now); whether its room must wait.

        Past grpc_max_buffered_bytes on the connection, only the oldest such call gets its room back (its message
        can complete, and then the next oldest goes on); the others' clients wait for window.
        """
        self._partial_bytes += after - before
        partials = self._partials
        if not after:
            partials.pop(call.stream_id, None)
            if call.stalled:
                self.inflow.release(call, call.remote_open)
            self._release_stalled()
            return False
        if not before:
            partials[call.stream_id] = call
        elif after < before:
            self._release_stalled()
        return self._partial_bytes > self._state.max_buffered_bytes and self._first_going() is not call

    def _first_going(self) -> Optional[GrpcCall]:
        """The oldest call with a message still arriving that does not wait for the receive budget.

        The one that goes on past grpc_max_buffered_bytes: one that waits for the budget may wait for a message
        of this very connection, which must then be able to complete.
        """
        for call in self._partials.values():
            if not call.waiting:
                return call
        return None

    def _release_stalled(self) -> None:
        """The connection buffers less: stalled streams get their room back (the oldest alone while over the bound).

        Those that wait for the receive budget keep waiting (`granted`).
        """
        over = self._partial_bytes > self._state.max_buffered_bytes
        for call in self._partials.values():
            if call.waiting:
                continue
            if call.stalled:
                self.inflow.release(call, call.remote_open)
            if over:
                return

    def granted(self, call: GrpcCall) -> None:
        """`call`'s message has its share of the receive budget: its stream's room comes back, bound permitting."""
        if not call.stalled:
            return
        if self._partial_bytes > self._state.max_buffered_bytes and self._first_going() is not call:
            return
        self.inflow.release(call, call.remote_open)

    def _reset(self, stream_id: int, code: int) -> None:
        """Reset a stream for an error (counted: a client must not make the server reset streams at will)."""
        self._write(h2.rst_stream(stream_id, code))
        self.glitch()

    def _busy(self) -> bool:
        """Whether calls are in progress."""
        return bool(self.calls)

    # -- what calls ask of their session ----------------------------------------------------------

    def send_unary_response(self, call: GrpcCall, parts: Sequence[Buffer], size: int, compressed: bool = False) -> None:
        """A unary call's response and its OK status, in one write when flow control allows.

        `compressed`: the parts are the message already compressed with the call's encoding.
        """
        self.sender.unary(call, parts, size, compressed)

    def send_message(self, call: GrpcCall, parts: Sequence[Buffer], size: int, compressed: bool = False) -> None:
        """One response message of a streaming call (`compressed`: as `send_unary_response`'s)."""
        self.sender.message(call, parts, size, compressed)

    def end_call(self, call: GrpcCall, code: grpc.StatusCode, details: str) -> None:
        """Send a call's status (after its queued DATA); stop its handler if it is still running."""
        if self.sender.end(call, code, details):
            if call.task is not asyncio.current_task():
                call.stop_task()  # the deadline passed, or a request message was refused, while the handler ran

    # -- going away -------------------------------------------------------------------------------

    def _first_call_timeout_s(self) -> float:
        """How long a connection whose preface is done may wait before its first call (0: no limit).

        The handshake timeout again, or the idle timeout if that is shorter. Under the idle timeout alone (300 s),
        a client that sent the preface and SETTINGS and nothing more was held 30 times as long as one that sent
        nothing; 1,000 such connections cost the client nothing to keep, and the cap of connections let no one
        else in. grpc's C-core holds them for ever (its handshake deadline ends with the SETTINGS, and
        max_connection_idle is infinite by default); h2o says GOAWAY to any HTTP/2 connection idle for 10 s
        (http2-idle-timeout), nghttpx after 3 minutes without a stream (frontend-http2-idle-timeout). A
        connection that has served calls keeps the idle timeout between them: clients keep their channels open.
        """
        state = self._state
        limits = [timeout for timeout in (state.handshake_timeout_s, state.idle_timeout_s) if timeout]
        return min(limits) if limits else 0.0

    def _on_deadline(self, phase: int) -> None:
        """No preface in time (close at once), or no call for too long (GOAWAY, then close)."""
        if phase == HANDSHAKE:
            self._cut_off(f"no HTTP/2 preface and SETTINGS within {self._state.handshake_timeout_s:g} s")
            self._abort()
        elif self.over_cap:
            self._leave_over_cap()
        else:
            self.shutdown()

    async def leave(self) -> None:
        """A graceful GOAWAY (goaway.py): the client opens its next calls elsewhere; returns once the final is out."""
        await self.goaway.leave(self.shutdown, self.closed)

    def _over_cap_details(self) -> str:
        """Why a connection over grpc_max_connections is refused."""
        return f"the server serves at most {self._state.max_connections} gRPC connections at once"

    def _leave_over_cap(self) -> None:
        """GOAWAY for a connection over grpc_max_connections, saying why; it closes once its calls are answered."""
        if not self.closed and not self.goaway.said:
            details = self._over_cap_details()
            self.goaway.now(details.encode())
            self._cut_off(f"{details} (grpc_max_connections; GOAWAY NO_ERROR)")
        self._close_if_done()

    def reclaim(self) -> None:
        """Make room for a new connection: the server is at its cap and this one has had no call for the longest.

        GOAWAY NO_ERROR saying why, then close: a grpc client opens a new connection for its next call (one it
        sent meanwhile, past the GOAWAY's last stream, it sends again there).
        """
        if self.closed or self.goaway.said:
            return
        details = f"{self._over_cap_details()}: one without a call for the longest makes room for a new one"
        self._placeless()
        LOGGER.debug("gRPC connection closed for a new one (%s)", details)
        self.goaway.now(details.encode())
        self._close_if_done()

    def shutdown(self) -> None:
        """Refuse new calls (GOAWAY), finish those in progress, then close."""
        if not self.closed:
            self.goaway.now()
        self._close_if_done()

    def _close_if_done(self) -> None:
        """Close a connection that said (or heard) GOAWAY once no call is left."""
        if self.goaway.said and not self.calls and not self.closed:
            self._close()
