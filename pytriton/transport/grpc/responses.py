"""What the server sends on a call: response headers, messages under flow control, and the status.

A unary response leaves as HEADERS, DATA and trailers in one write when the windows allow. What the
windows hold back waits in the call's outbox (DATA, then the trailers) until the client opens them; so does
every call's DATA while the connection reads on for a client behind on its answers (`holding`, read_gate.py),
so that what it keeps for a client that does not read stays bounded by the calls it may open at once.

Past UNSENT_BOUND_BYTES waiting in the outboxes the connection is `backlogged`: it takes no new call until they
fall to half of it (session.py holds new calls' handlers back; the calls already running answer as before).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import grpc

from pytriton.core.tensors.raw_tensors import Buffer, unchanging
from pytriton.core.waiters import wake
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc.call import GrpcCall
from pytriton.transport.grpc.flow import SendWindows
from pytriton.transport.grpc.headers import STATUS_200, Header, encode_block
from pytriton.transport.grpc.messages import ACCEPT_ENCODING, SCATTER_BYTES, frame_message, message_pieces

_OK_TRAILERS = encode_block([(b"grpc-status", b"0")])

# What a connection's answers may hold waiting for its client's windows before it takes no new call. A client
# that keeps its windows shut (SETTINGS_INITIAL_WINDOW_SIZE 0, no WINDOW_UPDATE) otherwise had every answer of
# the calls it kept sending held until the send timeout (100 calls of 8 MiB: 760 MB on one connection). A few
# large answers: one that reads gets its next calls as soon as it has read half of them.
UNSENT_BOUND_BYTES = 32 * 2**20


def _response_head(encoding: Optional[str]) -> bytes:
    """The response headers of a call whose responses use `encoding`."""
    fields = [(b"content-type", b"application/grpc"), (b"grpc-accept-encoding", ACCEPT_ENCODING)]
    if encoding is not None:
        fields.append((b"grpc-encoding", encoding.encode()))
    return STATUS_200 + encode_block(fields)


_RESPONSE_HEADS = {encoding: _response_head(encoding) for encoding in (None, "gzip", "deflate")}
_TRAILERS_ONLY_HEAD = STATUS_200 + encode_block([(b"content-type", b"application/grpc")])


# The longest grpc-message this server sends, percent-encoded. grpc's C-core server sends a message of any
# length, but gRPC clients limit the trailers they take (PROTOCOL-HTTP2.md suggests 8 KiB; C-core's clients
# refuse over 8 KiB at random and over 16 KiB always, grpc-java over 8 KiB): past that the caller sees
# RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of the status. Envoy cuts its messages to fit
# 8 KiB likewise. A longer message is cut at a character and ends with "...".
MAX_GRPC_MESSAGE_BYTES = 4096
_CUT_MARK = b"..."


def _grpc_message(details: str) -> bytes:
    """grpc-message's value: printable ASCII but '%' as is, every other UTF-8 byte as %XX; cut to the cap.

    A lone surrogate, which UTF-8 cannot encode, goes as its backslash escape: the call still gets its status.
    """
    raw = details.encode("utf-8", "backslashreplace")
    pieces = [
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
        for byte in raw[:MAX_GRPC_MESSAGE_BYTES]  # each byte takes one to three: no more can fit
    ]
    if len(raw) <= MAX_GRPC_MESSAGE_BYTES and sum(map(len, pieces)) <= MAX_GRPC_MESSAGE_BYTES:
        return b"".join(pieces)
    budget, size, kept = MAX_GRPC_MESSAGE_BYTES - len(_CUT_MARK), 0, 0
    for piece in pieces:
        size += len(piece)
        if size > budget:
            break
        kept += 1
    while kept and raw[kept] & 0xC0 == 0x80:  # the first byte left out continues a character: leave all of it out
        kept -= 1
    return b"".join(pieces[:kept]) + _CUT_MARK


def _status_block(code: grpc.StatusCode, details: str) -> bytes:
    """Trailer fields carrying a status."""
    if code is grpc.StatusCode.OK and not details:
        return _OK_TRAILERS
    fields: List[Header] = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        fields.append((b"grpc-message", _grpc_message(details)))
    return encode_block(fields)


class _Trailers:
    """The status of a call whose last DATA still waits for flow-control window."""

    __slots__ = ("block",)

    def __init__(self, block: bytes) -> None:
        self.block = block


class ResponseSender:
    """Frames the responses of one connection's calls and sends them as the client's windows allow."""

    __slots__ = (
        "_backlog",
        "_data_sent",
        "_ended",
        "_max_message_bytes",
        "_stalled",
        "_write",
        "_write_all",
        "backlogged",
        "blocked",
        "holding",
        "paused",
        "unsent",
        "windows",
    )

    def __init__(
        self,
        write: Callable[[Buffer], None],
        write_all: Callable[[List[Buffer], int], None],
        *,
        data_sent: Callable[[], None],
        ended: Callable[[GrpcCall], None],
        max_message_bytes: int,
        stalled: Callable[[], None] = lambda: None,
        backlog: Callable[[bool], None] = lambda backlogged: None,
    ) -> None:
        """Send with `write` or `write_all(pieces, size)`; `data_sent()` after sending, `ended(call)` at END_STREAM.

        `stalled()` when a call's DATA begins to wait while no other call's does (`blocked` was empty);
        `backlog(backlogged)` when the connection passes UNSENT_BOUND_BYTES waiting, and when it falls back to half.
        """
        self._write = write
        self._write_all = write_all
        self._data_sent = data_sent
        self._ended = ended
        self._max_message_bytes = max_message_bytes
        self._stalled = stalled
        self._backlog = backlog
        self.windows = SendWindows()
        self.blocked: Dict[int, GrpcCall] = {}  # calls with DATA waiting for window, or for `holding` to end
        self.paused = False  # the transport's buffer is full: streaming handlers wait before writing more
        self.holding = False  # the connection reads on while the buffer is full: DATA waits
        self.unsent = 0  # bytes of DATA waiting in the calls' outboxes
        self.backlogged = False  # past UNSENT_BOUND_BYTES, not yet back to half of it: no new call starts

    def unary(self, call: GrpcCall, parts: Sequence[Buffer], size: int, compressed: bool = False) -> None:
        """A unary call's response and its OK status, in one write when flow control allows.

        `compressed`: the parts are the message already compressed with the call's encoding.
        """
        if call.ended:
            return
        # Outputs in the request's own message (or a leased result region) wait for the windows as views; others
        # are copied when framed, since a callable may fill an array it returned again while a slow client reads.
        if size >= SCATTER_BYTES and call.encoding is None and unchanging(parts, call.request_memory):
            self._send_pieces(call, message_pieces(parts, size, self._max_message_bytes))
            self.end(call, grpc.StatusCode.OK, "")
            return
        message = frame_message(parts, size, call.encoding, self._max_message_bytes, compressed)
        total = len(message)
        windows = self.windows
        if total <= windows.max_frame and total <= windows.window and total <= call.send_window and not self.holding:
            windows.window -= total
            call.ended = call.started = True
            if call.deadline is not None:
                call.deadline.cancel()
            self._data_sent()
            stream_id = call.stream_id
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
            self._ended(call)
            return
        self._send(call, message)
        self.end(call, grpc.StatusCode.OK, "")

    def message(self, call: GrpcCall, parts: Sequence[Buffer], size: int, compressed: bool = False) -> None:
        """One response message of a streaming call (`compressed`: as `unary`'s)."""
        if not call.ended:
            self._send(call, frame_message(parts, size, call.encoding, self._max_message_bytes, compressed))

    def end(self, call: GrpcCall, code: grpc.StatusCode, details: str) -> bool:
        """Send a call's status, after its queued DATA; False when the call had already ended."""
        if call.ended:
            return False
        call.ended = True
        if call.deadline is not None:
            call.deadline.cancel()
        if not call.started:
            self._trailers(call.stream_id, _TRAILERS_ONLY_HEAD + _status_block(code, details))
            self._ended(call)
        elif call.outbox:
            call.outbox.append(_Trailers(_status_block(code, details)))
        else:
            self._trailers(call.stream_id, _status_block(code, details))
            self._ended(call)
        return True

    def answer_http(self, stream_id: int, status: bytes) -> None:
        """Answer a request that is not a gRPC call with a bare HTTP status."""
        self._write(
            h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, encode_block([(b":status", status)]))
        )

    def answer_status(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """End a call that never started with a status: one HEADERS frame ending the stream."""
        self._trailers(stream_id, _TRAILERS_ONLY_HEAD + _status_block(code, details))

    def _trailers(self, stream_id: int, block: bytes) -> None:
        """The HEADERS frame that ends a stream (and CONTINUATIONs, should the block outgrow the client's frames)."""
        self._data_sent()
        self._write(h2.header_frames(h2.END_STREAM, stream_id, block, self.windows.max_frame))

    def _send(self, call: GrpcCall, message: bytes) -> None:
        """Send a framed message on a call (its headers first), or queue what the windows hold back."""
        stream_id = call.stream_id
        if not call.started:
            call.started = True
            self._write(h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, _RESPONSE_HEADS[call.encoding]))
        self._data_sent()
        total = len(message)
        windows = self.windows
        if not call.outbox and not self.holding and total <= windows.room(call):
            windows.spend(call, total)
            self._write(h2.frame_header(total, h2.DATA, 0, stream_id))
            self._write(message)
            return
        call.outbox.append(memoryview(message))
        self.unsent += total
        self.pump(call)

    def _send_pieces(self, call: GrpcCall, pieces: List[Buffer]) -> None:
        """Send a message given as pieces, as views of them (never joined): DATA frames as the windows allow."""
        if not call.started:
            call.started = True
            self._write(h2.frame(h2.HEADERS, h2.END_HEADERS, call.stream_id, _RESPONSE_HEADS[call.encoding]))
        self._data_sent()
        views = [memoryview(piece).cast("B") for piece in pieces]
        call.outbox.extend(views)
        self.unsent += sum(map(len, views))
        self.pump(call)

    def pump(self, call: GrpcCall) -> None:
        """Send as much of a call's queued DATA (and then its status) as the windows allow (none while holding).

        The queued pieces fill frames of the client's largest size (a message's prefix and head share its first
        frame with the start of its tensors), and every frame goes to the transport in one write.
        """
        outbox = call.outbox
        windows = self.windows
        window = 0 if self.holding else min(windows.window, call.send_window)
        largest = windows.max_frame
        out: List[Buffer] = []
        sent = frames = 0
        full_header = b""
        while outbox and window > 0 and not isinstance(outbox[0], _Trailers):
            item = outbox[0]
            whole = min(len(item), window) // largest
            if whole > 1:  # the frames cut from one large piece (a tensor): all alike, made in a tight loop
                full_header = full_header or h2.frame_header(largest, h2.DATA, 0, call.stream_id)
                end = whole * largest
                for start in range(0, end, largest):
                    out.append(full_header)
                    out.append(item[start : start + largest])
                if end == len(item):
                    outbox.popleft()
                else:
                    outbox[0] = item[end:]
                window -= end
                sent += end
                frames += whole
                continue
            size = min(largest, window)
            header_at = len(out)
            out.append(b"")
            filled = 0
            while filled < size and outbox:
                item = outbox[0]
                if isinstance(item, _Trailers):
                    break
                taken = size - filled
                if len(item) <= taken:
                    outbox.popleft()
                    out.append(item)
                    filled += len(item)
                else:
                    out.append(item[:taken])
                    outbox[0] = item[taken:]
                    filled = size
            if filled == largest:
                full_header = full_header or h2.frame_header(largest, h2.DATA, 0, call.stream_id)
                out[header_at] = full_header
            else:
                out[header_at] = h2.frame_header(filled, h2.DATA, 0, call.stream_id)
            window -= filled
            sent += filled
            frames += 1
        if out:
            windows.spend(call, sent)
            self._write_all(out, sent + frames * h2.FRAME_HEADER_SIZE)
            self.unsent -= sent
            if self.backlogged and self.unsent <= UNSENT_BOUND_BYTES // 2:
                self.backlogged = False
                self._backlog(False)
        if outbox and isinstance(outbox[0], _Trailers):
            trailers = outbox.popleft()
            assert isinstance(trailers, _Trailers)
            self._trailers(call.stream_id, trailers.block)
            self._ended(call)
            return
        if outbox:
            if not self.blocked:
                self._stalled()
            self.blocked[call.stream_id] = call
            if self.unsent > UNSENT_BOUND_BYTES and not self.backlogged:
                self.backlogged = True
                self._backlog(True)
            return
        self.blocked.pop(call.stream_id, None)
        if not self.paused:
            wake(call.writable)

    def drop(self, call: GrpcCall) -> None:
        """A call's stream closed with DATA still waiting: it never goes out."""
        self.unsent -= sum(len(item) for item in call.outbox if not isinstance(item, _Trailers))
        call.outbox.clear()
        self.blocked.pop(call.stream_id, None)
        if self.backlogged and self.unsent <= UNSENT_BOUND_BYTES // 2:
            self.backlogged = False
            self._backlog(False)

    def pump_blocked(self) -> None:
        """The connection window or the client's settings changed: send what waited."""
        if self.blocked:
            for call in list(self.blocked.values()):
                self.pump(call)
