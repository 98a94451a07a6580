"""The client's side of an HTTP/2 connection cut into frames: the preface, frame rules and whole header blocks.

What can be checked from a frame alone is checked here (RFC 9113 sections 3.4, 4 and 6): the client
preface is the magic then a SETTINGS frame; no frame is over the 16 KiB this server allows; each type
is on stream 0 or on a stream as it must be, with the payload size its type requires; a header block
(HEADERS, then CONTINUATION frames on the same stream with nothing in between) arrives whole, its
padding and priority fields removed, within `max_block_bytes` and at most `max_continuations`
CONTINUATION frames (ENHANCE_YOUR_CALM beyond either: 300,000 empty CONTINUATIONs must not cost the
server more than a handful); PRIORITY frames are checked and dropped in every stream state;
PUSH_PROMISE from a client is a connection error; frames of unknown types are dropped. The rest goes
to the handler, one call per frame, for what the stream or connection state decides; a stream error
it raises resets that stream only, and the frames after it are read on.
"""

from __future__ import annotations

from typing import List, Protocol, Tuple

from pytriton.transport.grpc import frames as h2


class FrameHandler(Protocol):
    """What the reader hands the frames to (the session), once checked."""

    def on_data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        """A DATA frame on a stream; `payload` (a view of the read) still has its padding."""

    def on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        """A whole header block on a stream; `flags` are its HEADERS frame's."""

    def on_rst_stream(self, stream_id: int) -> None:
        """A RST_STREAM frame on a stream."""

    def on_settings(self, flags: int, settings: List[Tuple[int, int]]) -> None:
        """A SETTINGS frame: an acknowledgement (ACK, no settings) or the client's settings."""

    def on_ping(self, flags: int, payload: bytes) -> None:
        """A PING frame (8 bytes)."""

    def on_goaway(self) -> None:
        """A GOAWAY frame."""

    def on_window_update(self, stream_id: int, increment: int) -> None:
        """A WINDOW_UPDATE frame, on stream 0 or a stream."""

    def on_stream_error(self, error: h2.StreamError) -> None:
        """A frame was a stream error: reset the stream, read on."""

    def glitch(self) -> None:
        """A frame that carries nothing arrived (counted against floods)."""


class FrameReader:
    """Reads one connection's frames out of whatever chunks of bytes arrive."""

    __slots__ = (
        "_block",
        "_block_bytes",
        "_block_flags",
        "_block_frames",
        "_block_stream",
        "_handler",
        "_max_block_bytes",
        "_max_continuations",
        "_pending",
        "_preface_due",
        "stopped",
    )

    def __init__(self, handler: FrameHandler, max_block_bytes: int, max_continuations: int) -> None:
        """A reader handing frames to `handler`, refusing header blocks over the given size and frame count."""
        self._handler = handler
        self._max_block_bytes = max_block_bytes
        self._max_continuations = max_continuations
        self._pending = b""  # the start of a frame whose end has not arrived
        self._preface_due = True
        self._block: list[bytes] = []  # the pieces of a header block awaiting CONTINUATION
        self._block_stream = 0  # its stream (0: no block is open)
        self._block_flags = 0
        self._block_bytes = 0
        self._block_frames = 0
        self.stopped = False  # set by the handler when the connection stops reading

    def feed(self, data: bytes) -> None:
        """Handle every whole frame of what arrived; keep the start of a partial one.

        A frame begun in an earlier read is completed with just the bytes it misses, not by joining
        the whole read to it: with large messages every read ends inside a frame, and joining copied
        each byte once more. DATA payloads are views of the read; the message reader copies them once.

        Raises:
            Http2Error: a connection error (the handler may raise it too).
        """
        pending = self._pending
        if pending:
            self._pending = b""
            if self._preface_due or len(pending) < h2.FRAME_HEADER_SIZE:
                data = pending + data  # at most a preface or a frame header: a few bytes
            else:
                missing = h2.FRAME_HEADER_SIZE + ((pending[0] << 16) | (pending[1] << 8) | pending[2]) - len(pending)
                if missing > len(data):
                    self._pending = pending + data  # still not whole: at most one frame is held
                    return
                self._frames(pending + data[:missing], 0)
                if missing == len(data) or self.stopped:
                    return
                self._frames(data, missing)
                return
        position = 0
        if self._preface_due:
            position = self._preface(data)
            if position < 0:
                return
        self._frames(data, position)

    def _frames(self, data: bytes, position: int) -> None:
        """Handle the whole frames of `data` from `position` on; keep the start of a partial one."""
        size = len(data)
        view = memoryview(data)
        handler = self._handler
        unpack = h2.FRAME_HEADER.unpack_from
        while size - position >= h2.FRAME_HEADER_SIZE and not self.stopped:
            high, low, kind, flags, stream_id = unpack(data, position)
            length = (high << 8) | low
            if length > h2.DEFAULT_MAX_FRAME:
                raise h2.Http2Error(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes is over SETTINGS_MAX_FRAME_SIZE")
            end = position + h2.FRAME_HEADER_SIZE + length
            if end > size:
                break
            start = position + h2.FRAME_HEADER_SIZE
            position = end
            stream_id &= 0x7FFFFFFF
            try:
                if self._block_stream:
                    self._continuation(kind, flags, stream_id, data[start:end])
                elif kind == h2.DATA:
                    if not stream_id:
                        raise h2.Http2Error(h2.PROTOCOL_ERROR, "DATA on stream 0")
                    handler.on_data(stream_id, flags, view[start:end])
                elif kind == h2.HEADERS:
                    self._headers(stream_id, flags, data[start:end])
                else:
                    self._control(kind, flags, stream_id, data[start:end])
            except h2.StreamError as error:
                handler.on_stream_error(error)
        if position < size:
            self._pending = data[position:]

    def _preface(self, data: bytes) -> int:
        """Check the client preface (the magic, then a SETTINGS frame); where frames start, -1 if more is needed."""
        magic = len(h2.PREFACE)
        if not (data[:magic] == h2.PREFACE if len(data) >= magic else h2.PREFACE.startswith(data)):
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(data) < magic + h2.FRAME_HEADER_SIZE:
            self._pending = data
            return -1
        _, _, kind, flags, _ = h2.FRAME_HEADER.unpack_from(data, magic)
        if kind != h2.SETTINGS or flags & h2.ACK:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "the connection preface must end with a SETTINGS frame")
        self._preface_due = False
        return magic

    def _headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        """A HEADERS frame: a whole header block, or the start of one."""
        if stream_id == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = h2.strip_padding(payload, flags, stream_id) if flags & (h2.PADDED | h2.PRIORITY_FLAG) else payload
        if flags & h2.END_HEADERS:
            self._handler.on_header_block(stream_id, flags, block)
            return
        self._block = [block]
        self._block_stream = stream_id
        self._block_flags = flags
        self._block_bytes = len(block)
        self._block_frames = 0

    def _continuation(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A frame while a header block is open: it must be the block's next CONTINUATION."""
        if kind != h2.CONTINUATION or stream_id != self._block_stream:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "a header block was interrupted")
        self._block_frames += 1
        if self._block_frames > self._max_continuations:
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "too many CONTINUATION frames in a header block")
        if not payload:
            self._handler.glitch()
        self._block.append(payload)
        self._block_bytes += len(payload)
        if self._block_bytes > self._max_block_bytes:
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "header block too large")
        if flags & h2.END_HEADERS:
            block, self._block = b"".join(self._block), []
            self._block_stream = 0
            self._handler.on_header_block(stream_id, self._block_flags, block)

    def _control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A frame that carries no request data: its own rules checked, then handed over (or dropped)."""
        handler = self._handler
        length = len(payload)
        if kind == h2.WINDOW_UPDATE:
            if length != 4:
                raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
            handler.on_window_update(stream_id, h2.read_uint32(payload))
        elif kind in _CONNECTION_FRAMES:
            if stream_id:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, f"{_CONNECTION_FRAMES[kind]} on a stream")
            if kind == h2.PING:
                if length != 8:
                    raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
                handler.on_ping(flags, payload)
            elif kind == h2.SETTINGS:
                if flags & h2.ACK and length:
                    raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
                handler.on_settings(flags, h2.read_settings(payload))
            else:
                if length < 8:
                    raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "GOAWAY payload shorter than 8 bytes")
                handler.on_goaway()
        elif kind in _STREAM_FRAMES:
            if not stream_id:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, f"{_STREAM_FRAMES[kind]} on stream 0")
            if kind == h2.RST_STREAM:
                if length != 4:
                    raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
                handler.on_rst_stream(stream_id)
            elif kind == h2.PRIORITY:
                if length != 5:  # a stream error in RFC 9113, but the stream may be idle: h2 and nghttp2 do this
                    raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "PRIORITY payload is not 5 bytes")
                if h2.read_uint32(payload) == stream_id:
                    raise h2.Http2Error(h2.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")
                handler.glitch()  # the server does not prioritize: dropped in every stream state
            elif kind == h2.CONTINUATION:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            else:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "a client cannot push")
        else:
            handler.glitch()  # an unknown frame type: ignored, as RFC 9113 asks


_CONNECTION_FRAMES = {h2.PING: "PING", h2.SETTINGS: "SETTINGS", h2.GOAWAY: "GOAWAY"}
_STREAM_FRAMES = {
    h2.RST_STREAM: "RST_STREAM",
    h2.PRIORITY: "PRIORITY",
    h2.CONTINUATION: "CONTINUATION",
    h2.PUSH_PROMISE: "PUSH_PROMISE",
}
