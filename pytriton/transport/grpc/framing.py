"""The client's side of an HTTP/2 connection cut into frames: the preface, frame rules and whole header blocks.

What can be checked from a frame alone is checked here (RFC 9113 sections 3.4, 4 and 6): the client
preface is the magic then a SETTINGS frame; no frame is over the MAX_FRAME bytes this server allows
(control frames over 16 KiB and header frames over the header block bound are refused from their
header); each type is on stream 0 or on a stream as it must be, with the payload size its type
requires; a header block (HEADERS, then CONTINUATION frames on the same stream with nothing in between)
arrives whole, its padding and priority fields removed, within `max_block_bytes` and at most
`max_continuations` CONTINUATION frames (ENHANCE_YOUR_CALM beyond either: 300,000 empty CONTINUATIONs
must not cost the server more than a handful); PRIORITY frames are checked and dropped in every stream
state (one that is not 5 bytes, or makes its stream depend on itself, is a stream error, as a HEADERS
depending on itself is once its block is whole); PUSH_PROMISE from a client is a connection error; frames
of unknown types are skipped unread.
The rest goes to the handler, one call per frame, for what the stream or connection state decides; a
stream error it raises resets that stream only, and the frames after it are read on.

DATA is not held until its frame is whole: its payload goes to the handler as it arrives, in pieces
(padding removed, each piece counted with the frame bytes it took for flow control), so a 4 MiB frame
costs no frame buffer; the DATA frames that follow each other in one read go over in one call a stream.
While the rest of a frame belongs to a message under way, the reader offers that message's own buffer
for the next read, and after a large frame it asks for the next frame's header alone (`next_read`,
`filled`): the kernel copies the payload of large frames straight where the message is assembled.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.transport.grpc import frames as h2

# The largest frame this server accepts (SETTINGS_MAX_FRAME_SIZE), as grpc's C-core advertises: its clients
# then send a large message in a few frames rather than one per 16 KiB.
MAX_FRAME = 4 * 2**20
# Frames other than DATA and header frames carry a few bytes: larger ones are refused from their header.
_MAX_CONTROL_FRAME = h2.DEFAULT_MAX_FRAME
# A HEADERS frame's padding (pad length and up to 255 bytes) and priority fields, over its block fragment.
_HEADER_FRAME_EXTRA = 1 + 255 + 5
# The rest of a DATA frame is read straight into its message's buffer when at least this much of it is left
# (below it, one more system call costs more than copying the bytes out of the shared read buffer).
DIRECT_READ_BYTES = 64 * 1024
# A read in place takes at most this much (grpc's clients send frames of up to MAX_FRAME), so that one read is
# a bounded part of a turn of the loop: connection.py counts the reads' own time against its turn budget.
MAX_DIRECT_READ_BYTES = 2**20
_END_OR_PADDED = h2.END_STREAM | h2.PADDED
# DATA shorter than a gRPC message's prefix that does not end its stream carries next to nothing: counted as a
# glitch (floods.py), as an empty one is. A flood of 1-byte frames took a core and was never cut off.
TINY_DATA_BYTES = 5
# `next_read`: read one frame header alone.
HEADER_ONLY = h2.FRAME_HEADER_SIZE


class FrameHandler(Protocol):
    """What the reader hands the frames to (the session), once checked."""

    def on_data(self, stream_id: int, pieces: Sequence[Buffer], length: int, end_stream: bool) -> None:
        """Consecutive DATA payload of a stream, in pieces (`length`: the frame bytes they took, padding included).

        `end_stream` with the last piece of a frame with END_STREAM; an empty frame is one empty piece. The
        pieces are the payloads of the stream's frames in a run of DATA frames read together (other streams'
        frames may lie between them), the first and the last possibly cut off by the reads' ends. They are
        views of the read buffer: what is kept of them must be copied.
        """

    def data_room(self, stream_id: int, limit: int) -> Optional[memoryview]:
        """Where up to `limit` bytes of the stream's DATA may be read in place (its message's buffer), or None."""

    def on_data_in_place(self, stream_id: int, length: int, end_stream: bool) -> None:
        """`length` bytes of the stream's DATA were read into the room `data_room` gave."""

    def on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        """A whole header block on a stream; `flags` are its HEADERS frame's."""

    def on_self_dependent(self, stream_id: int, block: bytes) -> None:
        """A whole header block whose HEADERS made its stream depend on itself (a stream error, RFC 9113 5.3.1)."""

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


class _Run:
    """What a run of DATA frames brought one stream: its payload pieces, the frame bytes they took, END_STREAM."""

    __slots__ = ("counted", "ended", "pieces")

    def __init__(self, first: Optional[memoryview], counted: int, ended: bool) -> None:
        """A stream's run, from the piece of the frame under way (None: its first frame is in the run)."""
        self.pieces: List[Buffer] = [] if first is None else [first]
        self.counted = counted
        self.ended = ended


class FrameReader:
    """Reads one connection's frames out of whatever chunks of bytes arrive."""

    __slots__ = (
        "_block",
        "_block_bytes",
        "_block_flags",
        "_block_frames",
        "_block_stream",
        "_data_end",
        "_data_left",
        "_data_stream",
        "_handler",
        "_large_stream",
        "_max_block_bytes",
        "_max_continuations",
        "_pad_due",
        "_pad_left",
        "_pending",
        "_pending_size",
        "_preface_due",
        "_skip_left",
        "stopped",
    )

    def __init__(self, handler: FrameHandler, max_block_bytes: int, max_continuations: int) -> None:
        """A reader handing frames to `handler`, refusing header blocks over the given size and frame count."""
        self._handler = handler
        self._max_block_bytes = max_block_bytes
        self._max_continuations = max_continuations
        self._preface_due = True
        # The start of a frame header, or of a frame other than DATA, whose end has not arrived.
        self._pending = bytearray()
        self._pending_size = 0  # the whole frame's size once its header is in `_pending` (0: header incomplete)
        # The DATA frame whose payload is arriving (stream 0: none).
        self._data_stream = 0
        self._data_end = False  # it has END_STREAM
        self._data_left = 0  # its payload bytes still to come, padding included
        self._pad_due = False  # it is PADDED and its pad length has not arrived
        self._pad_left = 0  # its padding bytes (at its end)
        self._skip_left = 0  # bytes still to come of a frame of an unknown type, skipped
        self._large_stream = 0  # the stream of the last frame read, when it was a large DATA frame (else 0)
        self._block: list[bytes] = []  # the pieces of a header block awaiting CONTINUATION
        self._block_stream = 0  # its stream (0: no block is open)
        self._block_flags = 0
        self._block_bytes = 0
        self._block_frames = 0
        self.stopped = False  # set by the handler when the connection stops reading

    # -- reading ------------------------------------------------------------------------------------

    def feed(self, data: Buffer) -> None:
        """Handle what arrived: whole frames at once, DATA as it comes, the start of any other frame kept.

        `data` may be a view of a buffer the next read overwrites: what is kept of it is copied.

        Raises:
            Http2Error: a connection error (the handler may raise it too).
        """
        view = data if type(data) is memoryview else memoryview(data)
        size = len(view)
        position = self._preface(view) if self._preface_due else 0
        while position < size and not self.stopped:
            if self._data_stream:
                position = self._data(view, position)
            elif self._skip_left:
                skipped = min(self._skip_left, size - position)
                self._skip_left -= skipped
                position += skipped
            elif self._pending:
                position = self._complete(view, position)
            else:
                position = self._frames(view, position)

    def next_read(self) -> Optional[int | memoryview]:
        """Where the next read should go, when not into the shared read buffer as usual (None).

        - The buffer of the message that the rest of a DATA frame belongs to (a memoryview), when at least
          DIRECT_READ_BYTES of the frame's content are still to come: read in place, then `filled`. The room
          ends within the content (the padding is read as usual).
        - HEADER_ONLY, after a large DATA frame whose message still has a large part to come: a read of a
          frame header alone, then the frame's payload can be read in place. grpc's clients send a large
          message in frames of 128 KiB and more, and a read of the shared buffer's size would take most of the
          next one before its header is known: one more system call a frame saves copying the rest of it.
        """
        if (not self._data_stream and not self._large_stream) or self.stopped:
            return None  # the usual case, small requests: nothing more to ask
        if self._data_stream:
            content = self._data_left - self._pad_left
            if self._pad_due or content < DIRECT_READ_BYTES:
                return None
            room = self._handler.data_room(self._data_stream, min(content, MAX_DIRECT_READ_BYTES))
            return room if room is not None and len(room) >= DIRECT_READ_BYTES else None
        if self._pending or self._skip_left:
            return None
        room = self._handler.data_room(self._large_stream, DIRECT_READ_BYTES)
        return HEADER_ONLY if room is not None and len(room) >= DIRECT_READ_BYTES else None

    def filled(self, length: int) -> None:
        """`length` bytes were read into the room `next_read` gave."""
        stream_id = self._data_stream
        self._data_left -= length
        done = not self._data_left
        if done:
            self._data_stream = 0
        try:
            self._handler.on_data_in_place(stream_id, length, done and self._data_end)
        except h2.StreamError as error:
            self._handler.on_stream_error(error)

    def _preface(self, view: memoryview) -> int:
        """Check the client preface (the magic, then a SETTINGS frame's header); where reading goes on.

        The SETTINGS frame's header is left pending, to be read as any other.
        """
        pending = self._pending
        taken = min(_PREFACE_AND_HEADER - len(pending), len(view))
        pending += view[:taken]
        magic = len(h2.PREFACE)
        if not (pending[:magic] == h2.PREFACE if len(pending) >= magic else h2.PREFACE.startswith(pending)):
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(pending) == _PREFACE_AND_HEADER:
            _, _, kind, flags, _ = h2.FRAME_HEADER.unpack_from(pending, magic)
            if kind != h2.SETTINGS or flags & h2.ACK:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "the connection preface must end with a SETTINGS frame")
            del pending[:magic]
            self._preface_due = False
        return taken

    # -- frames -------------------------------------------------------------------------------------

    def _frames(self, view: memoryview, position: int) -> int:
        """Handle the frames of `view` from `position` on while they are whole; where reading stopped.

        The start of a frame that is not whole is kept (DATA excepted: its payload is handed over as it comes).
        """
        size = len(view)
        unpack = h2.FRAME_HEADER.unpack_from
        while size - position >= h2.FRAME_HEADER_SIZE:
            high, low, kind, flags, stream_id = unpack(view, position)
            length = (high << 8) | low
            stream_id &= 0x7FFFFFFF
            start = position + h2.FRAME_HEADER_SIZE
            end = start + length
            if kind == h2.DATA and not self._block_stream:
                usual = (flags & _END_OR_PADDED) == h2.END_STREAM and length and stream_id and length <= MAX_FRAME
                if end > size or not usual:
                    self._begin_data(length, flags, stream_id)  # not the usual request (one whole unpadded frame)
                    return self._data(view, start)
                self._large_stream = 0  # the usual request: one whole DATA frame ending the stream
                position = end
                try:
                    self._handler.on_data(stream_id, (view[start:end],), length, True)
                except h2.StreamError as error:
                    self._handler.on_stream_error(error)
                if self.stopped:
                    return size
                continue
            self._large_stream = 0
            if length > _MAX_CONTROL_FRAME or self._block_stream:
                self._check(length, kind, stream_id)
            if kind not in _KNOWN:
                self._handler.glitch()  # an unknown frame type: skipped, as RFC 9113 asks
                self._skip_left = max(end - size, 0)
                position = min(end, size)
            elif end <= size:
                position = end
                self._dispatch(kind, flags, stream_id, bytes(view[start:end]))
                if self.stopped:
                    return size
            else:
                self._pending_size = h2.FRAME_HEADER_SIZE + length
                break
        self._pending += view[position:]
        return size

    def _complete(self, view: memoryview, position: int) -> int:
        """Complete the frame (or frame header) begun in an earlier read with just the bytes it misses."""
        pending = self._pending
        if not self._pending_size:
            taken = min(h2.FRAME_HEADER_SIZE - len(pending), len(view) - position)
            pending += view[position : position + taken]
            position += taken
            if len(pending) < h2.FRAME_HEADER_SIZE:
                return position
            high, low, kind, flags, stream_id = h2.FRAME_HEADER.unpack_from(pending)
            length = (high << 8) | low
            stream_id &= 0x7FFFFFFF
            if kind == h2.DATA and not self._block_stream:
                pending.clear()
                self._begin_data(length, flags, stream_id)
                return self._data(view, position)
            self._check(length, kind, stream_id)
            if kind not in _KNOWN:
                pending.clear()
                self._handler.glitch()
                self._skip_left = length
                return position
            self._pending_size = h2.FRAME_HEADER_SIZE + length
        taken = min(self._pending_size - len(pending), len(view) - position)
        pending += view[position : position + taken]
        position += taken
        if len(pending) == self._pending_size:
            _, _, kind, flags, stream_id = h2.FRAME_HEADER.unpack_from(pending)
            payload = bytes(pending[h2.FRAME_HEADER_SIZE :])
            pending.clear()
            self._pending_size = 0
            self._dispatch(kind, flags, stream_id & 0x7FFFFFFF, payload)
        return position

    def _check(self, length: int, kind: int, stream_id: int) -> None:
        """A frame other than DATA, from its header: within its size, and not interrupting a header block."""
        self._large_stream = 0
        if length > MAX_FRAME:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes is over SETTINGS_MAX_FRAME_SIZE")
        if self._block_stream and (kind != h2.CONTINUATION or stream_id != self._block_stream):
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == h2.HEADERS or kind == h2.CONTINUATION:
            if length > self._max_block_bytes + _HEADER_FRAME_EXTRA:
                raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, "header block too large")
        elif length > _MAX_CONTROL_FRAME and kind in _KNOWN:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, f"{_NAMES[kind]} frame of {length} bytes")

    def _dispatch(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A whole frame other than DATA; a stream error it raises resets its stream only."""
        try:
            if self._block_stream:
                self._continuation(flags, stream_id, payload)
            elif kind == h2.HEADERS:
                self._headers(stream_id, flags, payload)
            else:
                self._control(kind, flags, stream_id, payload)
        except h2.StreamError as error:
            self._handler.on_stream_error(error)

    # -- DATA ---------------------------------------------------------------------------------------

    def _begin_data(self, length: int, flags: int, stream_id: int) -> None:
        """A DATA frame's header, checked; its payload is handed over as it arrives."""
        if length > MAX_FRAME:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes is over SETTINGS_MAX_FRAME_SIZE")
        if not stream_id:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "DATA on stream 0")
        padded = bool(flags & h2.PADDED)
        if padded and not length:
            raise h2.Http2Error(h2.FRAME_SIZE_ERROR, "padded frame without a pad length")
        if length < TINY_DATA_BYTES and not flags & h2.END_STREAM:
            self._handler.glitch()
        self._data_stream = stream_id
        self._large_stream = stream_id if length >= DIRECT_READ_BYTES else 0
        self._data_end = bool(flags & h2.END_STREAM)
        self._data_left = length
        self._pad_due = padded
        self._pad_left = 0

    def _data(self, view: memoryview, position: int) -> int:
        """Hand over what `view` holds of the DATA frame under way, and of the DATA frames after it.

        From `position`, where its bytes (or those of its padding) go on; returns where they end. Clients cut a
        large message into frames of 16 KiB (h2load, nghttp2) and interleave the frames of the calls they send
        at once: the DATA frames that follow the one under way in a read (see `_run`) go over with it, one call
        a stream, which costs the session and the calls one pass a stream instead of one a frame.
        """
        size = len(view)
        start = position
        left = self._data_left
        if self._pad_due:
            if position == size:
                return position
            pad = view[position]
            if pad >= left:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "padding longer than the frame")
            position += 1
            left -= 1
            self._pad_due = False
            self._pad_left = pad
        content = min(left - self._pad_left, size - position)
        piece = view[position : position + content]
        position += content
        left -= content
        if left <= self._pad_left:  # the content is all here: what arrived of the padding is skipped
            skipped = min(left, size - position)
            position += skipped
            left -= skipped
            self._pad_left = left
        stream_id = self._data_stream
        self._data_left = left
        if left:
            if position == start:
                return position  # nothing of the frame arrived yet
            self._hand_over(stream_id, (piece,), position - start, False)
            return position
        self._data_stream = 0
        if size - position < h2.FRAME_HEADER_SIZE:
            self._hand_over(stream_id, (piece,), position - start, self._data_end)
            return position
        runs: Dict[int, _Run] = {stream_id: _Run(piece, position - start, self._data_end)}
        position = self._run(view, position, runs)
        for run_stream, run in runs.items():
            if self.stopped:
                break
            self._hand_over(run_stream, run.pieces, run.counted, run.ended)
        return position

    def _run(self, view: memoryview, position: int, runs: Dict[int, _Run]) -> int:
        """Gather into `runs` the DATA frames from `position` on, whatever their streams; where they end.

        The run stops at the read's end (the last frame possibly cut off: it is then the frame under way), and
        before any other frame, a padded, tiny (TINY_DATA_BYTES) or oversized DATA frame, or one after its
        stream's END_STREAM: those are left to the usual way, which refuses (or counts) what it must. Handed
        over a stream at a time, each stream's bytes keep their order and the connection's window counts the
        same bytes: only the order between streams changes, which HTTP/2 does not fix.
        """
        size = len(view)
        unpack = h2.FRAME_HEADER.unpack_from
        last_stream = last_length = 0
        while size - position >= h2.FRAME_HEADER_SIZE:
            high, low, kind, flags, stream_id = unpack(view, position)
            length = (high << 8) | low
            stream_id &= 0x7FFFFFFF
            if kind != h2.DATA or flags & h2.PADDED or length < TINY_DATA_BYTES or length > MAX_FRAME or not stream_id:
                break
            run = runs.get(stream_id)
            if run is None:
                run = runs[stream_id] = _Run(None, 0, False)
            elif run.ended:
                break
            position += h2.FRAME_HEADER_SIZE
            end = position + length
            last_stream, last_length = stream_id, length
            if end > size:  # cut off by the read's end: the frame under way
                run.pieces.append(view[position:size])
                run.counted += size - position
                self._data_stream = stream_id
                self._data_left = end - size
                self._data_end = bool(flags & h2.END_STREAM)
                self._pad_left = 0
                position = size
                break
            run.pieces.append(view[position:end])
            run.counted += length
            position = end
            if flags & h2.END_STREAM:
                run.ended = True
        if last_stream:
            self._large_stream = last_stream if last_length >= DIRECT_READ_BYTES else 0
        return position

    def _hand_over(self, stream_id: int, pieces: Sequence[Buffer], counted: int, end_stream: bool) -> None:
        """DATA of a stream to the handler; a stream error it raises resets that stream only."""
        try:
            self._handler.on_data(stream_id, pieces, counted, end_stream)
        except h2.StreamError as error:
            self._handler.on_stream_error(error)

    # -- header blocks and control frames -------------------------------------------------------------

    def _headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        """A HEADERS frame: a whole header block, or the start of one."""
        if stream_id == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = payload
        if flags & (h2.PADDED | h2.PRIORITY_FLAG):
            block = h2.strip_padding(payload, flags)
            if flags & h2.PRIORITY_FLAG and h2.dependency(payload, flags) == stream_id:
                flags |= h2.SELF_DEPENDENT  # its stream is reset once the block is whole (and decoded: HPACK)
                if flags & h2.END_HEADERS:
                    self._handler.on_self_dependent(stream_id, block)
                    return
        if flags & h2.END_HEADERS:
            self._handler.on_header_block(stream_id, flags, block)
            return
        self._block = [block]
        self._block_stream = stream_id
        self._block_flags = flags
        self._block_bytes = len(block)
        self._block_frames = 0

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        """The next CONTINUATION of the open header block (`_check` saw it is one, on the block's stream)."""
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
            if self._block_flags & h2.SELF_DEPENDENT:
                self._handler.on_self_dependent(stream_id, block)
            else:
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
                # Stream errors (RFC 9113 6.3, 5.3.1), whatever the stream's state: the session knows what a reset
                # does in each (an idle stream stays idle). Not the connection's: its other calls go on.
                if length != 5:
                    raise h2.StreamError(stream_id, h2.FRAME_SIZE_ERROR)
                if h2.read_uint32(payload) == stream_id:
                    raise h2.StreamError(stream_id, h2.PROTOCOL_ERROR)
                handler.glitch()  # the server does not prioritize: dropped in every stream state
            elif kind == h2.CONTINUATION:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            else:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, "a client cannot push")


_CONNECTION_FRAMES = {h2.PING: "PING", h2.SETTINGS: "SETTINGS", h2.GOAWAY: "GOAWAY"}
_STREAM_FRAMES = {
    h2.RST_STREAM: "RST_STREAM",
    h2.PRIORITY: "PRIORITY",
    h2.CONTINUATION: "CONTINUATION",
    h2.PUSH_PROMISE: "PUSH_PROMISE",
}
_NAMES = {h2.HEADERS: "HEADERS", h2.WINDOW_UPDATE: "WINDOW_UPDATE", **_CONNECTION_FRAMES, **_STREAM_FRAMES}
_KNOWN = frozenset(_NAMES)  # the frame types other than DATA (the others are skipped)
_PREFACE_AND_HEADER = len(h2.PREFACE) + h2.FRAME_HEADER_SIZE
