"""A second opinion on the gRPC server's HTTP/2: random frame sequences fed to it and to python-hyper's h2.

The same bytes go to this server's connection (over a transport that records what it writes: the
HTTP/2 code is what is under test, and this keeps it deterministic) and to
`h2.connection.H2Connection(config=H2Configuration(client_side=False))`. Both must agree on which
sequences are connection errors, on the class of the error code, and, where the connection lives
on, on which streams are reset with which code.

How the comparison is set up, and why:

- The server's calls are ModelStreamInfer-like and never answer, as h2 has no application: no
  stream ever ends from the server's side but by a stream error. grpc's ping strikes (a gRPC
  policy, not HTTP/2's) are off.
- h2 does not check header fields (`validate_inbound_headers=False`): what a request's fields mean
  is the gRPC layer's business (a malformed request is answered on its stream, not with a connection
  error); this test compares framing and stream states.
- Error codes compare by class (a protocol violation, flow control, a flood): when one frame breaks
  two rules the implementations name the first they check (an interrupted header block whose next
  frame is also too short), and h2 reports a bad HPACK block as PROTOCOL_ERROR where RFC 9113 4.3
  asks for COMPRESSION_ERROR, which this server sends.
- The generator stays away from the deliberate differences, each of which is a test of its own
  below (DELIBERATE): ACK SETTINGS with a payload, a stray CONTINUATION on a closed stream,
  RST_STREAM on an idle stream, WINDOW_UPDATE of 0 on a stream, HEADERS on a forgotten stream id (a
  skipped one is compared below: the two agree), trailers without END_STREAM, a padded HEADERS that
  is all padding, a new initial window that a closed stream's window would not hold, more streams
  than advertised, a stream depending on itself and a PRIORITY frame of the wrong size. Where a
  stream was reset, each stream's first reset code is compared (h2 resets again a stream it reset,
  where RFC 9113 5.1 asks to drop the frames). A client's GOAWAY ends a sequence (this server then
  closes once idle, h2 refuses what follows), and frame types h2 parses as extensions (ALTSVC 0xa,
  ORIGIN 0xc, PRIORITY_UPDATE 0x10) are not sent: this server ignores every type it does not know,
  as RFC 9113 5.5 asks.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Dict, List, Optional, Tuple

import h2.config
import h2.connection
import h2.exceptions
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytriton.options.limits import ServerLimits
from pytriton.options.server import GrpcKeepalive
from pytriton.transport.grpc.connection import GrpcConnection
from pytriton.transport.grpc.handlers import Method
from pytriton.transport.grpc.server import GrpcServerState
from tests.h2_wire import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    grpc_message,
    pack_frame,
)

ENHANCE_YOUR_CALM = 0xB
PATH = "/test.Service/Stream"
REQUEST = hpack.Encoder().encode(
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "test"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
)
TRAILERS = hpack.Encoder().encode([("x-trailer", "1")])
# Malformed ones (RFC 9113 8.2.1, 8.1): a request with a field name in uppercase, trailers with a pseudo-header.
MALFORMED_REQUEST = hpack.Encoder().encode([(":method", "POST"), (":path", PATH), ("X-Upper", "1")])
MALFORMED_TRAILERS = hpack.Encoder().encode([(":method", "POST")])
# Frame types the generator sends, as often as they are listed (0x21: a type nobody defined; now and
# then a CONTINUATION or PUSH_PROMISE a client must not send takes its place).
KINDS = (DATA,) * 6 + (HEADERS,) * 5 + (WINDOW_UPDATE,) * 3 + (RST_STREAM, SETTINGS, PING, 0x21) * 2
KINDS += (PRIORITY, GOAWAY)
# The client preface and the acknowledgement of the server's SETTINGS, before each sequence.
OPENING = PREFACE + pack_frame(SETTINGS, 0, 0) + pack_frame(SETTINGS, ACK, 0)
Outcome = Tuple[Optional[int], List[Tuple[int, int]]]  # (connection error code, [(stream, reset code)])


# ---------------------------------------------------------------- the two implementations


class RecordingTransport:
    """What a connection writes, kept; nothing is sent anywhere."""

    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.written += chunk

    def close(self) -> None:
        pass

    abort = close
    pause_reading = close
    resume_reading = close

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _never_answers(requests: Any, context: Any) -> None:
    await asyncio.get_running_loop().create_future()


async def _receive(connection: GrpcConnection, data: bytes, reads: Optional[List[int]] = None) -> None:
    """Hand `data` to the connection on its loop, as the transport does, and let the handlers it starts run.

    `reads`: the most each read takes, in turn (cycled), as a slow or unlucky network cuts a stream.
    """
    view = memoryview(data)
    turn = 0
    while view:  # as the transport does: into the buffer the connection gives, as much as fits
        buffer = connection.get_buffer(len(view))
        size = min(len(buffer), len(view))
        if reads:
            size = min(size, reads[turn % len(reads)])
            turn += 1
        buffer[:size] = view[:size]
        connection.buffer_updated(size)
        view = view[size:]
    await asyncio.sleep(0)


async def _settled(tasks: Any) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def _frames(data: bytes) -> List[Tuple[int, int, int, bytes]]:
    found, position = [], 0
    while len(data) - position >= 9:
        length = int.from_bytes(data[position : position + 3], "big")
        kind, flags = data[position + 3], data[position + 4]
        stream = int.from_bytes(data[position + 5 : position + 9], "big") & 0x7FFFFFFF
        found.append((kind, flags, stream, bytes(data[position + 9 : position + 9 + length])))
        position += 9 + length
    return found


def _outcome(written: bytes) -> Outcome:
    error, resets = None, []
    for kind, _, stream, payload in _frames(written):
        if kind == GOAWAY:
            error = struct.unpack(">II", payload[:8])[1]
        elif kind == RST_STREAM:
            resets.append((stream, struct.unpack(">I", payload)[0]))
    return error, resets


def ours(data: bytes, reads: Optional[List[int]] = None, behaviour: Any = _never_answers) -> Outcome:
    """What this server's connection does with `data` (arriving in reads of at most `reads` bytes, cycled)."""
    loop = asyncio.new_event_loop()
    try:
        method = Method("Stream", True, bytes, lambda message: ([message], len(message)), behaviour)
        keepalive = GrpcKeepalive(max_ping_strikes=0)  # grpc's ping policy is not HTTP/2's: h2 has none
        state = GrpcServerState({PATH.encode(): method}, ServerLimits(), keepalive=keepalive, compression_level=0)
        connection = GrpcConnection(state, loop)
        transport = RecordingTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        loop.run_until_complete(_receive(connection, data, reads))
        connection.connection_lost(None)
        return _outcome(bytes(transport.written))
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(_settled(tasks))
        loop.close()


def reference(data: bytes) -> Outcome:
    """What h2 does with `data` (its GOAWAY's code when it raises, else the streams it reset)."""
    connection = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=False, validate_inbound_headers=False)
    )
    connection.initiate_connection()
    connection.data_to_send()
    sent = bytearray()  # taken frame by frame: h2 drops what it has not sent when the client says GOAWAY
    for chunk in [PREFACE] + [pack_frame(*frame) for frame in _frames(data[len(PREFACE) :])]:
        try:
            connection.receive_data(chunk)
        except h2.exceptions.ProtocolError:
            error, _ = _outcome(connection.data_to_send())
            assert error is not None, "h2 raised without a GOAWAY"
            return error, []
        sent += connection.data_to_send()
    return _outcome(bytes(sent))


def _first_codes(resets: List[Tuple[int, int]]) -> Dict[int, int]:
    """The code each stream was first reset with."""
    first: Dict[int, int] = {}
    for stream, code in resets:
        first.setdefault(stream, code)
    return first


def error_class(code: Optional[int]) -> str:
    """What kind of connection error a code is (the comparison's granularity)."""
    if code is None:
        return "none"
    return {FLOW_CONTROL_ERROR: "flow control", ENHANCE_YOUR_CALM: "flood"}.get(code, "protocol violation")


# ---------------------------------------------------------------- random client frames


def _broken(draw: st.DrawFn) -> bool:
    """Whether to break a frame's own rules (rarely: most sequences should go deep into the stream states)."""
    return draw(st.integers(0, 39)) == 0


@st.composite
def client_frames(draw: st.DrawFn, deliberate: bool = False) -> List[bytes]:
    """Frames a client might send, mostly valid, within the comparison's bounds (module docstring).

    `deliberate`: now and then also frames where this server and h2 differ on purpose (a stream depending on
    itself, a PRIORITY frame of 4 bytes, a malformed header list), for tests of this server alone.
    """
    frames: List[bytes] = []
    opened: List[int] = []  # client streams opened so far (HEADERS sent), in order

    def a_stream() -> int:
        """An opened stream mostly; else an idle one, or (rarely) 0 or an even one."""
        if _broken(draw):
            return draw(st.sampled_from([0, 2]))
        if not opened or draw(st.integers(0, 9)) == 0:
            return max(opened, default=-1) + 2
        return draw(st.sampled_from(opened))

    for index in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(KINDS)) if index else HEADERS
        if kind == DATA:
            flags = draw(st.sampled_from([0, 0, END_STREAM, PADDED, PADDED | END_STREAM]))
            body = draw(st.sampled_from([b"", b"\0\0\0\0\x02ab", b"xyz", b"\x01\0\0\0\x01a", b"\0\0\0\0\0"]))
            if flags & PADDED:
                pad = 40 if _broken(draw) else draw(st.sampled_from([0, 3]))
                body = bytes([pad]) + body + b"\0" * min(pad, 5)
            frames.append(pack_frame(DATA, flags, a_stream(), body))
        elif kind == HEADERS:
            frames += _header_block(draw, opened, deliberate)
        elif kind == PRIORITY:  # never on its own stream, always of 5 bytes (DELIBERATE)
            stream = a_stream() or 1
            payload = struct.pack(">IB", draw(st.sampled_from([0, stream + 2])), 9)
            if deliberate and draw(st.integers(0, 3)) == 0:
                payload = draw(st.sampled_from([struct.pack(">IB", stream, 9), b"1234"]))
            frames.append(pack_frame(PRIORITY, 0, stream, payload))
        elif kind == RST_STREAM:  # on an opened stream (never an idle one: DELIBERATE)
            stream = 0 if _broken(draw) or not opened else draw(st.sampled_from(opened))
            payload = b"123" if _broken(draw) else struct.pack(">I", draw(st.sampled_from([0, 8])))
            frames.append(pack_frame(RST_STREAM, 0, stream, payload))
        elif kind == SETTINGS:
            frames.append(_settings(draw))
        elif kind == PING:
            stream = 1 if _broken(draw) else 0
            payload = b"1234567" if _broken(draw) else b"12345678"
            frames.append(pack_frame(PING, draw(st.sampled_from([0, ACK])), stream, payload))
        elif kind == GOAWAY:
            frames.append(pack_frame(GOAWAY, 0, 1 if _broken(draw) else 0, b"1234" if _broken(draw) else bytes(8)))
            break
        elif kind == WINDOW_UPDATE:  # 0 only on the connection (on a stream: DELIBERATE)
            stream = draw(st.sampled_from([0, a_stream()]))
            increment = draw(st.sampled_from([1, 65_535, 2**20]))
            if _broken(draw):
                increment = 0 if stream == 0 else 2**31 - 1
            payload = b"123" if _broken(draw) else struct.pack(">I", increment)
            frames.append(pack_frame(WINDOW_UPDATE, 0, stream, payload))
        elif _broken(draw):  # a type a client must not send here
            if draw(st.booleans()):  # a stray CONTINUATION on the newest stream or an idle one (closed: DELIBERATE)
                stream = draw(st.sampled_from([max(opened, default=-1) + 2, *opened[-1:]]))
                frames.append(pack_frame(CONTINUATION, draw(st.sampled_from([0, END_HEADERS])), stream, TRAILERS))
            else:
                frames.append(pack_frame(PUSH_PROMISE, END_HEADERS, a_stream(), struct.pack(">I", 2) + REQUEST))
        else:
            frames.append(pack_frame(kind, 0, a_stream(), b"abc"))
    return frames


def _header_block(draw: st.DrawFn, opened: List[int], deliberate: bool = False) -> List[bytes]:
    """A header block: a new request (a higher stream id), or trailers on an opened stream; maybe in pieces.

    `deliberate`: now and then depending on its own stream, or malformed (client_frames).
    """
    new_stream = max(opened, default=-1) + draw(st.sampled_from([2, 2, 4]))
    stream = draw(st.sampled_from([new_stream, new_stream, *opened, 2 if _broken(draw) else new_stream]))
    trailers = stream in opened
    if stream % 2 and not trailers:
        opened.append(stream)
    flags = draw(st.sampled_from([END_HEADERS, END_HEADERS | END_STREAM, END_HEADERS | PRIORITY_FLAG, 0, END_STREAM]))
    if draw(st.booleans()):
        flags |= PADDED
    if trailers:
        flags |= END_STREAM  # trailers without it: DELIBERATE
    block = TRAILERS if trailers else REQUEST
    if deliberate and draw(st.integers(0, 5)) == 0:
        block = MALFORMED_TRAILERS if trailers else MALFORMED_REQUEST
    pieces = [block]
    if not flags & END_HEADERS:  # a padded HEADERS carries a fragment (one padding only: DELIBERATE)
        cuts = sorted(draw(st.lists(st.integers(1 if flags & PADDED else 0, len(block)), min_size=1, max_size=3)))
        pieces = [block[start:end] for start, end in zip([0, *cuts], [*cuts, len(block)])]
    first = pieces[0]
    if flags & PRIORITY_FLAG:  # never on itself (DELIBERATE)
        depends = stream if deliberate and draw(st.booleans()) else draw(st.sampled_from([0, stream + 2]))
        first = struct.pack(">IB", depends, 15) + first
    if flags & PADDED:
        first = bytes([2]) + first + b"\0\0"
    frames = [pack_frame(HEADERS, flags, stream, first)]
    for index, piece in enumerate(pieces[1:], start=1):
        if _broken(draw):
            frames.append(pack_frame(PING, 0, 0, b"12345678"))  # interrupts the block
        last = index == len(pieces) - 1 and not _broken(draw)
        frames.append(pack_frame(CONTINUATION, END_HEADERS if last else 0, stream, piece))
    return frames


def _settings(draw: st.DrawFn) -> bytes:
    """A SETTINGS frame: an acknowledgement (without a payload: DELIBERATE), or settings, now and then bad ones."""
    if draw(st.booleans()):
        return pack_frame(SETTINGS, ACK, 0)
    if _broken(draw):
        payload = draw(
            st.sampled_from(
                [
                    struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 2**31),
                    struct.pack(">HI", SETTINGS_MAX_FRAME_SIZE, draw(st.sampled_from([100, 2**24]))),
                    struct.pack(">HI", 0x2, 2),  # ENABLE_PUSH
                    b"12345",
                ]
            )
        )
        return pack_frame(SETTINGS, 0, draw(st.sampled_from([0, 1])), payload)
    payload = draw(
        st.sampled_from(
            [
                b"",
                struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, draw(st.sampled_from([0, 70_000, 2**20]))),
                struct.pack(">HI", SETTINGS_MAX_FRAME_SIZE, draw(st.sampled_from([16_384, 2**24 - 1]))),
                struct.pack(">HI", 0x2, draw(st.sampled_from([0, 1]))),  # ENABLE_PUSH
                struct.pack(">HI", 0x99, 7),  # unknown: ignored
            ]
        )
    )
    return pack_frame(SETTINGS, 0, 0, payload)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client_frames())
def test_this_server_and_h2_agree_on_random_frame_sequences(frames):
    data = OPENING + b"".join(frames)
    our_error, our_resets = ours(data)
    their_error, their_resets = reference(data)
    assert error_class(our_error) == error_class(their_error), (our_error, their_error)
    if our_error is None:  # the same streams reset, first with the same code (h2 resets again what it reset)
        assert _first_codes(our_resets) == _first_codes(their_resets)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client_frames(deliberate=True), st.lists(st.integers(1, 40), min_size=1, max_size=5))
def test_how_reads_cut_the_frames_changes_nothing(frames, reads):
    """A frame header, a padded DATA payload or a header block cut anywhere between reads: the same outcome."""
    data = OPENING + b"".join(frames)
    assert ours(data, reads) == ours(data)


def test_large_frames_and_unknown_ones_cut_between_reads():
    """DATA frames up to the advertised 4 MiB (read in place), a large frame of an unknown type (skipped), padding."""
    message = grpc_message(b"\x01" * 300_000)
    data = (
        OPENING
        + _request(1)
        + pack_frame(0xFA, 0, 1, b"\xee" * 200_000)  # unknown type: skipped as it arrives
        + pack_frame(DATA, PADDED, 1, bytes([9]) + message[:150_000] + bytes(9))
        + pack_frame(DATA, END_STREAM, 1, message[150_000:])
        + _request(3)
        + pack_frame(DATA, 0, 3, b"")  # empty, no END_STREAM: a glitch, not an error
        + pack_frame(DATA, END_STREAM, 3, grpc_message(b"x"))
    )
    received: List[bytes] = []

    async def record(requests: Any, context: Any) -> None:
        async for request in requests:
            received.append(bytes(request))
        await asyncio.get_running_loop().create_future()

    for reads in (None, [70_000], [1], [9, 4096, 100_000], [65_536 + 13]):
        received.clear()
        assert ours(data, reads, record) == (None, []), reads
        assert received == [message[5:], b"x"], reads


# ---------------------------------------------------------------- deliberate differences


def _request(stream: int, flags: int = END_HEADERS) -> bytes:
    return pack_frame(HEADERS, flags, stream, REQUEST)


# name: (frames, this server's outcome, h2's outcome, why this server differs)
DELIBERATE: Dict[str, Tuple[bytes, Outcome, Outcome, str]] = {
    "SETTINGS acknowledgement with a payload": (
        pack_frame(SETTINGS, ACK, 0, struct.pack(">HI", 4, 1)),
        (FRAME_SIZE_ERROR, []),
        (PROTOCOL_ERROR, []),
        "RFC 9113 6.5: FRAME_SIZE_ERROR",
    ),
    "CONTINUATION without HEADERS on a closed stream": (
        _request(3) + pack_frame(CONTINUATION, END_HEADERS, 1, TRAILERS),
        (PROTOCOL_ERROR, []),
        (STREAM_CLOSED, []),
        "RFC 9113 6.10: a CONTINUATION that follows no open header block is PROTOCOL_ERROR, whatever its stream",
    ),
    "RST_STREAM on an idle stream": (
        _request(1) + pack_frame(RST_STREAM, 0, 5, bytes(4)),
        (PROTOCOL_ERROR, []),
        (None, []),
        "RFC 9113 6.4: a connection error PROTOCOL_ERROR (h2 ignores it once a stream is open)",
    ),
    "WINDOW_UPDATE of 0 on a stream": (
        _request(1) + pack_frame(WINDOW_UPDATE, 0, 1, bytes(4)),
        (None, [(1, PROTOCOL_ERROR)]),
        (PROTOCOL_ERROR, []),
        "RFC 9113 6.9: a stream error on a stream (h2 makes it a connection error)",
    ),
    "trailers without END_STREAM": (
        _request(1) + pack_frame(HEADERS, END_HEADERS, 1, TRAILERS),
        (None, [(1, PROTOCOL_ERROR)]),
        (PROTOCOL_ERROR, []),
        "RFC 9113 8.1.1: a malformed request is a stream error PROTOCOL_ERROR",
    ),
    "a padded HEADERS without a header block fragment": (
        pack_frame(HEADERS, PADDED, 1, b"\x02\0\0") + pack_frame(CONTINUATION, END_HEADERS, 1, REQUEST),
        (None, []),
        (PROTOCOL_ERROR, []),
        "RFC 9113 6.2: padding is an error only when it is as long as the payload or longer (h2 refuses a"
        " HEADERS frame that is all padding)",
    ),
    "DATA again on a stream the server reset": (
        _request(1, END_HEADERS | END_STREAM)
        + pack_frame(DATA, 0, 1, b"x")  # on a half-closed (remote) stream: a stream error
        + pack_frame(RST_STREAM, 0, 1, bytes(4))
        + pack_frame(DATA, 0, 1, b"x"),
        (None, [(1, STREAM_CLOSED)]),
        (None, [(1, STREAM_CLOSED), (1, STREAM_CLOSED)]),
        "RFC 9113 5.1: after sending RST_STREAM an endpoint MUST ignore frames on the stream (h2 resets it again)",
    ),
    "a new SETTINGS_INITIAL_WINDOW_SIZE and the window of a closed stream": (
        _request(1)
        + pack_frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1))
        + pack_frame(RST_STREAM, 0, 1, bytes(4))
        + pack_frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1)),
        (None, []),
        (FLOW_CONTROL_ERROR, []),
        "RFC 9113 6.9.2 adjusts the windows a receiver maintains: a closed stream has none (h2 still holds the"
        " stream, whose window goes over 2^31-1)",
    ),
    "PRIORITY making a stream depend on itself": (
        _request(1)
        + pack_frame(PRIORITY, 0, 1, struct.pack(">IB", 1, 9))
        + pack_frame(PRIORITY, 0, 5, struct.pack(">IB", 5, 9)),
        (None, [(1, PROTOCOL_ERROR), (5, PROTOCOL_ERROR)]),
        (PROTOCOL_ERROR, []),
        "RFC 9113 5.3.1: a stream error PROTOCOL_ERROR, on an idle stream too (h2 makes it a connection error)",
    ),
    "HEADERS making a stream depend on itself": (
        pack_frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, struct.pack(">IB", 1, 9) + REQUEST) + _request(3),
        (None, [(1, PROTOCOL_ERROR)]),
        (PROTOCOL_ERROR, []),
        "RFC 9113 5.3.1: a stream error PROTOCOL_ERROR; the stream opens nothing (h2 makes it a connection error)",
    ),
    "PRIORITY of 4 bytes": (
        _request(1) + pack_frame(PRIORITY, 0, 1, bytes(4)),
        (None, [(1, FRAME_SIZE_ERROR)]),
        (FRAME_SIZE_ERROR, []),
        "RFC 9113 6.3: a stream error FRAME_SIZE_ERROR (h2 makes it a connection error)",
    ),
    "more streams than SETTINGS_MAX_CONCURRENT_STREAMS (100)": (
        b"".join(_request(stream) for stream in range(1, 203, 2)),
        (None, [(201, REFUSED_STREAM)]),
        (PROTOCOL_ERROR, []),
        "RFC 9113 5.1.2 allows REFUSED_STREAM, which tells the client it may retry the call elsewhere",
    ),
}


def test_a_new_stream_below_one_opened_is_a_protocol_error_as_in_h2():
    # RFC 9113 5.1.1. It was dropped, as nghttp2 drops it: the client's call on stream 1 then waited for ever.
    frames = OPENING + _request(3) + _request(1)
    assert ours(frames) == reference(frames) == (PROTOCOL_ERROR, [])


@pytest.mark.parametrize("name", list(DELIBERATE))
def test_deliberate_differences_from_h2(name):
    frames, expected_ours, expected_theirs, _why = DELIBERATE[name]
    assert ours(OPENING + frames) == expected_ours
    assert reference(OPENING + frames) == expected_theirs
