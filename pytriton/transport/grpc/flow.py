"""HTTP/2 flow control of one connection (RFC 9113 section 6.9), both ways.

Inbound, the client may send what the windows this server opened allow: 4 MiB a stream and 16 MiB
in all at first. DATA takes from both windows as it arrives; the server gives the room back as the
calls consume what arrived (`consumed`), not as it arrives: bytes of the message a handler waits for
are consumed at once, a whole message waiting in a streaming call's inbox only when the handler takes
it. So a client cannot make the server hold more than a window of data nobody reads. Room is given
back in WINDOW_UPDATEs of half a window or more. Bytes of messages still arriving are consumed at once
while the connection buffers at most grpc_max_buffered_bytes of them; past it, only the oldest such
message's stream gets its room back, the others' wait (`stall`) until the connection buffers less
(`release`); their connection room comes back at once, so that the oldest message can complete. DATA
over a stream's window resets the stream (FLOW_CONTROL_ERROR), over the connection's window it ends the
connection (as nghttp2 does).

Outbound, the server sends what the client's windows allow (`room`), and WINDOW_UPDATE or a new
SETTINGS_INITIAL_WINDOW_SIZE opens them; a window pushed over 2^31-1 is the client's error.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Protocol

from pytriton.transport.grpc import frames as h2

# What this server lets a client send before it reads: 4 MiB a stream, 16 MiB in all.
STREAM_WINDOW = 4 * 2**20
CONNECTION_WINDOW = 16 * 2**20


class FlowStream(Protocol):
    """A stream's windows, kept on its call."""

    stream_id: int
    recv_window: int  # what the client may still send on it
    held: int  # bytes received on it that its call has not consumed yet
    stalled: int  # bytes its call consumed whose stream room waits for the connection to buffer less
    send_window: int  # what the server may still send on it


class ReceiveWindows:
    """What the client may send: the connection's window here, each stream's on its call."""

    __slots__ = ("_consumed", "_write", "window")

    def __init__(self, write: Callable[[bytes], None]) -> None:
        """Windows opened to STREAM_WINDOW a stream (by SETTINGS) and CONNECTION_WINDOW in all (`opening`)."""
        self._write = write
        self.window = CONNECTION_WINDOW
        self._consumed = 0  # bytes consumed since the connection window was last raised

    @staticmethod
    def opening() -> bytes:
        """The WINDOW_UPDATE raising the connection window from its default to CONNECTION_WINDOW."""
        return h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)

    def take(self, stream: Optional[FlowStream], length: int) -> None:
        """DATA of `length` bytes (padding included) arrived, on a live stream or not.

        Raises:
            Http2Error: FLOW_CONTROL_ERROR over the connection's window.
            StreamError: FLOW_CONTROL_ERROR over the stream's window (the connection's room comes back).
        """
        if length > self.window:
            raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, f"DATA of {length} bytes over the connection window")
        self.window -= length
        if stream is not None:
            if length > stream.recv_window:
                self.dropped(length)
                raise h2.StreamError(stream.stream_id, h2.FLOW_CONTROL_ERROR)
            stream.recv_window -= length

    def consumed(self, stream: FlowStream, amount: int, still_open: bool) -> None:
        """A call consumed `amount` bytes of its stream: give the room back (the stream's while the client may send).

        A stream's room is what it neither may still send, nor holds unread, nor has stalled: consumed since
        its last WINDOW_UPDATE.
        """
        self.dropped(amount)
        if still_open:
            room = STREAM_WINDOW - stream.recv_window - stream.held - stream.stalled
            if room >= STREAM_WINDOW // 2:
                stream.recv_window += room
                self._write(h2.window_update(stream.stream_id, room))

    def stall(self, stream: FlowStream, amount: int) -> None:
        """`amount` bytes of a message still arriving, consumed past the connection's bound: the stream's room waits."""
        stream.stalled += amount
        self.dropped(amount)

    def release(self, stream: FlowStream, still_open: bool) -> None:
        """The connection buffers less: a stalled stream gets its room back (while the client may send on it)."""
        stream.stalled = 0
        if still_open:
            self.consumed(stream, 0, True)

    def dropped(self, length: int) -> None:
        """Bytes nobody will read (a closed stream, a unary call's extra DATA): the connection's room comes back."""
        consumed = self._consumed + length
        if consumed >= CONNECTION_WINDOW // 2:
            self.window += consumed
            self._write(h2.window_update(0, consumed))
            consumed = 0
        self._consumed = consumed


class SendWindows:
    """What the server may send: the connection's window and the client's frame size here, each stream's on its call."""

    __slots__ = ("initial", "max_frame", "window")

    def __init__(self) -> None:
        """The windows and frame size every connection starts with."""
        self.window = h2.DEFAULT_WINDOW
        self.initial = h2.DEFAULT_WINDOW  # SETTINGS_INITIAL_WINDOW_SIZE of the client
        self.max_frame = h2.DEFAULT_MAX_FRAME

    def room(self, stream: FlowStream) -> int:
        """The most a DATA frame on `stream` may carry now."""
        return min(self.window, stream.send_window, self.max_frame)

    def spend(self, stream: FlowStream, size: int) -> None:
        """DATA of `size` bytes went out on `stream`."""
        self.window -= size
        stream.send_window -= size

    def raise_connection(self, increment: int) -> None:
        """WINDOW_UPDATE on stream 0."""
        if increment == 0:
            raise h2.Http2Error(h2.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        self.window += increment
        if self.window > h2.MAX_WINDOW:
            raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, "connection window over 2^31-1")

    @staticmethod
    def raise_stream(stream: FlowStream, increment: int) -> None:
        """WINDOW_UPDATE on a live stream; a stream error when it is 0 or takes the window over 2^31-1."""
        if increment == 0:
            raise h2.StreamError(stream.stream_id, h2.PROTOCOL_ERROR)
        if stream.send_window + increment > h2.MAX_WINDOW:
            raise h2.StreamError(stream.stream_id, h2.FLOW_CONTROL_ERROR)
        stream.send_window += increment

    def settings(self, initial: int | None, max_frame: int | None, streams: Iterable[FlowStream]) -> None:
        """New SETTINGS_INITIAL_WINDOW_SIZE (applied to every live stream) and SETTINGS_MAX_FRAME_SIZE."""
        if initial is not None:
            if initial > h2.MAX_WINDOW:
                raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
            delta = initial - self.initial
            self.initial = initial
            for stream in streams:
                stream.send_window += delta
                if stream.send_window > h2.MAX_WINDOW:
                    raise h2.Http2Error(h2.FLOW_CONTROL_ERROR, "a stream window over 2^31-1")
        if max_frame is not None:
            if not h2.DEFAULT_MAX_FRAME <= max_frame <= h2.MAX_FRAME_LIMIT:
                raise h2.Http2Error(h2.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {max_frame} out of range")
            self.max_frame = max_frame
