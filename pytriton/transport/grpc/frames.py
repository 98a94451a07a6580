"""HTTP/2 framing (RFC 9113) as the gRPC server uses it: frame types, flags, error codes, settings, frame bytes."""

from __future__ import annotations

import struct
from typing import Callable, Optional

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Not a flag of the wire (whose flags are 8 bits): the reader marks a HEADERS whose stream depends on itself with it.
SELF_DEPENDENT = 0x100

# Error codes (RST_STREAM, GOAWAY).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB
_ERROR_NAMES = {
    NO_ERROR: "NO_ERROR",
    PROTOCOL_ERROR: "PROTOCOL_ERROR",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR",
    STREAM_CLOSED: "STREAM_CLOSED",
    FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR",
    REFUSED_STREAM: "REFUSED_STREAM",
    COMPRESSION_ERROR: "COMPRESSION_ERROR",
    ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM",
}

# Settings.
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_FRAME_LIMIT = 2**24 - 1
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1

# The 9-byte frame header: a 24-bit length (split in 16 + 8 bits), type, flags, stream id.
FRAME_HEADER = struct.Struct(">HBBBI")
FRAME_HEADER_SIZE = 9
_UINT32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")


class Http2Error(Exception):
    """A connection error: the connection answers GOAWAY with `code` and closes."""

    def __init__(self, code: int, message: str, after_goaway: Optional[Callable[[], None]] = None) -> None:
        """An error of code `code`; `message` goes out as the GOAWAY's debug data.

        `after_goaway` writes what follows the GOAWAY before the connection closes (the calls' trailers).
        """
        super().__init__(message)
        self.code = code
        self.after_goaway = after_goaway


class StreamError(Exception):
    """A stream error: the stream is reset with `code`, the connection goes on."""

    def __init__(self, stream_id: int, code: int) -> None:
        """An error resetting stream `stream_id` with `code`."""
        super().__init__(f"stream {stream_id}: error {code}")
        self.stream_id = stream_id
        self.code = code


def error_name(code: int) -> str:
    """An error code as RFC 9113 names it (hexadecimal when this module has no name for it)."""
    return _ERROR_NAMES.get(code, f"0x{code:x}")


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """The header of a frame whose payload is `length` bytes."""
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A whole frame."""
    return frame_header(len(payload), kind, flags, stream_id) + payload


def header_frames(flags: int, stream_id: int, block: bytes, max_frame: int) -> bytes:
    """A header block in a HEADERS frame with `flags`, and CONTINUATIONs for what a frame of `max_frame` cannot carry.

    A frame larger than the peer's SETTINGS_MAX_FRAME_SIZE is its FRAME_SIZE_ERROR (RFC 9113 section 4.2).
    """
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    frames = [frame(HEADERS, flags, stream_id, block[:max_frame])]
    for start in range(max_frame, len(block), max_frame):
        end = start + max_frame
        frames.append(frame(CONTINUATION, END_HEADERS if end >= len(block) else 0, stream_id, block[start:end]))
    return b"".join(frames)


def settings_frame(settings: dict[int, int]) -> bytes:
    """A SETTINGS frame carrying `settings`."""
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in settings.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    """A WINDOW_UPDATE frame."""
    return frame(WINDOW_UPDATE, 0, stream_id, _UINT32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    """A RST_STREAM frame."""
    return frame(RST_STREAM, 0, stream_id, _UINT32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    """A GOAWAY frame."""
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def read_uint32(payload: bytes) -> int:
    """The 31-bit value of a 4-byte payload (WINDOW_UPDATE, RST_STREAM), reserved bit cleared."""
    return int(_UINT32.unpack_from(payload)[0]) & 0x7FFFFFFF


def read_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload."""
    if len(payload) % 6:
        raise Http2Error(FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6 bytes")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def strip_padding(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its padding (and a HEADERS' priority fields).

    Raises:
        Http2Error: FRAME_SIZE_ERROR when the payload is too short for its pad length or priority fields,
            PROTOCOL_ERROR when the padding is longer than the payload.
    """
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise Http2Error(FRAME_SIZE_ERROR, "padded frame without a pad length")
        end -= payload[0]
        start = 1
    if flags & PRIORITY_FLAG:
        if len(payload) < start + 5:
            raise Http2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
        start += 5
    if end < start:
        raise Http2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[start:end]


def dependency(payload: bytes, flags: int) -> int:
    """The stream a HEADERS frame with PRIORITY_FLAG depends on (its payload checked by `strip_padding`)."""
    return read_uint32(payload[1:5] if flags & PADDED else payload[:4])
