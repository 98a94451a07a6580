"""One HTTP/1.1 request and its response, as the ASGI app sees them: `receive()` and `send()`."""

from __future__ import annotations

import asyncio
import http
import re
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union
from urllib.parse import unquote

import httptools

from pytriton.core.waiters import wake
from pytriton.transport.http.body import PresizedBody
from pytriton.transport.receive_budget import SHARE_BYTES, Share, watch

if TYPE_CHECKING:
    from pytriton.transport.http.connection import HttpConnection

Message = Dict[str, Any]
App = Callable[[Any, Any, Any], Awaitable[None]]  # an ASGI 3 app: (scope, receive, send)

_ASGI = {"version": "3.0", "spec_version": "2.3"}
# An ASGI extension of this server: an `http.response.body` message may carry, under this key, buffers
# that follow its body in the same write (writev), so that large outputs leave without being joined.
BODY_PARTS = "pytriton.body_parts"
# The key of an `http.disconnect` message saying the client only stopped sending (it half-closed, or closed: the two
# look the same until a write): an awaitable function returning once the connection is lost or the response is
# complete. An app that waits for it answers a half-closed client whole, as tritonserver does, and still stops for
# one that closed: it answers the next bytes sent with a reset, which the connection watches for.
CONNECTION_LOST = "pytriton.connection_lost"
# How long an answer may take before a client that stopped sending is sent a `100 Continue` to find out whether it
# left: a quick answer goes without one.
PROBE_AFTER_S = 0.1
_EXTENSIONS: Dict[str, Dict[str, Any]] = {BODY_PARTS: {}}
_METHODS = {method.encode(): method for method in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_STATUS_LINES: Dict[int, bytes] = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("latin-1") for status in http.HTTPStatus
}
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_CLOSE = b"Connection: close\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
# Body bytes the server holds for an app that has not read them yet; reading from the client pauses above it.
BODY_HIGH_WATER = 4 * 1024 * 1024
_SMALL_PART_BYTES = 1024  # a part of a body smaller than this is added to the part before it
# Response header names must be tokens and values must not break the head (RFC 9110 5.1, 5.5): a CR or LF
# from an app would let a value inject headers or a whole response. Names the apps send skip the pattern.
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FORBIDDEN_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_KNOWN_NAMES = frozenset(
    (b"content-type", b"content-encoding", b"inference-header-content-length", b"date", b"server", b"vary")
)
# The names of the headers this server's apps send, written as tritonserver writes them (`Content-Type`): names
# are case-insensitive (RFC 9110 5.1), but a client or a script that looks for Triton's bytes finds them. Others
# (a custom route's) go out as the app wrote them.
_WIRE_NAMES: Dict[bytes, bytes] = {
    name.lower(): name
    for name in (
        b"Content-Type",
        b"Content-Length",
        b"Content-Encoding",
        b"Accept-Encoding",
        b"Inference-Header-Content-Length",
        b"Cache-Control",
        b"Allow",
        b"Vary",
        b"Date",
        b"Server",
    )
}


class RequestCycle:
    """A request's body on its way in and its response on its way out.

    The connection feeds the body and reports the client leaving; the app pulls the body with
    `receive()` and answers with `send()`. A response's head is held until its first body part so
    that a complete response leaves in one write.
    """

    __slots__ = (
        "_bodiless",
        "_body",
        "_buffered",
        "_chunked",
        "_connection",
        "_head",
        "_length_left",
        "_lost",
        "_presized",
        "_received",
        "_request_delivered",
        "_waiter",
        "body_complete",
        "client_done",
        "disconnected",
        "expect_continue",
        "head_sent",
        "keep_alive",
        "probed",
        "refusal",
        "response_complete",
        "response_started",
        "scope",
        "share",
    )

    def __init__(self, connection: HttpConnection, scope: Message, *, keep_alive: bool, expect_continue: bool) -> None:
        """A cycle for a request whose head has arrived."""
        self._connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.body_complete = False
        self.disconnected = False
        self.client_done = False  # the client sends nothing more but may still read (it half-closed, or left)
        self.probed = False  # a 100 Continue went out to find out whether it left (_until_lost)
        self.response_started = False
        self.response_complete = False
        self.refusal: Optional[Any] = None  # an ASGI app answering this request instead of the server's
        self._body: List[Union[bytes, bytearray]] = []
        self._presized: Optional[PresizedBody] = None  # a body read into its final buffer (transport/http/body.py)
        self._buffered = 0
        self._received = 0  # bytes of a body that came through the parser (chunked, or small)
        self.share: Optional[Share] = None  # what a large body holds of the server's ReceiveBudget
        self._request_delivered = False
        self._waiter: Optional[asyncio.Future[None]] = None
        self._lost: Optional[asyncio.Future[None]] = None  # done once the connection is lost or the answer complete
        self._head: Optional[bytes] = None
        self.head_sent = False  # something of the response is on its way: an error can no longer become a 500
        self._length_left: Optional[int] = None  # body bytes the response's content-length still announces
        self._chunked = False
        self._bodiless = scope["method"] == "HEAD"  # no body goes out: a HEAD request, or a 204 or 304 answer

    # -- the connection's side --------------------------------------------------------------

    def presize(self, length: int) -> PresizedBody:
        """Receive the body into one buffer of its declared `length`, which the connection fills."""
        presized = self._presized = PresizedBody(length)
        return presized

    def feed_body(self, data: bytes) -> bool:
        """Hold a part of the body for the app; True when the connection should stop reading for now."""
        if self.response_complete:  # answered already: what is left of the body is read and dropped
            return False
        presized = self._presized
        if presized is not None:
            presized.add(data)
            return False
        parts = self._body
        size = len(data)
        if size < _SMALL_PART_BYTES and parts:
            # Tiny chunks (a chunked body of 2-byte chunks) held as a bytes object each took 60 times their size until
            # the app read them. They are joined as they come; a body of one part (the usual) is never copied for it.
            last = parts[-1]
            if type(last) is not bytearray:
                last = parts[-1] = bytearray(last)
            last += data
        else:
            parts.append(data)
        self._buffered += size
        self._received += size
        if self._received >= SHARE_BYTES:  # a large chunked body: a share of the budget as its bytes come
            self._connection.grow_share(self, self._received)
        if self._buffered >= BODY_HIGH_WATER:
            self._wake()
            return True
        return False

    def end_body(self) -> None:
        """The whole body has arrived."""
        self.body_complete = True
        self._wake()

    def end_sending(self) -> None:
        """The client will send nothing more: receive() says it left, but send() still writes the response."""
        self.client_done = True
        self._wake()

    def lose_connection(self) -> None:
        """The client went away (or the connection was closed): receive() says so, send() drops what comes.

        A presized body the app has not taken goes now (receive() would not give it any more): the connection
        holds this cycle in a reference cycle, which only the cycle collector frees, maybe minutes later.
        """
        self.disconnected = True
        self._presized = None
        if not self.body_complete:  # cut off part-way: its bytes go now
            self.end_share()
        self._wake()

    def end_share(self) -> None:
        """The request is answered, or its body cut off: what it holds of the receive budget comes back."""
        share, self.share = self.share, None
        if share is not None:
            share.give_back()

    # -- the app's side ---------------------------------------------------------------------

    async def receive(self) -> Message:
        """The next part of the body; once it has all been received, wait until the client leaves."""
        if not self._request_delivered:
            while not (self._body or self.body_complete or self.disconnected):  # a presized body comes whole
                if self.expect_continue:
                    self.expect_continue = False
                    self._connection.write(_CONTINUE)
                await self._wait()
            if self._body or not self.disconnected:
                more_body = not self.body_complete
                self._request_delivered = not more_body
                return {"type": "http.request", "body": self._take_body(), "more_body": more_body}
        while not (self.disconnected or self.client_done or self.response_complete):
            await self._wait()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        return {"type": "http.disconnect", CONNECTION_LOST: self._until_lost}

    async def _until_lost(self) -> None:
        """Return once the connection is lost or the response complete.

        Unless its answer has begun within PROBE_AFTER_S, an HTTP/1.1 client is sent a `100 Continue`, which it
        reads past (RFC 9110 15.2 asks clients to) and which one that closed answers with a reset. An HTTP/1.0
        client may not be sent one: the request goes on, as in Triton.
        """
        lost = self._lost
        if lost is None:
            lost = self._lost = asyncio.get_running_loop().create_future()
            self._wake()  # resolved now if it is over already
        if not self.probed and self.scope["http_version"] == "1.1":
            self.probed = True
            await asyncio.wait((lost,), timeout=PROBE_AFTER_S)
            if not (self.head_sent or self.response_complete or self.disconnected):
                self.expect_continue = False
                self._connection.write(_CONTINUE)
        await asyncio.wait((lost,))  # several may wait (the queue's watcher, then the running request's)

    async def send(self, message: Message) -> None:
        """Send the response head (`http.response.start`) or a part of its body (`http.response.body`).

        Raises:
            RuntimeError: messages out of order, an invalid header, or a body longer or shorter than the
                content-length the head announced (nothing of the offending part is sent).
        """
        kind = message["type"]
        if kind == "http.response.body":
            if not self.response_started or self.response_complete:
                raise RuntimeError("http.response.body sent before http.response.start or after the last part")
            more_body = message.get("more_body", False)
            body = b"" if self._bodiless else message.get("body", b"")
            parts = None if self._bodiless else message.get(BODY_PARTS)
            if parts is not None and self._chunked:
                body, parts = b"".join((body, *parts)), None  # chunk framing needs the part whole
            if self._length_left is not None:
                size = len(body) if parts is None else len(body) + sum(memoryview(part).nbytes for part in parts)
                self._count_body(size, more_body)
            if not more_body:
                self.response_complete = True
                if self.share is not None:
                    self.end_share()
            if self.disconnected:
                if more_body:
                    # A loop turn, as a send to a connected client's full socket gives one: a stream that awaits
                    # nothing else would otherwise run on, or for ever, holding the loop, its watcher of the
                    # client's leaving never run (ASGI 2.3 asks that a send after a disconnect return quietly).
                    await asyncio.sleep(0)
                return
            if self._chunked:
                body = _chunk(body, last=not more_body)
            head, self._head = self._head, None
            connection = self._connection
            self.head_sent = True
            if parts is not None:
                connection.write_parts([body, *parts] if head is None else [head, body, *parts])
            elif head is None:
                connection.write(body)
            else:
                connection.write_joined(head, body)
            if more_body:
                await connection.drain()
            else:
                self._wake()
                connection.response_done(self)
        elif kind == "http.response.start":
            if self.response_started:
                raise RuntimeError("http.response.start sent twice")
            self._head = self._build_head(message["status"], message.get("headers", ()))
            self.response_started = True
            if self._chunked:  # a streaming response: the client sees the head even before the first part
                asyncio.get_running_loop().call_soon(self._flush_head)
        else:
            raise RuntimeError(f"unexpected ASGI message type {kind!r} for an HTTP response")

    def _count_body(self, size: int, more_body: bool) -> None:
        """Hold a body part against the content-length; refuse one that would make the framing lie."""
        left = (self._length_left or 0) - size
        if left < 0:
            raise RuntimeError(f"response body longer than its content-length (by {-left} bytes)")
        if left and not more_body:
            raise RuntimeError(f"response body ended {left} bytes short of its content-length")
        self._length_left = left

    # -- helpers ----------------------------------------------------------------------------

    def _build_head(self, status: int, headers: Any) -> bytes:
        """The status line and headers; chunked framing when the app gives no content-length.

        Header names should come lower-case, as ASGI asks of apps (this server's apps all do); those of Triton's
        API go out as tritonserver writes them (_WIRE_NAMES). Refused: a
        status that is not three digits, a name that is not a token, a value with a control character,
        a content-length that is not a number, and a transfer-encoding (the server frames bodies itself). A 204 or
        304 answer goes without the body an app gives it, as a HEAD request's answer does (a body there would be
        read as the start of the connection's next response), and a 1xx or 204 without a content-length.
        """
        if type(status) is not int or not 100 <= status <= 999:
            raise RuntimeError(f"invalid response status {status!r}")
        lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode("latin-1")]
        length: Optional[int] = None
        for name, value in headers:
            if name not in _KNOWN_NAMES and name != b"content-length":
                if not _TOKEN.fullmatch(name):
                    raise RuntimeError(f"invalid response header name {name!r}")
                lowered = name.lower()
                if lowered == b"transfer-encoding":
                    raise RuntimeError("an app's response may not set transfer-encoding: the server frames the body")
                name = lowered  # a Content-Length in capitals is still the content-length
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise RuntimeError(f"invalid response content-length {value!r}")
                length = int(value)
                if status < 200 or status == 204:  # RFC 9110 8.6: a server must not send one with these
                    continue
            else:
                if _FORBIDDEN_IN_VALUE.search(value):
                    raise RuntimeError(f"invalid response header value {value!r} for {name!r}")
                if name == b"connection" and value.lower() == b"close":
                    self.keep_alive = False
                    continue
            lines.append(b"%s: %s\r\n" % (_WIRE_NAMES.get(name, name), value))
        bodiless = self._bodiless = status < 200 or status in (204, 304) or self._bodiless
        if length is not None:
            if not bodiless:
                self._length_left = length
        elif not bodiless:
            if self.scope["http_version"] == "1.1":
                self._chunked = True
                lines.append(_CHUNKED)
            else:  # HTTP/1.0 has no chunks: the end of the connection ends the body
                self.keep_alive = False
        if self.expect_continue and not self.body_complete and status >= 200:
            # Answered before the client was told to send its body. A final answer alone is what RFC 9110 10.1.1
            # allows, but the JDK's HttpClient before 20 then waits forever (JDK-8286171), where tritonserver's
            # 100 Continue serves it. So the 100 goes first: the client must then send its body (or close), which
            # the connection reads and drops (response_complete) before the next request.
            self.expect_continue = False
            lines.insert(0, _CONTINUE)
        if self.keep_alive and not self.body_complete and self._connection.endless_body(self):
            # Answered while its chunked body still arrives (a 413 past max_body_bytes): the rest was read and dropped
            # for as long as the client sent it, for ever for a body that never ends. The connection closes after
            # the answer instead, lingering a moment (connection.response_done) so that the client reads it.
            self.keep_alive = False
        if not self.keep_alive:
            lines.append(_CLOSE)
        elif self.scope["http_version"] == "1.0":  # HTTP/1.0 closes unless told otherwise (Triton says so too)
            lines.append(_KEEP_ALIVE)
        lines.append(b"\r\n")
        return b"".join(lines)

    def _flush_head(self) -> None:
        """Send a streaming response's head if its first part has not taken it along yet."""
        head, self._head = self._head, None
        if head is not None and not self.disconnected and not self.response_complete:
            self.head_sent = True
            self._connection.write(head)

    def _take_body(self) -> Union[bytes, bytearray, memoryview]:
        """The body parts held so far, as one buffer (a bytearray when they had to be joined)."""
        presized = self._presized
        if presized is not None:
            self._presized = None
            share = self.share
            return presized.take() if share is None else watch(presized.take(), share)
        parts = self._body
        if not parts:
            return b""
        body: Union[bytes, bytearray] = parts[0] if len(parts) == 1 else bytearray().join(parts)
        self._body = []
        if self._buffered >= BODY_HIGH_WATER:
            self._connection.resume_body()
        self._buffered = 0
        return body

    async def _wait(self) -> None:
        """Wait for the connection's next event for this cycle."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        """Wake receive() if it waits, and those in _until_lost once the connection is lost or the answer complete."""
        wake(self._waiter)
        lost = self._lost
        if lost is not None and (self.disconnected or self.response_complete):
            wake(lost)


# A scope's key for its headers' names as the client wrote them, in the order of its `headers` (AsgiServer's
# header_names); absent from other servers' scopes.
HEADER_NAMES = "pytriton.header_names"


def http_scope(parser: Any, url: bytes, headers: List[Tuple[bytes, bytes]], address: Tuple[Any, Any]) -> Message:
    """The ASGI HTTP scope of a request whose head `parser` has just read; `address` is (server, client)."""
    raw_path, _, query = url.partition(b"?")
    if not raw_path.startswith(b"/"):  # absolute form (a proxy's request)
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:  # authority form (CONNECT's host:port): no route has it
            pass
        else:
            raw_path, query = parsed.path or b"/", parsed.query or b""
    path = raw_path.decode("latin-1")
    if "%" in path:
        path = unquote(path)
    method = parser.get_method()
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": parser.get_http_version(),
        "server": address[0],
        "client": address[1],
        "scheme": "http",
        "method": _METHODS.get(method) or method.decode("latin-1"),
        "root_path": "",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
        "extensions": _EXTENSIONS,
    }


def socket_address(address: Any) -> Optional[Tuple[str, int]]:
    """(host, port) of a socket address for a scope, None when there is none (a Unix socket)."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None


def _chunk(data: Union[bytes, bytearray, memoryview], *, last: bool) -> bytes:
    """Chunked transfer-coding of one body part (and the last chunk after it when `last`)."""
    framed = b"%x\r\n%s\r\n" % (len(data), bytes(data)) if data else b""
    return framed + _LAST_CHUNK if last else framed
