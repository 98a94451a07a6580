"""One HTTP/1.1 connection: httptools parses the requests, each becomes a RequestCycle run by the ASGI app.

Requests on a connection are answered in order (a pipelined request waits for the response before
it). The connection also enforces what ServerLimits asks of each connection: a cap on the request
line and headers (431), timeouts for the headers and for a stalled body (408), an idle timeout before
and between requests (before the first, the header timeout if that is shorter), and a cap on connections
(503). One timer per connection follows a deadline that moves with each phase (idle, request head, body),
so a request costs a clock read and a few comparisons, not a timer of its own.

It is a BufferedProtocol: heads and small bodies are read into the server's one read buffer and parsed
from there; a body whose Content-Length is large goes past the parser, straight into the buffer the app
receives (`transport/http/body.py`), and a fresh parser takes the next request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any, Deque, List, Optional, Tuple

import httptools

from pytriton.core.waiters import wake
from pytriton.options.limits import OVER_CAP_HELD
from pytriton.transport.deadline import APP, PhaseDeadline
from pytriton.transport.http.body import PRESIZED_BODY_BYTES, PresizedBody
from pytriton.transport.http.cycle import HEADER_NAMES, RequestCycle, http_scope, socket_address
from pytriton.transport.http.refusals import (
    CONFLICTING_HOSTS,
    UNKNOWN_TRANSFER_CODING,
    UPGRADE_WITH_BODY,
    error_response,
    refusal,
    without_upgrade_header,
)
from pytriton.transport.receive_budget import CHUNKED_STEP_BYTES, SHARE_BYTES
from pytriton.transport.send_watch import SendWatch

if TYPE_CHECKING:
    from pytriton.options.limits import ServerLimits
    from pytriton.transport.http.server import ServerState

LOGGER = logging.getLogger(__name__)

_LINGER_S = 2.0
# llhttp's error for an HTTP/2 connection preface ("PRI * HTTP/2.0"): a client speaking HTTP/2 with prior knowledge.
_H2_PREFACE_ERROR = "Pause on PRI/Upgrade"
# Reads up to this size are searched whole for an Upgrade header; longer ones only up to their head's end.
_SHORT_READ_BYTES = 4096
IDLE, HEAD, BODY = 1, 2, 3  # what the connection waits for: the next request, a request head, its body
# A method llhttp knows, for a request of one it does not; its framing is that of any method but CONNECT's.
_STANDIN_METHOD = b"PROPFIND"
_METHOD_BYTES = 1024  # how far a request line is searched for the end of its method
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 5.6.2
# Inside a chunked body, each chunk is a callback of Python (~1 us): a body of 1-byte chunks held the loop for as
# long as libuv read for the connection in one turn (up to 32 reads of 256 KiB, ~1.5 s), and every other client
# waited seconds a request. Such reads are timed: past TURN_BUDGET_S of them in a turn the connection stops
# reading until the loop's next turn, and they are sized to cost about READ_COST_S each (LEAST_READ_BYTES at
# least), from what a byte of the last one cost. The figures are the gRPC connection's (grpc/connection.py).
TURN_BUDGET_S = 0.002
READ_COST_S = 0.0005
LEAST_READ_BYTES = 16 * 1024
_SAME_TURN_S = 0.0002  # reads closer than this to the previous one's end are the same turn's
# A read is parsed whole, and each request in it costs ~30 us of Python: a client pipelining tiny requests (18
# bytes a GET) put 14,000 of them in a 256 KiB read, and held the loop ~0.5 s a read (other clients waited
# 0.7 s a request for as long as it went on). Once a read begins more than PIPELINED_REQUESTS requests, the
# connection's reads are PIPELINED_READ_BYTES at most for as long as it lives (reads pause while requests wait).
PIPELINED_REQUESTS = 64
PIPELINED_READ_BYTES = 4096


class HttpConnection(asyncio.BufferedProtocol):
    """An HTTP/1.1 connection serving an ASGI app."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        """A connection of the server whose shared state is `state`."""
        self._state = state
        self._limits = state.limits
        self._loop = loop
        self._transport: Optional[asyncio.Transport] = None
        self._parser = httptools.HttpRequestParser(self)
        self._address: Tuple[Optional[Tuple[str, int]], Optional[Tuple[str, int]]] = (None, None)
        self._url = b""
        self._headers: List[Tuple[bytes, bytes]] = []
        # The headers' names as sent, for an app that forwards headers to callables (HEADER_NAMES), or None.
        self._names: Optional[List[bytes]] = [] if state.header_names else None
        self._wire = IDLE  # what is arriving: HEAD (a request head), BODY (its body) or IDLE (nothing)
        self._receiving: Optional[RequestCycle] = None  # the request whose body is arriving
        self._active: Optional[RequestCycle] = None  # the request being answered
        self._pipeline: Deque[RequestCycle] = deque()  # requests waiting for the active one's response
        self._to_start: Optional[RequestCycle] = None
        self._task: Optional[asyncio.Task[None]] = None  # runs the app for each request, one after the other
        self._next: Optional[RequestCycle] = None  # the request the task answers next
        self._idle: Optional[asyncio.Future[None]] = None  # the task waits on it for the next request
        self._over_cap = False
        self.over_cap = False  # one over max_connections counted elsewhere (the hub, for a frontend process)
        self._closing = False
        self._refused = False
        self._refusal_due: Optional[bytes] = None  # the error response sent once the responses owed are out
        self._reading_paused = False
        self._body_full = False  # the app has not taken the body held for it yet
        self._budget_wait = False  # the body arriving waits for room in the server's ReceiveBudget
        self._watched_fd = -1  # its socket, watched for the client hanging up meanwhile (hangups.py)
        self._write_paused = False
        self._send_watch = SendWatch(self._loop, self._limits.send_timeout_s, self._read_nothing)
        self._drain: Optional[asyncio.Future[None]] = None
        self._clock = PhaseDeadline(loop, self._on_deadline)
        self._head_bytes = 0  # bytes of the unfinished request head received so far
        self._head_tail = b""  # its last bytes (up to 3) while the head is unfinished at the end of a read
        self._head_began = False  # a request head began in the chunk being parsed
        self._head_lines = 0  # bytes of the target and the whole header lines of the head being parsed
        self._head_fields = False  # the head being parsed has had a header line (its request line is whole)
        self._body_seen = False  # the chunk being parsed had body bytes in it
        self._headed = False  # ... and the end of a request head
        self._bodiless_bytes = 0  # bytes of the body being received since its last body bytes (chunked framing)
        self._expect_continue = False  # the head being parsed has Expect: 100-continue (any letter case)
        self._declared_length = 0  # the content-length of the request whose head is arriving
        self._chunked_body = False  # the request whose head is arriving has a transfer-encoding
        self._other_codings = False  # ... naming a coding other than chunked
        self._host: Optional[bytes] = None  # its first Host header's value
        self._hosts_differ = False  # it has Host headers of different values
        self._read_buffer = state.read_buffer
        self._read_view = state.read_view
        self._read_room = state.read_view  # the most a read takes: the read view, or its start (PIPELINED_REQUESTS)
        self._read_to = state.read_view  # what get_buffer gives: the read room, or its start inside a costly body
        self._busy = 0.0  # loop time the timed reads of this turn took (TURN_BUDGET_S)
        self._last_read = 0.0  # when the last timed read was handled (perf_counter)
        self._yielding = False  # its turn is over: no reads until the loop's next one
        self._presized: Optional[PresizedBody] = None  # a body on_headers_complete chose to read past the parser
        self._begun = 0  # requests begun in the chunk being parsed
        self._method: Optional[str] = None  # the method of the request being parsed, when llhttp does not know it
        self._direct: Optional[PresizedBody] = None  # that body, once reads go straight into it

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection and wait for its first request."""
        self._transport = transport  # type: ignore[assignment]
        state = self._state
        if not state.connections.add(self):
            transport.close()
            return
        self._address = (
            socket_address(transport.get_extra_info("sockname")),
            socket_address(transport.get_extra_info("peername")),
        )
        # At the cap, the connection that has waited on its client longest makes room (connection_cap.py).
        self._over_cap = not state.cap.admit(self, self.over_cap)
        if self._over_cap:
            state.connections.placeless(self)
        if self._over_cap and len(state.connections) - state.cap.served > OVER_CAP_HELD:
            transport.close()  # past those held to be answered 503: it would hold a descriptor until a timeout
            return
        self._clock.enter(IDLE, _first_request_timeout_s(self._limits))

    def connection_lost(self, exc: Optional[Exception]) -> None:
        """Tell every request of the connection that its client left."""
        self._state.connections.forget(self)
        self._state.cap.leave(self)
        self._forget_hangup()
        self._clock.cancel()
        self._send_watch.stop()
        for cycle in (self._active, self._receiving, *self._pipeline):
            if cycle is not None:
                cycle.lose_connection()
        self._pipeline.clear()
        # A body cut off part-way goes now, not with the connection: its protocol's bound methods (the parser's,
        # the clocks') hold it in a reference cycle, which only the cycle collector frees, maybe minutes later.
        self._presized = self._direct = None
        self._wake_drain()
        self._wake_task()  # it ends: no request will come

    def eof_received(self) -> bool:
        """The client will send nothing more: answer the requests it sent whole, then close, as Triton does.

        A client may half-close its side (shutdown(SHUT_WR), `nc -N`) and still read its answers, and one that
        closed its socket looks the same from here until it answers a write with a reset. So the requests read
        whole go on and are answered; their app is told the client stopped sending (receive() says
        "http.disconnect" with CONNECTION_LOST, cycle.py), and an app that watches for its client leaving (a
        request still waiting or running after WATCH_AFTER_S, core/watch.py; a stream) has a `100 Continue` sent
        unless its answer has begun, and stops once the socket is reset (watched here, as nothing is read any
        more). A request cut off part-way can never be answered: the connection closes at once (False).
        """
        active = self._active
        if active is None or self._refused or self._wire != IDLE or self._transport is None:
            return False
        owed = (active, *self._pipeline)
        for cycle in owed:
            cycle.end_sending()
        owed[-1].keep_alive = False  # the connection closes after the last response owed
        # Nothing is read any more, so a client that closed is seen only when it answers a write with a reset.
        sock = self._transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if self._watched_fd < 0:
            reset = functools.partial(self._left, "after it stopped sending")
            if self._state.hangups.watch(fd, reset, reset_only=True):
                self._watched_fd = fd
        return True

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport reads to: the free room of a presized body, else the server's read buffer."""
        direct = self._direct
        if direct is None or self._refused:
            return self._read_to
        view = self._read_view
        receiving = self._receiving
        if receiving is not None and receiving.response_complete:
            direct.drop()  # answered before its body came: the rest is read and dropped
        room = direct.room()
        if room is not None:
            return room
        return view[: direct.left] if direct.left < len(view) else view  # never past the body's end

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` arrived where get_buffer said."""
        direct = self._direct
        if direct is not None and not self._refused:
            direct.filled += nbytes
            if direct.complete:
                self._direct = None
                self.on_message_complete()
            self._follow_wire(nbytes)
        elif self._chunked_body and self._wire == BODY:
            self._parse_timed(nbytes)
        else:
            self._parse(nbytes)

    def _parse_timed(self, nbytes: int) -> None:
        """Parse a read inside a chunked body, within the connection's turn budget (TURN_BUDGET_S)."""
        started = perf_counter()
        if started - self._last_read > _SAME_TURN_S:
            self._busy = 0.0
        self._parse(nbytes)
        self._last_read = ended = perf_counter()
        spent = ended - started
        self._busy += spent
        view = self._read_room
        if self._wire != BODY:
            self._read_to = view
        elif nbytes >= LEAST_READ_BYTES and spent > 0:
            limit = int(READ_COST_S * nbytes / spent)
            self._read_to = view if limit >= len(view) else view[: max(limit, LEAST_READ_BYTES)]
        if self._busy > TURN_BUDGET_S and not self._yielding:
            self._yielding = True
            self._sync_reading()
            self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """The other connections had their turn: read again (unless something else holds the reads)."""
        self._busy = 0.0
        self._yielding = False
        if self._transport is not None and not self._transport.is_closing():
            self._sync_reading()

    def _parse(self, nbytes: int) -> None:
        """Parse what arrived in the read buffer; start the app for a request whose head is complete."""
        if self._refused:
            return
        data: Any = self._read_view[:nbytes]
        split = nbytes  # where a long read's first head ends: the parser sees the bytes after it only if it must
        clock = self._clock
        fresh = clock.phase != BODY and clock.phase != HEAD  # this chunk starts a request head
        if clock.phase != BODY:  # this chunk starts or continues a request head
            if clock.phase != HEAD:
                self._head_bytes = 0
                clock.enter(HEAD, self._limits.header_timeout_s)
            # Only the head is searched: a chunk that also carries a large body must not cost a scan of it
            # (two scans of a 256 KiB read took a quarter of the server's CPU with 1 MiB requests). A short
            # read is searched whole, which costs less than finding where its head ends.
            buffer = self._read_buffer
            head_size = nbytes
            limit = self._limits.max_header_bytes
            if nbytes > _SHORT_READ_BYTES or self._head_bytes + nbytes > limit:
                end = self._head_end(nbytes)
                if end >= 0:
                    head_size = end
                if self._head_bytes + head_size > limit:
                    self._refuse(431, _head_too_large(limit))
                    return
            if buffer.find(b"pgrade", 0, head_size) >= 0 or buffer.find(b"PGRADE", 0, head_size) >= 0:
                data = without_upgrade_header(bytes(data))
            else:
                split = head_size
        self._head_began = False
        self._begun = 0
        self._body_seen = False
        self._headed = False
        try:
            if split < nbytes:
                self._parser.feed_data(data[:split])
                if not self._took_body_start(data[split:]):
                    self._parser.feed_data(data[split:])
            else:
                self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # on_headers_complete has dealt with it: the connection closes after the response
        except httptools.HttpParserError as error:
            standin = None
            if fresh and self._begun == 1 and isinstance(error, httptools.HttpParserInvalidMethodError):
                standin = self._other_method(data)
            if standin is None:
                self._bad_request(error)
                return
            data = standin
            self._parser = httptools.HttpRequestParser(self)
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass
            except httptools.HttpParserError as again:
                self._bad_request(again)
                return
        if self._begun > PIPELINED_REQUESTS:
            self._read_room = self._read_to = self._read_view[:PIPELINED_READ_BYTES]
        if self._wire == BODY and self._chunked_body and not self._begun and not self._headed:  # inside a chunked body
            if self._body_seen:
                self._bodiless_bytes = 0
            else:
                self._bodiless_bytes += nbytes
                if self._bodiless_bytes > self._limits.max_header_bytes:
                    self._refuse(431, _framing_too_large(self._limits.max_header_bytes))
                    return
        presized, self._presized = self._presized, None
        if presized is not None and self._wire == BODY:  # the rest of its body goes past the parser
            self._direct = presized
            self._parser = httptools.HttpRequestParser(self)  # this one waits for body bytes it will never see
        cycle, self._to_start = self._to_start, None
        if cycle is not None:
            self._start(cycle)
        self._follow_wire(len(data))
        # The end of a head that the next read may finish: its blank line can be cut anywhere.
        self._head_tail = (self._head_tail + bytes(data[-3:]))[-3:] if self._wire == HEAD else b""

    def _bad_request(self, error: Exception) -> None:
        """Refuse the bytes the parser could not read; the requests read whole before them are answered first."""
        cycle, self._to_start = self._to_start, None
        if cycle is not None and cycle is not self._receiving:  # read whole before the bad bytes: answered
            self._start(cycle)
        if str(error) == _H2_PREFACE_ERROR:  # HTTP/2 spoken to this port
            self._refuse(505, "HTTP/2 is not served on this port, which speaks HTTP/1.1 (gRPC has a port of its own)")
            return
        self._refuse(400, f"invalid HTTP request: {error}")

    def _other_method(self, data: Any) -> Optional[bytes]:
        """A chunk whose request's method llhttp does not know, with a method it knows in its place; None if none.

        RFC 9110 lets a method be any token, and tritonserver 2.51 answers one it does not serve (`FOO`, `BREW`)
        405 on its routes and 404 elsewhere, keeping the connection; llhttp refuses every method not in its
        list. The request is read as one of a method it knows, whose framing is any other's; its scope has the
        method sent (on_headers_complete), which the routes answer.
        """
        head = bytes(data[:_METHOD_BYTES])
        space = head.find(b" ")
        if space <= 0 or not _TOKEN.fullmatch(head, 0, space):
            return None
        self._method = head[:space].decode("latin-1")
        return _STANDIN_METHOD + bytes(data[space:])

    def _head_end(self, nbytes: int) -> int:
        """Where the first blank line of the read ends (-1: none), one begun in the read before included."""
        buffer = self._read_buffer
        tail = self._head_tail
        if tail:
            index = (tail + buffer[: min(3, nbytes)]).find(b"\r\n\r\n")
            if index >= 0:
                return index + 4 - len(tail)
        end = buffer.find(b"\r\n\r\n", 0, nbytes)
        return end + 4 if end >= 0 else -1

    def _took_body_start(self, rest: memoryview) -> bool:
        """Copy `rest`, the bytes after a head in its read, into that head's presized body if all are its own.

        Whether it did. Through the parser they were copied twice (into httptools' bytes, then into the
        body): with requests of 150 KiB, which arrive with their head in one read, that was a tenth of the
        server's CPU.
        """
        presized = self._presized
        if presized is None or self._wire != BODY or len(rest) > presized.left:
            return False  # no presized body, or a pipelined request follows it: the parser sorts them out
        presized.add(rest)
        if presized.complete:
            self._presized = None
            self._parser = httptools.HttpRequestParser(self)  # the old one waits for body bytes it will never see
            self.on_message_complete()
        return True

    def _follow_wire(self, nbytes: int) -> None:
        """Move the connection's deadline to what the client is expected to send next."""
        clock = self._clock
        wire = self._wire
        if wire == BODY:
            clock.enter(BODY, self._limits.body_timeout_s)
        elif wire == HEAD:
            if clock.phase != HEAD:  # the chunk ended a body and started the next head
                clock.enter(HEAD, self._limits.header_timeout_s)
            if self._head_began:  # what of the chunk is the head: not the requests before it (pipelined)
                self._head_began = False
                # The line the chunk ends inside, once it is a header line (a request line's target is in
                # _head_lines already); a header line whole but not handed over yet is counted with the next.
                partial_line = nbytes - (self._read_buffer.rfind(b"\n", 0, nbytes) + 1) if self._head_fields else 0
                self._head_bytes = self._head_lines + partial_line
            else:
                self._head_bytes += nbytes
        elif self._active is not None:
            clock.phase = APP
        elif clock.phase != IDLE:
            clock.enter(IDLE, self._limits.keep_alive_timeout_s)

    def pause_writing(self) -> None:
        """The transport's buffer is full: streaming responses wait in drain(), pipelined requests for their turn."""
        self._write_paused = True
        if self._transport is not None:
            self._send_watch.paused(self._transport)

    def resume_writing(self) -> None:
        """The transport's buffer drained: the next pipelined request may start."""
        self._write_paused = False
        self._send_watch.stop()
        self._wake_drain()
        if self._active is None and self._pipeline and self._transport is not None and not self._transport.is_closing():
            self._next_in_pipeline()

    def _read_nothing(self) -> None:
        """The client read none of a full send buffer for send_timeout_s (send_watch.py): let it go."""
        LOGGER.debug("closing HTTP connection from %s: it read none of its responses in time", self._address[1])
        if self._transport is not None:
            self._transport.abort()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts."""
        self._begun += 1
        self._wire = HEAD
        self._head_began = True
        self._head_lines = 0
        self._head_fields = False
        self._expect_continue = False
        self._url = b""
        self._headers = []
        if self._names is not None:
            self._names = []
        self._declared_length = 0
        self._chunked_body = False
        self._other_codings = False
        self._host = None
        self._hosts_differ = False
        self._presized = None  # an earlier request's, whole already (a read may end its body and start this one)

    def on_url(self, url: bytes) -> None:
        """A part of the request target."""
        self._url += url
        self._head_lines += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header (names are lower-cased for the ASGI scope), or a trailer field after a chunked body.

        Trailer fields are dropped, as RFC 9110 6.5.1 lets a server do: they went into the scope's headers, the
        app's already. What bounds them (and chunk extensions) is _parse's count of a body's bytes without data.
        """
        if self._wire == BODY:
            return
        self._head_lines += len(name) + len(value) + 4  # ": " and CRLF
        self._head_fields = True
        if self._names is not None:
            self._names.append(name)
        name = name.lower()
        if name == b"content-length":
            self._declared_length = int(value) if value.isdigit() else 0  # llhttp refuses a bad one itself
        elif name == b"transfer-encoding":
            self._chunked_body = True
            codings = (coding.split(b";", 1)[0].strip().lower() for coding in value.split(b","))
            self._other_codings = self._other_codings or any(coding != b"chunked" for coding in codings)
        elif name == b"host":
            if self._host is None:
                self._host = value
            elif value.lower() != self._host.lower():  # host names are case-insensitive
                self._hosts_differ = True
        elif name == b"expect":
            self._expect_continue = value.lower() == b"100-continue"  # RFC 9110: case-insensitive
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        """The head is complete: make its cycle; it runs now or after the responses before it."""
        parser = self._parser
        headers = self._headers
        keep_alive = parser.should_keep_alive() and not (self._closing or self._state.leaving)
        scope = http_scope(parser, self._url, headers, self._address)
        if self._method is not None:  # one llhttp does not know (_other_method)
            scope["method"], self._method = self._method, None
        if self._names is not None:
            scope[HEADER_NAMES] = self._names
        # RFC 9110 10.1.1: an HTTP/1.0 request's expectation is ignored (such a client takes a 100 for the answer).
        expect_continue = self._expect_continue and scope["http_version"] == "1.1"
        if self._chunked_body and scope["http_version"] == "1.0":
            # RFC 9112 6.1: its framing may be read otherwise by an HTTP/1.0 intermediary (request smuggling).
            keep_alive = False
        cycle = RequestCycle(self, scope, keep_alive=keep_alive, expect_continue=expect_continue)
        self._state.cap.busy(self)  # a whole head: its request (and a body however slow) is not reclaimed
        self._receiving = cycle
        self._wire = BODY
        self._headed = True
        self._bodiless_bytes = 0
        if self._over_cap:
            cycle.keep_alive = False
            cycle.refusal = refusal(
                503, f"the server serves at most {self._limits.max_connections} connections at once"
            )
        elif self._head_lines > self._limits.max_header_bytes:  # a whole head in a read after others: not seen
            cycle.keep_alive = False
            cycle.refusal = refusal(431, _head_too_large(self._limits.max_header_bytes))
        elif self._declared_length > self._limits.max_body_bytes:  # refused now, not once the body has come
            cycle.keep_alive = False
            cycle.refusal = refusal(413, f"request body larger than {self._limits.max_body_bytes} bytes")
        elif self._hosts_differ:
            # RFC 9112 section 3.2 (tritonserver 2.51 serves it: a proxy and Triton could each take another one).
            cycle.keep_alive = False
            cycle.refusal = CONFLICTING_HOSTS
        elif self._other_codings:
            cycle.keep_alive = False
            cycle.refusal = UNKNOWN_TRANSFER_CODING
        elif parser.should_upgrade():
            # An Upgrade header data_received could not remove: llhttp hands everything after the head to the
            # new protocol, so the body is lost and the connection cannot carry more HTTP/1.1. Serve a bodiless
            # request, refuse one with a body, and close the connection after the response.
            cycle.keep_alive = False
            if any(name in (b"content-length", b"transfer-encoding") and value != b"0" for name, value in headers):
                cycle.refusal = UPGRADE_WITH_BODY
        elif self._declared_length >= PRESIZED_BODY_BYTES and not self._chunked_body:
            try:
                self._presized = cycle.presize(self._declared_length)
            except MemoryError:  # the process's memory limit (RLIMIT_AS, a cgroup's): raised through the parser, it
                # ended the connection with no answer, and its requests read before with it
                cycle.keep_alive = False
                cycle.refusal = refusal(503, _no_memory_for_body(self._declared_length))
            else:
                if self._declared_length >= SHARE_BYTES:
                    self.claim_share(cycle, self._declared_length)
        if self._active is None:
            self._active = self._to_start = cycle
        else:
            self._pipeline.append(cycle)  # one waiting request is enough: the rest is read after its response
            self._sync_reading()

    def on_body(self, body: bytes) -> None:
        """A part of the request body."""
        self._body_seen = True
        cycle = self._receiving
        if cycle is not None and cycle.feed_body(body):
            self._body_full = True
            self._sync_reading()

    def on_message_complete(self) -> None:
        """The request has arrived whole."""
        cycle, self._receiving = self._receiving, None
        self._wire = IDLE
        if cycle is not None:
            if self._budget_wait:
                self._arrived_waiting(cycle)
            cycle.end_body()

    # -- the cycles' side -------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send bytes unless the connection is closing."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def write_joined(self, head: bytes, body: Any) -> None:
        """Send a response head and a body part in one system call."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if len(body) < 65536:
            transport.write(b"".join((head, body)))
        else:
            transport.writelines((head, body))

    def write_parts(self, parts: List[Any]) -> None:
        """Send buffers in one system call (writev) without joining them; the transport keeps views of them."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(parts)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is full."""
        while self._write_paused and self._transport is not None and not self._transport.is_closing():
            waiter = self._drain
            if waiter is None:
                waiter = self._drain = self._loop.create_future()
            await waiter

    def claim_share(self, cycle: RequestCycle, size: int) -> None:
        """Have `cycle`'s body hold `size` bytes of the receive budget; stop reading until it has them."""
        share = cycle.share = self._state.receive_budget.claim(size, functools.partial(self._granted, cycle))
        if share.waiting:
            self._wait_for_budget()

    def grow_share(self, cycle: RequestCycle, received: int) -> None:
        """A chunked body has `received` bytes, SHARE_BYTES or more: it holds CHUNKED_STEP_BYTES more at a time."""
        share = cycle.share
        if share is None:
            self.claim_share(cycle, SHARE_BYTES + CHUNKED_STEP_BYTES)
        elif received >= share.size and not share.waiting and not share.more(CHUNKED_STEP_BYTES):
            self._wait_for_budget()

    def _wait_for_budget(self) -> None:
        """Read nothing until the body's share is granted; meanwhile watch for the client leaving (hangups.py)."""
        self._budget_wait = True
        self._sync_reading()
        transport = self._transport
        if self._watched_fd < 0 and transport is not None:
            sock = transport.get_extra_info("socket")
            fd = sock.fileno() if sock is not None else -1
            if self._state.hangups.watch(fd, functools.partial(self._left, "while its body waited")):
                self._watched_fd = fd

    def _arrived_waiting(self, cycle: RequestCycle) -> None:
        """`cycle`'s body ended in the read that made its share wait (a chunked one): it holds its bytes, read on.

        No grant would reach it any more (it is not the body being received), and the connection would read
        nothing again.
        """
        if cycle.share is not None:
            cycle.share.force()
        self._stop_waiting()

    def _granted(self, cycle: RequestCycle) -> None:
        """`cycle`'s body has its share of the budget: read on."""
        if cycle is self._receiving and self._budget_wait:
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        """The body holds its share (or nothing any more): read on."""
        self._budget_wait = False
        self._forget_hangup()
        self._sync_reading()

    def _forget_hangup(self) -> None:
        """Stop watching the socket for the client leaving."""
        fd, self._watched_fd = self._watched_fd, -1
        if fd >= 0:
            self._state.hangups.forget(fd)

    def _left(self, when: str) -> None:
        """The watched socket says the client left (`when`, for the log): the connection closes now.

        While its body waited for the budget, that body's share goes with it; after it stopped sending, it
        answered a write with a reset.
        """
        self._watched_fd = -1
        LOGGER.debug("closing HTTP connection from %s: it left %s", self._address[1], when)
        if self._transport is not None:
            self._transport.abort()

    def resume_body(self) -> None:
        """The app took the body held for it: read more."""
        self._body_full = False
        self._sync_reading()

    def response_done(self, cycle: RequestCycle) -> None:
        """A response is complete: close, or answer the next request (or wait for one)."""
        if cycle is not self._active:
            return
        self._active = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not cycle.keep_alive:
            # Its body still on its way, or a request refused from its head (the client may have sent more behind
            # it): closing with bytes unread would reset the connection before the client reads the answers.
            if self._receiving is cycle or cycle.refusal is not None:
                self._refused = True
                self._clock.cancel()
                self._linger_close(transport)
            else:
                transport.close()
            return
        if self._pipeline:
            if self._write_paused:
                return  # the client has not read the responses before it: it waits (resume_writing)
            self._next_in_pipeline()
            return
        self._after_responses(transport)

    def _next_in_pipeline(self) -> None:
        """Answer the next pipelined request."""
        cycle = self._active = self._pipeline.popleft()
        self._start(cycle)
        transport = self._transport
        if transport is not None:
            self._after_responses(transport)

    def _after_responses(self, transport: asyncio.Transport) -> None:
        """What follows a response: the refusal owed after the last one, or reading on."""
        if self._active is None and not self._pipeline and self._refusal_due is not None:
            transport.write(self._refusal_due)  # the last response owed before a refused request is out
            self._refusal_due = None
            self._linger_close(transport)
            return
        if self._receiving is not None and self._receiving.response_complete:
            self._body_full = False  # what is left of an answered request's body is dropped as it comes
            if self._budget_wait:  # ... and holds nothing: its share came back with the answer
                self._stop_waiting()
        self._sync_reading()
        if self._active is None and not self._pipeline and self._wire != BODY:
            self._state.cap.waiting(self)  # everything it sent is answered: idle, or a next head begun
            if self._wire == IDLE:
                self._clock.enter(IDLE, self._limits.keep_alive_timeout_s)

    # -- server's side ----------------------------------------------------------------------

    def endless_body(self, cycle: RequestCycle) -> bool:
        """Whether `cycle`'s body is still arriving in chunks: what is left of it has no bound."""
        return self._receiving is cycle and self._chunked_body

    @property
    def sending(self) -> bool:
        """Whether response bytes wait for the client to read them."""
        return self._transport is not None and self._transport.get_write_buffer_size() > 0

    def shutdown(self) -> None:
        """Close now when idle, else after the response under way."""
        self._closing = True
        self._pipeline.clear()
        if self._active is None:
            if self._transport is not None:
                self._transport.close()
        else:
            self._active.keep_alive = False

    def abort(self) -> None:
        """Stop the app still running for this connection and close it."""
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.close()

    def reclaim(self) -> None:
        """The server is at its cap and this connection has waited on its client longest: close it for a new one.

        Idle, it closes as at its keep-alive timeout; with a request head begun, that request is answered 503 first.
        """
        transport = self._transport
        if transport is None or transport.is_closing() or self._refused:
            return
        self._refused = True
        self._clock.cancel()
        self._state.connections.placeless(self)
        LOGGER.debug(
            "closing HTTP connection from %s: the server is at its cap, a new connection takes its place",
            self._address[1],
        )
        if self._wire == HEAD:
            transport.write(error_response(503, _reclaimed(self._limits.max_connections)))
        transport.close()

    # -- running the app --------------------------------------------------------------------

    def _start(self, cycle: RequestCycle) -> None:
        """Have the connection's task run the app for a request (the task starts with the first request)."""
        self._next = cycle
        if self._task is None:
            self._task = self._loop.create_task(self._serve())
        else:
            self._wake_task()

    def _wake_task(self) -> None:
        """Wake the connection's task if it waits for a request."""
        idle, self._idle = self._idle, None
        wake(idle)

    async def _serve(self) -> None:
        """Answer the connection's requests in turn until it closes.

        One task per connection rather than one per request: on Python 3.11 creating a task costs more
        than most of this server's per-request work (each is registered in a WeakSet).
        """
        while True:
            cycle, self._next = self._next, None
            if cycle is not None:
                await self._run(cycle)
                continue
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            self._idle = self._loop.create_future()
            await self._idle

    async def _run(self, cycle: RequestCycle) -> None:
        """Call the app; answer 500 if it fails before responding, close the connection if it fails during."""
        scope = cycle.scope
        app = cycle.refusal or self._state.app
        try:
            await app(scope, cycle.receive, cycle.send)
        except asyncio.CancelledError:
            self._give_up(cycle, "the server stopped before the response was complete")
            raise
        except Exception as error:
            LOGGER.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            self._give_up(cycle, f"internal server error: {error}")
        else:
            if cycle.client_done and not cycle.response_started:  # it stopped for a client that reads as gone
                cycle.disconnected = True
            if not cycle.response_complete:
                self._give_up(cycle, "the application returned without completing its response")

    def _give_up(self, cycle: RequestCycle, message: str) -> None:
        """End a response the app could not complete: a 500 if none started, else close the connection."""
        if cycle.response_complete:
            return
        cycle.response_complete = True
        cycle.end_share()
        if cycle.head_sent or cycle.disconnected:
            # A refused connection whose error is out lingers (_linger_close): closing now, with the client's bytes
            # unread, would reset it before the client read the error. One whose error waits for this response closes.
            lingering = self._refused and self._refusal_due is None
            if self._transport is not None and not lingering:
                self._transport.close()
            return
        self.write(error_response(500, message))
        cycle.keep_alive = False
        self.response_done(cycle)

    # -- limits -----------------------------------------------------------------------------

    def _sync_reading(self) -> None:
        """Read from the client unless a request waits for its turn or the app has not taken its body yet."""
        pause = bool(self._pipeline) or self._body_full or self._budget_wait or self._yielding
        transport = self._transport
        if pause != self._reading_paused and transport is not None and not self._refused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _wake_drain(self) -> None:
        """Wake a response waiting in drain()."""
        waiter, self._drain = self._drain, None
        wake(waiter)

    def _on_deadline(self, phase: int) -> None:
        """The client kept the connection waiting too long in `phase`."""
        if self._refused or self._transport is None:
            return
        if phase == IDLE:
            self._transport.close()
        elif phase == HEAD:
            self._refuse(408, f"request line and headers not received within {self._limits.header_timeout_s} s")
        elif self._reading_paused:  # the server stopped reading the body: not the client's fault
            self._clock.enter(BODY, self._limits.body_timeout_s)
        else:
            self._refuse(408, f"request body stalled for more than {self._limits.body_timeout_s} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` with a JSON error, then close the connection.

        Requests read whole before the bad bytes are answered first, in order, as RFC 9112 asks (nothing more
        is read meanwhile); a request whose body the bad bytes cut off gets no answer of its own.
        """
        self._clock.cancel()
        self._refused = True
        transport = self._transport
        assert transport is not None
        LOGGER.debug("closing HTTP connection from %s: %d %s", self._address[1], status, message)
        active, receiving = self._active, self._receiving
        if receiving is not None and receiving is not active:
            self._pipeline.remove(receiving)  # its body will not come: only the requests before it are owed
            receiving.lose_connection()
        if active is not None and not active.response_complete and (active.response_started or receiving is not active):
            # The client is owed the active request's response first (or has part of it already), and those of
            # the requests after it: the error follows them (response_done).
            self._refusal_due = error_response(status, message)
            self._reading_paused = True
            transport.pause_reading()
            return
        transport.write(error_response(status, message))
        for cycle in (active, *self._pipeline):
            if cycle is not None:
                cycle.lose_connection()  # the app waiting for this body gets a disconnect; its answer is dropped
        self._pipeline.clear()
        self._linger_close(transport)

    def _linger_close(self, transport: asyncio.Transport) -> None:
        """Read and drop what the client still sends for a moment, then close.

        Closing with unread data would reset the connection before the client has read the answer.
        """
        self._state.cap.busy(self)  # it closes: reclaiming it would cut its client's answer short
        if transport.can_write_eof():
            transport.write_eof()
        self._reading_paused = False
        transport.resume_reading()
        self._loop.call_later(_LINGER_S, transport.close)


def _first_request_timeout_s(limits: ServerLimits) -> float:
    """How long a new connection may wait before its first request begins (0: no limit).

    The keep-alive timeout, or the header timeout if that is shorter: a client opens a connection to send a
    request, and one that sends nothing is a late head. The keep-alive timeout outlives the clients' pools
    (`options/limits.py`) and so holds a silent connection too long.
    """
    limits_s = [timeout for timeout in (limits.keep_alive_timeout_s, limits.header_timeout_s) if timeout]
    return min(limits_s) if limits_s else 0.0


def _reclaimed(cap: int) -> str:
    """The 503's message for a request head cut off when its connection was reclaimed (connection_cap.py)."""
    return (
        f"the server serves at most {cap} connections at once: this one, which had sent no whole request for "
        "the longest, was closed for a new one"
    )


def _framing_too_large(limit: int) -> str:
    """The 431's message for a chunked body's bytes without data: trailer fields, chunk extensions, zeros.

    A body sending them without end went unanswered, and its trailer fields (a line of them buffered by httptools
    until it ends) grew the server's memory as fast as they came.
    """
    return f"chunk extensions or trailer fields larger than {limit} bytes"


def _no_memory_for_body(length: int) -> str:
    return f"the server is out of memory: no room for a request body of {length} bytes now"


def _head_too_large(limit: int) -> str:
    """The 431's message, for a head refused before it ends or once it is whole."""
    return f"request line and headers larger than {limit} bytes"
