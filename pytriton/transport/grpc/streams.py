"""HTTP/2 stream states (RFC 9113 section 5.1) as this server sees them, and what a client's frame does in each.

The server never pushes, so the reserved states never occur. "closed" is split by how the stream
closed, because the frames that may still arrive differ (5.1, "closed"):

- the server reset it (a stream error, or a status sent before the client ended its side, as grpc
  does): the client's frames already on their way are dropped ("MUST ignore");
- the client reset it: anything but PRIORITY, WINDOW_UPDATE and RST_STREAM is a stream error
  STREAM_CLOSED (h2 drops those three too);
- both sides ended it (END_STREAM each way): more DATA or HEADERS is a connection error
  STREAM_CLOSED (on a half-closed (remote) stream, before the server ended it, a stream error);
- it closed too long ago to be remembered (or was skipped: opening stream 7 closes an idle 5): frames
  are dropped, as nghttp2 does, since the server cannot keep every stream it ever saw; but HEADERS there
  is a connection error PROTOCOL_ERROR (5.1.1: a new stream's id must be above every one opened before,
  and a client that opens 3 and then 1 would otherwise wait on stream 1 for ever), as h2 does.

PRIORITY is read and dropped in every state (the server does not prioritize), but one that is not 5
bytes, or makes its stream depend on itself, is a stream error (RFC 9113 6.3, 5.3.1) in every state:
RST_STREAM, except on a stream the server reset already (ignored, as any frame there); an idle stream so
reset stays idle (PRIORITY opens no stream, 5.1: the client may still open it, or a lower one). A HEADERS
depending on itself is what a HEADERS is in its state, then a stream error: a new stream closes at once,
reset by the server, its id used. CONTINUATION belongs to the header block it continues, which counts as
one HEADERS.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Generic, Protocol, Sequence, TypeVar

from pytriton.transport.grpc import frames as h2

# States. OPEN to HALF_CLOSED_LOCAL are live (a call serves the stream), those after them closed.
IDLE, OPEN, HALF_CLOSED_REMOTE, HALF_CLOSED_LOCAL, RESET_BY_SERVER, RESET_BY_CLIENT, ENDED, FORGOTTEN = range(8)
STATE_NAMES = (
    "idle",
    "open",
    "half-closed (remote)",
    "half-closed (local)",
    "closed (reset by the server)",
    "closed (reset by the client)",
    "closed (ended both ways)",
    "closed (forgotten)",
)

# What a frame received on a stream does.
ACCEPT = 0  # the stream's call takes it
DROP = 1  # dropped: DATA still counts against the connection window, a header block still updates HPACK
RESET = 2  # stream error STREAM_CLOSED
CLOSED_ERROR = 3  # connection error STREAM_CLOSED
PROTOCOL_ERROR = 4  # connection error PROTOCOL_ERROR

_KINDS = (h2.DATA, h2.HEADERS, h2.PRIORITY, h2.RST_STREAM, h2.WINDOW_UPDATE)
# Rows: the state; columns: DATA, HEADERS, PRIORITY, RST_STREAM, WINDOW_UPDATE.
_RECEIVED_ROWS = {
    IDLE: (PROTOCOL_ERROR, ACCEPT, DROP, PROTOCOL_ERROR, PROTOCOL_ERROR),
    OPEN: (ACCEPT, ACCEPT, DROP, ACCEPT, ACCEPT),
    HALF_CLOSED_REMOTE: (RESET, RESET, DROP, ACCEPT, ACCEPT),
    HALF_CLOSED_LOCAL: (ACCEPT, ACCEPT, DROP, ACCEPT, ACCEPT),
    RESET_BY_SERVER: (DROP, DROP, DROP, DROP, DROP),
    RESET_BY_CLIENT: (RESET, RESET, DROP, DROP, DROP),
    ENDED: (CLOSED_ERROR, CLOSED_ERROR, DROP, DROP, DROP),
    FORGOTTEN: (DROP, PROTOCOL_ERROR, DROP, DROP, DROP),
}


def _received_table() -> Sequence[Sequence[int]]:
    """RECEIVED[state][frame type], from the rows above (frame types without a column are not per stream)."""
    table = []
    for state in range(len(STATE_NAMES)):
        row = [PROTOCOL_ERROR] * (h2.CONTINUATION + 1)
        for kind, action in zip(_KINDS, _RECEIVED_ROWS[state]):
            row[kind] = action
        table.append(tuple(row))
    return tuple(table)


RECEIVED = _received_table()

# Events that move a live stream, and where each leads; a pair not listed cannot happen (a bug).
RECV_END_STREAM, SEND_END_STREAM, RECV_RESET, SEND_RESET = range(4)
_NEXT = {
    (OPEN, RECV_END_STREAM): HALF_CLOSED_REMOTE,
    (OPEN, SEND_END_STREAM): HALF_CLOSED_LOCAL,
    (HALF_CLOSED_REMOTE, SEND_END_STREAM): ENDED,
    (HALF_CLOSED_LOCAL, RECV_END_STREAM): ENDED,
    **{(state, RECV_RESET): RESET_BY_CLIENT for state in (OPEN, HALF_CLOSED_REMOTE, HALF_CLOSED_LOCAL)},
    **{(state, SEND_RESET): RESET_BY_SERVER for state in (OPEN, HALF_CLOSED_REMOTE, HALF_CLOSED_LOCAL)},
}
NEXT = tuple(tuple(_NEXT.get((state, event), -1) for event in range(4)) for state in range(len(STATE_NAMES)))

# How many closed streams a connection remembers (with how they closed) for the frames still arriving.
REMEMBERED_CLOSED = 128


class Stream(Protocol):
    """What the table needs of a live stream."""

    stream_id: int
    state: int


S = TypeVar("S", bound=Stream)


class StreamTable(Generic[S]):
    """The streams of one connection: the live ones by id, how recent ones closed, the highest id used."""

    __slots__ = ("_closed", "last_id", "live")

    def __init__(self) -> None:
        """No stream yet."""
        self.live: Dict[int, S] = {}
        self._closed: OrderedDict[int, int] = OrderedDict()
        self.last_id = 0  # streams up to this id are not idle any more

    def state_of(self, stream_id: int) -> int:
        """The state of a stream that is not live (even ones are the server's, which never opens any)."""
        if stream_id > self.last_id or not stream_id & 1:
            return IDLE
        return self._closed.get(stream_id, FORGOTTEN)

    def open(self, stream: S) -> None:
        """A client's HEADERS opened `stream` (its state is set by the caller)."""
        self.live[stream.stream_id] = stream
        self.last_id = stream.stream_id

    def skip(self, stream_id: int, state: int) -> None:
        """A new stream that never went live (refused, or answered at once) closed in `state`."""
        self.last_id = stream_id
        self.remember(stream_id, state)

    def move(self, stream: S, event: int) -> int:
        """Apply an event to a live stream; forget it (remembering how it closed) when it closes."""
        state = NEXT[stream.state][event]
        if state < 0:
            raise AssertionError(f"stream {stream.stream_id}: no transition from {STATE_NAMES[stream.state]}")
        stream.state = state
        if state > HALF_CLOSED_LOCAL:  # closed
            del self.live[stream.stream_id]
            self.remember(stream.stream_id, state)
        return state

    def remember(self, stream_id: int, state: int) -> None:
        """Keep how a stream closed for a while, for the frames still arriving on it."""
        closed = self._closed
        closed[stream_id] = state
        if len(closed) > REMEMBERED_CLOSED:
            closed.popitem(last=False)
