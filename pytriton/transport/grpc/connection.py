"""One HTTP/2 connection of the gRPC server: the transport under an HTTP/2 session (`session.py`).

Reads go into one buffer the server's connections share (what arrives is handled, and copied out where
it is kept, before the next read), or, while a large DATA frame fills a message, straight into that
message's buffer (framing.py): the loop makes no bytes object of its own for what it reads.

Writes made while the loop runs one callback go out together at its end (one system call for every
response a batch completed). A connection error is answered with GOAWAY, then the connection reads
and drops what still arrives for a moment before it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import hpack

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.options.limits import OVER_CAP_HELD
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc.read_gate import ReadGate
from pytriton.transport.grpc.session import Http2Session
from pytriton.transport.send_watch import SendWatch

if TYPE_CHECKING:
    from pytriton.transport.grpc.server import GrpcServerState

# Writes above this size go out with writev rather than joined into one buffer.
_JOIN_LIMIT_BYTES = 64 * 1024
# What the kernel takes of a connection's answers beyond what it can send at once (TCP_NOTSENT_LOWAT), for a
# client that sends large messages in small DATA frames. Left to itself the kernel takes megabytes, and the
# transport pauses writing (so the connection stops reading: read_gate.py) only once the client is megabytes
# behind; with this, as soon as it is behind, and the two directions take turns. For 16 KiB frames (nghttp2,
# Go's and Java's gRPC, Envoy), 1 MiB calls four at a time on loopback: 7-18 % less server CPU a call. The loop
# then refills the socket every 64 KiB, which costs more than the turns give back to a client of large frames
# (grpc's C-core, so tritonclient: +7 %) or of small requests for large answers (+11 %): those keep the
# kernel's usual buffering (docs/performance.md, "the eighth look").
UNSENT_LOW_WATER_BYTES = 64 * 1024
# The bound is set once this much came in reads of _LARGE_READ_BYTES or more (or full reads, where the read sizing
# below made them smaller: on a busy machine it does for any client) with no DATA frame large enough to be read in
# place (framing.DIRECT_READ_BYTES); never, once one was.
SMALL_FRAMES_EVIDENCE_BYTES = 2 * 2**20
_LARGE_READ_BYTES = 64 * 1024
# How long a connection that failed keeps reading (and dropping) after its GOAWAY.
_LINGER_S = 2.0
# Loop time one connection may take in reads that follow each other before it lets the others go first. A
# client of tiny frames (a few bytes of DATA or WINDOW_UPDATE each, ~0.7 us of Python a frame) otherwise held
# the loop for as long as libuv read for it in one turn: up to 32 reads of 256 KiB, about 0.4 s.
TURN_BUDGET_S = 0.002
# Reads closer than this to the previous one's end are the same turn's (libuv reads on while the buffer fills).
_SAME_TURN_S = 0.0002
# The turn budget is checked between reads, and one 256 KiB read of 13-byte frames is ~20 ms of Python: reads
# are sized so that one costs about READ_COST_S to handle (LEAST_READ_BYTES at least), from what a byte of the
# connection has cost, so that the others wait about a budget, not a whole read's worth. Large messages never
# come near it: a 256 KiB read of their DATA is ~0.1 ms.
READ_COST_S = 0.0005
LEAST_READ_BYTES = 16 * 1024
# Reads handled faster than this leave the sizing alone while reads are whole (the usual case costs nothing).
_CHEAP_READ_S = READ_COST_S / 4


class GrpcConnection(asyncio.BufferedProtocol):
    """An HTTP/2 connection serving gRPC calls on the engine's loop."""

    def __init__(self, state: GrpcServerState, loop: asyncio.AbstractEventLoop) -> None:
        """A connection of the server whose shared state is `state`."""
        self._state = state
        self.loop = loop
        self._transport: Optional[asyncio.Transport] = None
        self.peer = "unknown"
        self.over_cap = False  # one over grpc_max_connections counted elsewhere (the hub, for a frontend process)
        self._cut_off_logged = False
        self.session = Http2Session(
            state,
            loop,
            write=self._write,
            write_all=self._write_all,
            close=self._close,
            abort=self.abort,
            cut_off=self._cut_off,
            placeless=lambda: state.connections.placeless(self),
        )
        self._out: List[Buffer] = []
        self._out_bytes = 0
        self._flush_pending = False
        self._reading = False
        self._in_place = False  # the last read went into a message's buffer (get_buffer), not the shared one
        self._socket: Optional[Any] = None  # a TCP connection's socket, until its client's frames are weighed
        self._large_reads = 0  # bytes read in reads of _LARGE_READ_BYTES or more, while the frames are weighed
        self._reader = self.session.reader
        self._read_view = state.read_view
        self._linger: Optional[asyncio.TimerHandle] = None
        self._last_read = 0.0  # when the handling of this connection's last read ended (perf_counter)
        self._busy = 0.0  # the loop time its reads took since they began following each other
        self._room_given = 0.0  # when get_buffer gave the last room in a message's buffer (perf_counter)
        self._gate = ReadGate(loop, closed=lambda: self.session.closed, read_on=self._hold_answers)
        self._read_limit: Optional[int] = None  # the most a read of the shared buffer takes (None: all of it)
        self._byte_cost = 0.0  # seconds a byte of this connection's reads costs to handle (see _size_reads)
        self._send_watch = SendWatch(loop, state.send_timeout_s, self._read_nothing)

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection and start its session (this server's preface goes out)."""
        self._transport = transport  # type: ignore[assignment]
        self._gate.attach(self._transport)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._socket = sock
        state = self._state
        if not state.connections.add(self):
            transport.close()
            return
        # At the cap, the connection without a call for the longest makes room (connection_cap.py).
        over_cap = self.session.over_cap = not state.cap.admit(self.session, self.over_cap)
        if over_cap:
            state.connections.placeless(self)
        if over_cap and len(state.connections) - state.cap.served > OVER_CAP_HELD:
            transport.close()  # past those held to be answered UNAVAILABLE: it would hold a descriptor until a timeout
            return
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple):
            host, port = peername[0], peername[1]
            if host.startswith("::ffff:") and "." in host:  # an IPv4 client of the dual-stack port, named as grpc does
                host = host[7:]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self.session.start()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        """Cancel every call still in progress."""
        self.session.stop()
        self._state.connections.forget(self)
        self._state.cap.leave(self.session)
        self._send_watch.stop()
        self._gate.stop()
        if self._linger is not None:
            self._linger.cancel()
        self.session.cancel_calls()

    def pause_writing(self) -> None:
        """The client reads slower than we answer: stop reading requests until it catches up (read_gate.py)."""
        self.session.sender.paused = True
        self._gate.writes_paused()
        if self._transport is not None:
            self._send_watch.paused(self._transport)

    def _hold_answers(self) -> None:
        """Reading on for a client behind on its answers (read_gate.py): answers wait in their calls until it reads."""
        self.session.sender.holding = True

    def resume_writing(self) -> None:
        """The client caught up: read again, and send the answers that waited."""
        self._send_watch.stop()
        self._gate.writes_resumed()
        self.session.writable_again()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: the buffer of the message a large DATA frame fills, or the shared read buffer."""
        target = self._reader.next_read()
        if target is None:
            self._in_place = False
            return self._read_view if self._read_limit is None else self._read_view[: self._read_limit]
        self._socket = None  # a client of DATA frames large enough to read in place: its answers are never bound
        if isinstance(target, int):  # a frame header alone
            self._in_place = False
            return self._read_view[:target]
        self._in_place = True
        self._room_given = perf_counter()  # the read itself (a copy into fresh pages) is the turn's time too
        return target

    def buffer_updated(self, nbytes: int) -> None:
        """Hand every whole frame that arrived (and what arrived of DATA) to the session."""
        if self.session.closed:
            return  # after a connection error: read and dropped until the linger ends
        started = perf_counter()
        turn_from = self._room_given if self._in_place else started
        if turn_from - self._last_read > _SAME_TURN_S:
            self._busy = 0.0
        self._reading = True
        try:
            if self._in_place:
                self._reader.filled(nbytes)
            else:
                self._reader.feed(self._read_view[:nbytes])
        except h2.Http2Error as error:
            self._fail(error.code, str(error), error.after_goaway)
        except hpack.HPACKError as error:
            self._fail(h2.COMPRESSION_ERROR, f"invalid header block: {error}")
        finally:
            self._reading = False
        if self._socket is not None and (nbytes >= _LARGE_READ_BYTES or nbytes == self._read_limit):
            self._weigh_frames(nbytes)
        if nbytes >= LEAST_READ_BYTES:  # a read that small is below any limit: its cost sizes nothing
            handled = perf_counter() - started
            if handled > _CHEAP_READ_S or self._byte_cost:
                self._size_reads(nbytes, handled)
        if self._out:
            self._flush()
        self._last_read = ended = perf_counter()
        self._busy += ended - turn_from
        if self._busy > TURN_BUDGET_S and not self._gate.yielding:
            self._gate.turn_over()
            self.loop.call_soon(self._next_turn)

    def _weigh_frames(self, nbytes: int) -> None:
        """Count a large read of small frames: past SMALL_FRAMES_EVIDENCE_BYTES, bound the unsent answers."""
        self._large_reads += nbytes
        if self._large_reads >= SMALL_FRAMES_EVIDENCE_BYTES:
            sock, self._socket = self._socket, None
            if sock is not None:
                with contextlib.suppress(OSError, AttributeError):  # Linux and macOS have it (each its own number)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LOW_WATER_BYTES)

    def _size_reads(self, nbytes: int, handled_s: float) -> None:
        """Size the next reads of the shared buffer by what a byte of this connection costs to handle.

        The cost rises at once and falls by a quarter a read: a client that mixes cheap large frames in with
        its floods of tiny ones (to win back whole reads after a few cheap ones) keeps paying for the tiny ones.
        """
        cost = handled_s / nbytes  # called for reads of LEAST_READ_BYTES or more, with a cost above 0
        self._byte_cost = cost if cost > self._byte_cost else self._byte_cost * 0.75 + cost * 0.25
        limit = READ_COST_S / self._byte_cost
        if limit >= len(self._read_view):
            self._read_limit = None
            self._byte_cost = 0.0  # whole reads again: nothing to follow until a read costs (_CHEAP_READ_S)
        else:
            self._read_limit = max(int(limit), LEAST_READ_BYTES)

    def _next_turn(self) -> None:
        """The other connections had their turn: read again (unless the client's reading holds this one back)."""
        self._busy = 0.0
        self._gate.next_turn()

    # -- writing ----------------------------------------------------------------------------------

    def _write(self, data: Buffer) -> None:
        """Queue bytes for the end of this loop callback."""
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flush_pending:
            self._flush_pending = True
            if not self._reading:
                self.loop.call_soon(self._flush)

    def _write_all(self, pieces: List[Buffer], size: int) -> None:
        """Queue `size` bytes in pieces for the end of this loop callback."""
        self._out += pieces
        self._out_bytes += size
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
        if not out or transport is None or self.session.closed:
            return
        if size > _JOIN_LIMIT_BYTES and len(out) > 1:
            transport.writelines(out)
        else:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        self._gate.wrote()

    # -- closing (transport.connections.Closable) -------------------------------------------------

    @property
    def sending(self) -> bool:
        """Whether answers are still leaving: bytes the client has not read, or DATA waiting for its window."""
        if self._transport is not None and self._transport.get_write_buffer_size() > 0:
            return True
        return any(call.outbox for call in self.session.calls.values())

    def shutdown(self) -> None:
        """Refuse new calls (GOAWAY), finish those in progress, then close."""
        self.session.shutdown()

    async def leave(self) -> None:
        """A graceful GOAWAY: the client opens its next calls elsewhere, those in progress go on."""
        await self.session.leave()

    def abort(self) -> None:
        """Close at once: no preface in time, no answer to a keepalive ping, or the end of the stop grace."""
        if self._transport is not None:
            self._transport.abort()

    def _close(self) -> None:
        """Close once what is queued is sent (a connection over the cap lingers: its client may still be sending)."""
        self._flush()
        self.session.stop()
        if self.session.over_cap or self.session.lingers:
            self._linger_close()
        elif self._transport is not None:
            self._transport.close()

    def _fail(self, code: int, message: str, after_goaway: Optional[Callable[[], None]] = None) -> None:
        """A connection error: GOAWAY with its code, what `after_goaway` writes, then close once read."""
        self._cut_off(f"{message} (GOAWAY {h2.error_name(code)})")
        self.session.goaway.error(code, message)
        if after_goaway is not None:
            after_goaway()
        self._flush()
        self.session.stop()
        self._linger_close()

    def _read_nothing(self) -> None:
        """The client read none of a full send buffer for send_timeout_s (send_watch.py): let it go."""
        self._cut_off(f"it read none of its responses for {self._state.send_timeout_s:g} s")
        self.abort()

    def _cut_off(self, reason: str) -> None:
        """The connection ends for what its client did: a warning naming the peer, once (rate-limited per server)."""
        if not self._cut_off_logged:
            self._cut_off_logged = True
            self._state.cutoffs.cut_off(self.peer, reason)

    def _linger_close(self) -> None:
        """Shut the write side down, read and drop what still arrives for a moment, then close.

        Closing with the client's bytes still unread would answer them with a TCP reset, which can
        overtake the GOAWAY; grpc and nghttp2 linger likewise.
        """
        transport = self._transport
        if transport is None:
            return
        if transport.can_write_eof():
            transport.write_eof()
            self._linger = self.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()
