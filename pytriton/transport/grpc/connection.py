"""One HTTP/2 connection of the gRPC server: frames in, calls started, responses out under flow control.

What a gRPC client needs of HTTP/2 and nothing more: no server push, no priorities (PRIORITY frames
are read and ignored), no HTTP/1.1 upgrade. Writes made while the loop runs one callback are sent
together at its end (one system call for every response a batch completed).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import grpc
import hpack

from pytriton.core.raw_tensors import Buffer
from pytriton.core.waiters import wake
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc.call import GrpcCall, parse_timeout
from pytriton.transport.grpc.headers import STATUS_200, Header, HeaderBlockDecoder, encode_block
from pytriton.transport.grpc.messages import (
    ACCEPT_ENCODING,
    MessageError,
    MessageReader,
    frame_message,
    request_encoding,
    response_encoding,
)

if TYPE_CHECKING:
    from pytriton.transport.grpc.server import GrpcServerState

LOGGER = logging.getLogger(__name__)

# What this server lets a client send before it reads: 4 MiB a stream, 16 MiB in all (raised as it reads).
STREAM_WINDOW = 4 * 2**20
CONNECTION_WINDOW = 16 * 2**20
# A client must send the connection preface within this time.
HANDSHAKE_TIMEOUT_S = 20.0
# Writes above this size go out with writev rather than joined into one buffer.
_JOIN_LIMIT_BYTES = 64 * 1024
# How long a connection that failed keeps reading (and dropping) after its GOAWAY.
_LINGER_S = 2.0
# grpc's interval for pings received while no call is in progress, unless permit_without_calls.
_IDLE_PING_INTERVAL_S = 7200.0
# The PING that follows a graceful GOAWAY, and how long its acknowledgement may take before the final GOAWAY.
_GOAWAY_PING = b"goaway\x00\x00"
_GOAWAY_PING_TIMEOUT_S = 1.0

_OK_TRAILERS = encode_block([(b"grpc-status", b"0")])


def _response_head(encoding: Optional[str]) -> bytes:
    """The response headers of a call whose responses use `encoding`."""
    fields = [(b"content-type", b"application/grpc"), (b"grpc-accept-encoding", ACCEPT_ENCODING)]
    if encoding is not None:
        fields.append((b"grpc-encoding", encoding.encode()))
    return STATUS_200 + encode_block(fields)


_RESPONSE_HEADS = {encoding: _response_head(encoding) for encoding in (None, "gzip", "deflate")}
_TRAILERS_ONLY_HEAD = STATUS_200 + encode_block([(b"content-type", b"application/grpc")])


def _percent_encoded(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as is, every other UTF-8 byte as %XX."""
    return b"".join(
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in text.encode()
    )


def _status_block(code: grpc.StatusCode, details: str) -> bytes:
    """Trailer fields carrying a status."""
    if code is grpc.StatusCode.OK and not details:
        return _OK_TRAILERS
    fields: List[Header] = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        fields.append((b"grpc-message", _percent_encoded(details)))
    return encode_block(fields)


class _Trailers:
    """The status of a call whose last DATA still waits for flow-control window."""

    __slots__ = ("block",)

    def __init__(self, block: bytes) -> None:
        self.block = block


class GrpcConnection(asyncio.Protocol):
    """An HTTP/2 connection serving gRPC calls on the engine's loop."""

    def __init__(self, state: GrpcServerState, loop: asyncio.AbstractEventLoop) -> None:
        """A connection of the server whose shared state is `state`."""
        self._state = state
        self.loop = loop
        self._transport: Optional[asyncio.Transport] = None
        self.peer = "unknown"
        self._decoder = HeaderBlockDecoder(state.max_header_list_bytes)
        self._pending = b""  # the start of a frame whose end has not arrived
        self._preface_seen = False
        self._continuation: Optional[Tuple[int, int, List[bytes]]] = None  # HEADERS awaiting CONTINUATION
        self._continuation_bytes = 0
        self._calls: Dict[int, GrpcCall] = {}
        self._blocked: Dict[int, GrpcCall] = {}  # calls with DATA waiting for window
        self._last_stream_id = 0
        self._send_window = h2.DEFAULT_WINDOW
        self._peer_stream_window = h2.DEFAULT_WINDOW
        self._peer_max_frame = h2.DEFAULT_MAX_FRAME
        self._received = 0  # bytes of DATA read since the connection window was last raised
        self._out: List[Buffer] = []
        self._out_bytes = 0
        self._flush_pending = False
        self._reading = False
        self.write_paused = False
        self._goaway_sent = False
        self._final_goaway: Optional[asyncio.Future[None]] = None  # leave() waits on it
        self._closed = False
        self._timers: Dict[str, asyncio.TimerHandle] = {}
        self._pings_without_data = 0
        self._ping_strikes = 0
        self._last_ping_received: Optional[float] = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send this server's settings and open the connection window; the client's preface must follow."""
        self._transport = transport  # type: ignore[assignment]
        self._state.connections.add(self)
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple):
            host, port = peername[0], peername[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self._write(
            h2.settings_frame(
                {
                    h2.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    h2.SETTINGS_MAX_HEADER_LIST_SIZE: self._state.max_header_list_bytes,
                }
            )
            + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)
        )
        self._timers["handshake"] = self.loop.call_later(HANDSHAKE_TIMEOUT_S, self.abort)
        keepalive = self._state.keepalive
        if keepalive.time_ms > 0:
            self._timers["keepalive"] = self.loop.call_later(keepalive.time_ms / 1000, self._keepalive)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        """Cancel every call still in progress."""
        self._closed = True
        wake(self._final_goaway)
        self._state.connections.forget(self)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for call in self._calls.values():
            call.cancel()
        self._calls.clear()
        self._blocked.clear()

    def pause_writing(self) -> None:
        """The client reads slower than we answer: stop reading requests until it catches up."""
        self.write_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        """The client caught up: read again, and let streaming handlers write again."""
        self.write_paused = False
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()
        for call in list(self._calls.values()):
            if not call.outbox:
                wake(call.writable)

    def data_received(self, data: bytes) -> None:
        """Read every whole frame that arrived; keep the start of a partial one."""
        if self._closed:
            return  # after a connection error: read and dropped until the linger ends
        if self._pending:
            data = self._pending + data
            self._pending = b""
        self._reading = True
        try:
            self._read_frames(data)
        except h2.Http2Error as error:
            self._fail(error.code, str(error))
        except hpack.HPACKError as error:
            self._fail(h2.COMPRESSION_ERROR, f"invalid header block: {error}")
        finally:
            self._reading = False
        if self._received:
            self._write(h2.window_update(0, self._received))
            self._received = 0
        if self._out:
            self._flush()

    def _read_frames(self, data: bytes) -> None:
        """Dispatch the frames of `data` by type."""
        position, size = 0, len(data)
        if not self._preface_seen:
            if size < len(h2.PREFACE):
                if not h2.PREFACE.startswith(data):
                    raise h2.Http2Error(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._pending = data
                return
            if not data.startswith(h2.PREFACE):
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface_seen = True
            self._timers.pop("handshake").cancel()
            position = len(h2.PREFACE)
        unpack = h2.FRAME_HEADER.unpack_from
        while size - position >= h2.FRAME_HEADER_SIZE and not self._closed:
            high, low, kind, flags, stream_id = unpack(data, position)
            length = (high << 8) | low
            if length > h2.DEFAULT_MAX_FRAME:
                raise h2.Http2Error(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes is over SETTINGS_MAX_FRAME_SIZE")
            end = position + h2.FRAME_HEADER_SIZE + length
            if end > size:
                break
            payload = data[position + h2.FRAME_HEADER_SIZE : end]
            position = end
            stream_id &= 0x7FFFFFFF
            if self._continuation is not None and kind != h2.CONTINUATION:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "a header block was interrupted")
            if kind == h2.DATA:
                self._on_data(stream_id, flags, payload, length)
            elif kind == h2.HEADERS:
                self._on_headers(stream_id, flags, payload)
            elif kind == h2.WINDOW_UPDATE:
                self._on_window_update(stream_id, payload)
            elif kind == h2.PING:
                self._on_ping(stream_id, flags, payload)
            elif kind == h2.SETTINGS:
                self._on_settings(stream_id, flags, payload)
            elif kind == h2.RST_STREAM:
                self._on_rst_stream(stream_id, payload)
            elif kind == h2.CONTINUATION:
                self._on_continuation(stream_id, flags, payload)
            elif kind == h2.GOAWAY:
                self._shutdown_when_idle()
            elif kind == h2.PUSH_PROMISE:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "a client cannot push")
            # PRIORITY and unknown frame types are ignored, as RFC 9113 asks.
        if position < size:
            self._pending = data[position:]

    # -- frames ---------------------------------------------------------------------------------

    def _on_headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        """A header block starts (or is whole): a new call, or a client's trailers ending its stream."""
        if stream_id == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = h2.strip_padding(payload, flags) if flags & (h2.PADDED | h2.PRIORITY_FLAG) else payload
        if not flags & h2.END_HEADERS:
            self._continuation = (stream_id, flags, [block])
            self._continuation_bytes = len(block)
            return
        self._on_header_block(stream_id, flags, block)

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        """More of a header block."""
        started = self._continuation
        if started is None or started[0] != stream_id:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        started[2].append(payload)
        self._continuation_bytes += len(payload)
        if self._continuation_bytes > self._state.max_header_list_bytes:
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "header block too large")
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._on_header_block(stream_id, started[1], b"".join(started[2]))

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        """A whole header block."""
        headers = self._decoder.decode(block)
        call = self._calls.get(stream_id)
        if call is not None:  # trailers: they must end the stream
            if not flags & h2.END_STREAM:
                self._reset(stream_id, h2.PROTOCOL_ERROR)
                self._drop(call)
                return
            self._close_remote(call)
            return
        if stream_id % 2 == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, f"client stream {stream_id} has an even number")
        if stream_id <= self._last_stream_id:
            return  # a stream this server already ended
        self._last_stream_id = stream_id
        if self._goaway_sent:
            self._reset(stream_id, h2.REFUSED_STREAM)
            return
        self._open_call(stream_id, headers, bool(flags & h2.END_STREAM))

    def _open_call(self, stream_id: int, headers: List[Header], ended: bool) -> None:
        """Start a call for a request's headers, or answer at once when they cannot start one."""
        state = self._state
        path = http_method = content_type = timeout = encoding = accepted = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                http_method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-accept-encoding":
                accepted = value
        if http_method != b"POST":
            self._answer_http(stream_id, b"405", ended)
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self._answer_http(stream_id, b"415", ended)
            return
        method = state.methods.get(path) if path is not None else None
        if method is None:
            self._answer_status(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!", ended)
            return
        try:
            reader = MessageReader(request_encoding(encoding), state.max_message_bytes)
        except MessageError as error:
            self._answer_status(stream_id, error.code, error.details, ended)
            return
        call = GrpcCall(self, stream_id, method, headers, reader, self._peer_stream_window)
        self._calls[stream_id] = call
        if state.compression_level:
            call.encoding = response_encoding(state.compression_level, accepted)
        if timeout is not None:
            seconds = parse_timeout(timeout)
            if seconds is not None:
                call.deadline = self.loop.call_later(seconds, call.expire)
        if method.streaming:
            call.start_streaming()
        if ended:
            self._close_remote(call)

    def _on_data(self, stream_id: int, flags: int, payload: bytes, length: int) -> None:
        """Request bytes of a call (they count against the connection window whatever their stream)."""
        self._received += length
        call = self._calls.get(stream_id)
        if call is None:
            if stream_id == 0 or stream_id > self._last_stream_id:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream this server already ended
        if call.remote_closed:
            self._reset(stream_id, h2.STREAM_CLOSED)
            self._drop(call)
            return
        if flags & h2.PADDED:
            payload = h2.strip_padding(payload, h2.PADDED)
        if payload and not call.ended:
            call.receive(payload)
        if flags & h2.END_STREAM:
            self._close_remote(call)
            return
        call.unreplenished += length
        if call.unreplenished >= STREAM_WINDOW // 2:
            self._write(h2.window_update(stream_id, call.unreplenished))
            call.unreplenished = 0

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        """More room to send, on the connection or on one stream."""
        if len(payload) != 4:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        increment = h2.read_uint32(payload)
        if stream_id == 0:
            if increment == 0:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > h2.MAX_WINDOW:
                raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            for blocked in list(self._blocked.values()):
                self._pump(blocked)
            return
        call = self._calls.get(stream_id)
        if call is None:
            return
        if increment == 0 or call.send_window + increment > h2.MAX_WINDOW:
            self._reset(stream_id, h2.PROTOCOL_ERROR if increment == 0 else h2.FLOW_CONTROL_ERROR)
            self._drop(call)
            return
        call.send_window += increment
        if call.outbox:
            self._pump(call)

    def _on_settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        """The client's settings (acknowledged); an acknowledgement of ours needs nothing."""
        if stream_id != 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2.ACK:
            return
        for key, value in h2.read_settings(payload):
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == h2.SETTINGS_MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                    raise h2.Http2Error(h2.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
        self._write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        for call in list(self._blocked.values()):
            self._pump(call)

    def _on_ping(self, stream_id: int, flags: int, payload: bytes) -> None:
        """Answer a ping; count it against the client when it pings more often than allowed (grpc's ping strikes)."""
        if stream_id != 0 or len(payload) != 8:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "malformed PING")
        if flags & h2.ACK:
            if payload == _GOAWAY_PING:
                self.shutdown()
                return
            timer = self._timers.pop("ping", None)
            if timer is not None:
                timer.cancel()
            return
        keepalive = self._state.keepalive
        now = self.loop.time()
        last, self._last_ping_received = self._last_ping_received, now
        if last is not None:
            allowed = (
                keepalive.min_recv_ping_interval_without_data_ms / 1000
                if keepalive.permit_without_calls or self._calls
                else _IDLE_PING_INTERVAL_S
            )
            if now - last < allowed:
                self._ping_strikes += 1
                if keepalive.max_ping_strikes and self._ping_strikes > keepalive.max_ping_strikes:
                    for call in list(self._calls.values()):  # as grpc does: the calls learn why
                        self.end_call(call, grpc.StatusCode.UNAVAILABLE, "Too many pings")
                    self._fail(h2.ENHANCE_YOUR_CALM, "too_many_pings")
                    return
        self._write(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        """The client cancelled a call."""
        if len(payload) != 4:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
        if stream_id == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        call = self._calls.get(stream_id)
        if call is not None:
            self._drop(call)

    # -- calls ----------------------------------------------------------------------------------

    def _close_remote(self, call: GrpcCall) -> None:
        """The client ended its side of a call."""
        call.close_remote()
        if call.ended and not call.outbox:
            self._calls.pop(call.stream_id, None)

    def _drop(self, call: GrpcCall) -> None:
        """Forget a call that was reset, and stop its handler."""
        self._calls.pop(call.stream_id, None)
        self._blocked.pop(call.stream_id, None)
        call.outbox.clear()
        call.cancel()
        self._shutdown_if_done()

    def send_unary_response(self, call: GrpcCall, parts: Sequence[Buffer], size: int) -> None:
        """A unary call's response and its OK status, in one write when flow control allows."""
        if call.ended:
            return
        message = frame_message(parts, size, call.encoding, self._state.max_message_bytes)
        total = len(message)
        stream_id = call.stream_id
        if total <= self._peer_max_frame and total <= self._send_window and total <= call.send_window:
            self._send_window -= total
            call.ended = call.started = True
            if call.deadline is not None:
                call.deadline.cancel()
            self._reset_ping_clock()
            self._write(
                b"".join(
                    (
                        h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, _RESPONSE_HEADS[call.encoding]),
                        h2.frame_header(total, h2.DATA, 0, stream_id),
                        message,
                        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, _OK_TRAILERS),
                    )
                )
            )
            self._calls.pop(stream_id, None)
            self._shutdown_if_done()
            return
        self._send_message(call, message)
        self.end_call(call, grpc.StatusCode.OK, "")

    def send_message(self, call: GrpcCall, parts: Sequence[Buffer], size: int) -> None:
        """One response message of a streaming call."""
        if not call.ended:
            self._send_message(call, frame_message(parts, size, call.encoding, self._state.max_message_bytes))

    def end_call(self, call: GrpcCall, code: grpc.StatusCode, details: str) -> None:
        """Send a call's status (after its queued DATA); reset the stream if the client is still sending."""
        if call.ended:
            return
        call.ended = True
        if call.deadline is not None:
            call.deadline.cancel()
        if not call.started:
            self._write_trailers_only(call.stream_id, code, details)
            self._finish(call)
        elif call.outbox:
            call.outbox.append(_Trailers(_status_block(code, details)))
        else:
            self._write_trailers(call.stream_id, _status_block(code, details))
            self._finish(call)
        task = call.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()  # the deadline passed, or a request message was refused, while the handler ran

    def _finish(self, call: GrpcCall) -> None:
        """The status of a call is out: forget it, resetting the stream if the client has not ended its side."""
        if not call.remote_closed:
            self._reset(call.stream_id, h2.NO_ERROR)
            call.remote_closed = True
        self._calls.pop(call.stream_id, None)
        self._blocked.pop(call.stream_id, None)
        wake(call.writable)
        self._shutdown_if_done()

    def _answer_http(self, stream_id: int, status: bytes, ended: bool) -> None:
        """Answer a request that is not a gRPC call with a bare HTTP status."""
        self._write(
            h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, encode_block([(b":status", status)]))
        )
        if not ended:
            self._reset(stream_id, h2.NO_ERROR)

    def _answer_status(self, stream_id: int, code: grpc.StatusCode, details: str, ended: bool) -> None:
        """End a call that never started with a status."""
        self._write_trailers_only(stream_id, code, details)
        if not ended:
            self._reset(stream_id, h2.NO_ERROR)

    def _write_trailers_only(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """A status without a response: one HEADERS frame ending the stream."""
        self._write_trailers(stream_id, _TRAILERS_ONLY_HEAD + _status_block(code, details))

    def _write_trailers(self, stream_id: int, block: bytes) -> None:
        """The HEADERS frame that ends a stream."""
        self._reset_ping_clock()
        self._write(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, block))

    # -- DATA under flow control ----------------------------------------------------------------

    def _send_message(self, call: GrpcCall, message: bytes) -> None:
        """Send a framed message on a call (its headers first), or queue what the windows hold back."""
        stream_id = call.stream_id
        if not call.started:
            call.started = True
            self._write(h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, _RESPONSE_HEADS[call.encoding]))
        self._reset_ping_clock()
        total = len(message)
        if (
            not call.outbox
            and total <= self._peer_max_frame
            and total <= self._send_window
            and total <= call.send_window
        ):
            self._send_window -= total
            call.send_window -= total
            self._write(h2.frame_header(total, h2.DATA, 0, stream_id))
            self._write(message)
            return
        call.outbox.append(memoryview(message))
        self._pump(call)

    def _pump(self, call: GrpcCall) -> None:
        """Send as much of a call's queued DATA (and then its status) as the windows allow."""
        outbox = call.outbox
        stream_id = call.stream_id
        while outbox:
            item = outbox[0]
            if isinstance(item, _Trailers):
                outbox.popleft()
                self._write_trailers(stream_id, item.block)
                self._finish(call)
                return
            room = min(self._send_window, call.send_window, self._peer_max_frame)
            if room <= 0:
                self._blocked[stream_id] = call
                return
            chunk = item[:room]
            if len(chunk) == len(item):
                outbox.popleft()
            else:
                outbox[0] = item[room:]
            self._send_window -= len(chunk)
            call.send_window -= len(chunk)
            self._write(h2.frame_header(len(chunk), h2.DATA, 0, stream_id))
            self._write(chunk)
        self._blocked.pop(stream_id, None)
        if not self.write_paused:
            wake(call.writable)

    # -- writing --------------------------------------------------------------------------------

    def _write(self, data: Buffer) -> None:
        """Queue bytes for the end of this loop callback."""
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flush_pending:
            self._flush_pending = True
            if not self._reading:
                self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send what was queued, in one system call."""
        out, self._out = self._out, []
        size, self._out_bytes = self._out_bytes, 0
        self._flush_pending = False
        transport = self._transport
        if not out or transport is None or self._closed:
            return
        if size > _JOIN_LIMIT_BYTES and len(out) > 1:
            transport.writelines(out)
        else:
            transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _reset(self, stream_id: int, code: int) -> None:
        """Reset a stream."""
        self._write(h2.rst_stream(stream_id, code))

    # -- keepalive ------------------------------------------------------------------------------

    def _reset_ping_clock(self) -> None:
        """Headers or data went out: pings are welcome again (grpc's ping strikes restart)."""
        self._pings_without_data = 0
        self._ping_strikes = 0
        self._last_ping_received = None

    def _keepalive(self) -> None:
        """Ping the client every keepalive time; close the connection if it does not answer in time."""
        keepalive = self._state.keepalive
        self._timers["keepalive"] = self.loop.call_later(keepalive.time_ms / 1000, self._keepalive)
        if not (keepalive.permit_without_calls or self._calls) or "ping" in self._timers:
            return
        if keepalive.max_pings_without_data and self._pings_without_data >= keepalive.max_pings_without_data:
            return
        self._pings_without_data += 1
        self._write(h2.frame(h2.PING, 0, 0, os.urandom(8)))
        self._timers["ping"] = self.loop.call_later(keepalive.timeout_ms / 1000, self.abort)

    # -- closing --------------------------------------------------------------------------------

    async def leave(self) -> None:
        """Ask the client to start its next calls on a new connection while this one still serves (RFC 9113 6.8).

        A GOAWAY naming the highest stream id stops the client from opening streams here without refusing any;
        the client acknowledges the PING after every stream it sent before it read the GOAWAY, so the final
        GOAWAY, sent on that acknowledgement (or after a second without one), names the true last stream and
        refuses none of them. Returns once the final GOAWAY is out.
        """
        if self._final_goaway is None:
            self._final_goaway = self.loop.create_future()
            if self._goaway_sent or self._closed:
                wake(self._final_goaway)
            else:
                self._write(h2.goaway(h2.MAX_STREAM_ID, h2.NO_ERROR) + h2.frame(h2.PING, 0, 0, _GOAWAY_PING))
                self._timers["goaway"] = self.loop.call_later(_GOAWAY_PING_TIMEOUT_S, self.shutdown)
        await self._final_goaway

    def shutdown(self) -> None:
        """Refuse new calls (GOAWAY), finish those in progress, then close."""
        timer = self._timers.pop("goaway", None)
        if timer is not None:
            timer.cancel()
        if not self._goaway_sent and not self._closed:
            self._goaway_sent = True
            self._write(h2.goaway(self._last_stream_id, h2.NO_ERROR))
        wake(self._final_goaway)
        self._shutdown_if_done()

    def _shutdown_when_idle(self) -> None:
        """The client said GOAWAY: close once the calls in progress are done."""
        self._goaway_sent = True
        self._shutdown_if_done()

    def _shutdown_if_done(self) -> None:
        """Close a connection that said GOAWAY once no call is left."""
        if self._goaway_sent and not self._calls and self._transport is not None and not self._closed:
            self._flush()
            self._transport.close()
            self._closed = True

    def _fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY with its code, then close once the client has had time to read it.

        Closing with the client's bytes still unread would answer them with a TCP reset, which can
        overtake the GOAWAY; so the write side shuts down and what still arrives is read and dropped
        for a moment (as grpc and nghttp2 do).
        """
        LOGGER.debug("gRPC connection from %s: %s", self.peer, message)
        self._goaway_sent = True
        self._write(h2.goaway(self._last_stream_id, code, message.encode()))
        self._flush()
        self._closed = True
        transport = self._transport
        if transport is None:
            return
        if transport.can_write_eof():
            transport.write_eof()
            self._timers["linger"] = self.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def abort(self) -> None:
        """Close at once: no preface in time, no answer to a keepalive ping, or the end of the stop grace."""
        if self._transport is not None:
            self._transport.abort()
