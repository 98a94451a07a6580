"""Serving an ASGI app with uvicorn (httptools parser where installed) on a socket we bound.

uvicorn limits idle keep-alive connections only; the connection guard below adds what ServerLimits asks
of each connection: a cap on the request line and headers (431), timeouts for the headers and for a
stalled body (408), an idle timeout before the first request, and a cap on connections (503). Without
httptools (h11 parser) only the header cap (h11's max incomplete event size) and keep-alive apply.
"""

from __future__ import annotations

import asyncio
import http
import importlib.util
import logging
import math
import re
import socket
from typing import Any, ClassVar, Optional, cast

import orjson
import uvicorn

from pytriton.runtime.limits import ServerLimits

LOGGER = logging.getLogger(__name__)

_IDLE, _HEAD, _BODY, _APP = range(4)  # what a connection waits for from its client (_APP: nothing)


class AsgiServer:
    """One uvicorn server on the engine's loop, started and stopped from it."""

    def __init__(self, app: Any, sock: socket.socket, *, limits: Optional[ServerLimits] = None) -> None:
        """Prepare a server for `app` on a listening socket, enforcing `limits` (defaults when None)."""
        limits = limits or ServerLimits()
        http_impl: Any = "h11"
        if importlib.util.find_spec("httptools"):
            http_impl = _guarded_protocol(limits)
        keep_alive_s = limits.keep_alive_timeout_s or _NEVER_S
        config = uvicorn.Config(
            app,
            http=http_impl,
            loop="none",
            lifespan="off",
            ws="none",
            interface="asgi3",
            access_log=False,
            log_config=None,
            server_header=False,
            date_header=False,
            proxy_headers=False,
            timeout_keep_alive=cast(int, keep_alive_s),  # uvicorn hands it to call_later: seconds as a float work
            timeout_graceful_shutdown=1,
            h11_max_incomplete_event_size=limits.max_header_bytes,
        )
        self._server = uvicorn.Server(config)
        self._socket = sock
        self._task: Optional[asyncio.Task[None]] = None

    async def start(self) -> None:
        """Start serving; returns once the socket accepts connections."""
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("HTTP server stopped during startup")
            await asyncio.sleep(0.001)

    async def stop(self) -> None:
        """Stop accepting, close connections, wait for the server task."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._task = None
            self._socket.close()


_NEVER_S = 365 * 24 * 3600.0
_LINGER_S = 2.0


def _guarded_protocol(limits: ServerLimits) -> type:
    """The httptools protocol class of uvicorn, guarded by `limits`."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        """HttpToolsProtocol with header-size, header/body timeout and connection-count limits.

        Only `data_received` is overridden on the request path: one timer per connection follows a
        deadline that moves with each phase (idle, request head, body), so a request costs a clock
        read and a few comparisons, not a timer of its own.
        """

        guard: ClassVar[ServerLimits] = limits

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = _APP
            self._deadline = 0.0
            self._timer: Optional[asyncio.TimerHandle] = None
            self._timer_at = 0.0
            self._head_bytes = 0  # bytes of the unfinished request head received so far
            self._refused = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self.transport = cast(asyncio.Transport, _CoalescingTransport(self.transport, self.loop))
            if len(self.connections) > self.guard.max_connections:  # every request here gets a 503
                self.app = _refusal(503, f"the server serves at most {self.guard.max_connections} connections at once")
            self._enter(_IDLE, self.guard.keep_alive_timeout_s)

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self._phase = _APP
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            phase = self._phase
            if phase != _BODY:  # this chunk starts or continues a request head
                if phase != _HEAD:
                    self._head_bytes = 0
                    self._enter(_HEAD, self.guard.header_timeout_s)
                limit = self.guard.max_header_bytes
                if self._head_bytes + len(data) > limit:
                    end = data.find(b"\r\n\r\n")
                    if self._head_bytes + (len(data) if end < 0 else end + 4) > limit:
                        self._refuse(431, f"request line and headers larger than {limit} bytes")
                        return
                if b"pgrade" in data or b"PGRADE" in data:
                    data = _without_upgrade_header(data)
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle or phase == _BODY:  # a head was completed, or a body goes on
                if self.cycle.more_body:
                    self._phase = _BODY
                    self._deadline = self.loop.time() + (self.guard.body_timeout_s or math.inf)
                else:
                    self._phase = _APP
            elif self._phase == _HEAD:
                self._head_bytes += len(data)

        def on_headers_complete(self) -> None:
            parser = self.parser
            if not parser.should_upgrade():
                super().on_headers_complete()
                if not parser.should_keep_alive():  # uvicorn < 0.40 (Python 3.9) misses "Connection: Close"
                    self._close_after_response()  # llhttp drops what follows: an open connection would hang
                return
            # An Upgrade header data_received could not remove: llhttp hands everything after the head to the
            # new protocol, so the body is lost and the connection cannot carry more HTTP/1.1. Serve a bodiless
            # request, refuse one with a body, and close the connection after the response.
            app = self.app
            if any(name in (b"content-length", b"transfer-encoding") and value != b"0" for name, value in self.headers):
                self.app = _UPGRADE_WITH_BODY
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            self._close_after_response()

        def _close_after_response(self) -> None:
            """Close the connection after the current response, saying so in its headers."""
            self.cycle.keep_alive = False
            if _CONNECTION_CLOSE not in self.headers:  # the request's headers: uvicorn < 0.40 answers in kind
                self.headers.append(_CONNECTION_CLOSE)

        def _unsupported_upgrade_warning(self) -> None:
            """Stay quiet: on_headers_complete has dealt with the Upgrade request (uvicorn would warn here)."""

        def _enter(self, phase: int, timeout_s: float) -> None:
            """Wait for the client in `phase` for at most `timeout_s` (0: no limit)."""
            self._phase = phase
            self._deadline = self.loop.time() + timeout_s if timeout_s else math.inf
            if timeout_s and (self._timer is None or self._deadline < self._timer_at):
                self._arm()

        def _arm(self) -> None:
            """(Re)arm the timer for the current deadline."""
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = self._deadline
            self._timer = self.loop.call_at(self._deadline, self._on_deadline)

        def _on_deadline(self) -> None:
            """The timer fired: act if the current phase's deadline passed, else follow the deadline."""
            self._timer = None
            phase = self._phase
            if phase == _APP or self._refused:
                return
            now = self.loop.time()
            if phase == _BODY and self.flow.read_paused:  # the server stopped reading: not the client's fault
                self._deadline = now + (self.guard.body_timeout_s or math.inf)
            if now < self._deadline:
                if self._deadline != math.inf:
                    self._arm()
                return
            if phase == _IDLE:
                self.transport.close()
            elif phase == _HEAD:
                self._refuse(408, f"request line and headers not received within {self.guard.header_timeout_s} s")
            else:
                self._refuse(408, f"request body stalled for more than {self.guard.body_timeout_s} s")

        def _refuse(self, status: int, message: str) -> None:
            """Answer `status` with a JSON error when no response is under way, then close the connection."""
            phase, self._phase = self._phase, _APP
            self._refused = True
            cycle = self.cycle
            LOGGER.debug("closing HTTP connection from %s: %d %s", self.client, status, message)
            if not (cycle is None or cycle.response_complete or (phase == _BODY and not cycle.response_started)):
                self.transport.close()  # a response is under way: no room for another one
                return
            body = orjson.dumps({"error": message})
            head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n{_ERROR_HEADERS}{len(body)}\r\n\r\n"
            self.transport.write(head.encode("latin-1") + body)
            if cycle is not None and not cycle.response_complete:  # the app waits for this body: it is gone
                cycle.disconnected = True
                cycle.message_event.set()
            # Lingering close: read and drop what the client still sends for a moment, so that closing
            # with unread data does not reset the connection before the client has read the answer.
            transport = self.transport
            if transport.can_write_eof():
                transport.write_eof()
            self.flow.resume_reading()
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(_LINGER_S, transport.close)

    return GuardedHttpToolsProtocol


_ERROR_HEADERS = "content-type: application/json\r\nconnection: close\r\ncontent-length: "
_JOIN_BELOW = 64 * 1024  # held bytes and the next write go out joined below this size, as a writev above it


class _CoalescingTransport:
    """A transport that sends a response's head and body in one system call instead of two.

    uvicorn writes the head at `http.response.start` and the body at `http.response.body`, with no
    loop iteration between them for a complete response. A write is held until the next one, or
    until the loop's next turn (a streaming response's head), so a small response costs one send.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        """Wrap the connection's transport."""
        self._transport = transport
        self._loop = loop
        self._held: Optional[bytes] = None

    def write(self, data: bytes) -> None:
        """Hold `data` until the next write or the loop's next turn; send it with what is held."""
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._held = None
        if len(held) + len(data) < _JOIN_BELOW:
            self._transport.write(b"".join((held, data)))
        else:
            self._transport.writelines((held, data))

    def flush(self) -> None:
        """Send what is held, if anything."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def write_eof(self) -> None:
        """Send what is held, then half-close."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Send what is held, then close."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else is the wrapped transport's."""
        return getattr(self._transport, name)


def _refusal(status: int, message: str) -> Any:
    """An ASGI app answering every request with `status` and a JSON error, closing the connection."""
    body = orjson.dumps({"error": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


_CONNECTION_CLOSE = (b"connection", b"close")
_UPGRADE_LINE = re.compile(rb"\r\nupgrade[ \t]*:[^\r\n]*(?=\r\n)", re.IGNORECASE)


def _without_upgrade_header(data: bytes) -> bytes:
    """A chunk starting a request head, without its Upgrade header (`curl --http2` sends one: h2c).

    The server does not switch protocols and RFC 9110 lets it ignore the header; removing it keeps
    llhttp parsing the body and the next requests as HTTP/1.1.
    """
    end = data.find(b"\r\n\r\n")
    head_end = len(data) if end < 0 else end + 2
    return _UPGRADE_LINE.sub(b"", data[:head_end]) + data[head_end:]


_UPGRADE_WITH_BODY = _refusal(
    400, "an HTTP/1.1 Upgrade request cannot carry a body on this server: send it without the Upgrade header"
)
