"""An HTTP/1.1 server for ASGI apps on the engine's event loop, with httptools as its parser.

Why not uvicorn: serving the same ASGI echo app on one core, uvicorn answers about 27,000 req/s here
and this server about 45,000 (`python -m bench`, targets `asgi` and `asgi-pytriton`): uvicorn spends
more Python per request on its general machinery (flow-control objects, header validation, message
checks) than the whole KServe echo costs. This server keeps to what the frontends need: ASGI 3 HTTP
scopes, request bodies streamed with backpressure, responses with content-length or chunked,
keep-alive and pipelining, `Expect: 100-continue`, and the connection limits of ServerLimits.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any, Optional, Set

from pytriton.options.limits import ServerLimits
from pytriton.transport.connection_cap import ConnectionCap
from pytriton.transport.connections import OpenConnections
from pytriton.transport.http.connection import HttpConnection
from pytriton.transport.http.cycle import App
from pytriton.transport.http.hangups import Hangups
from pytriton.transport.receive_budget import ReceiveBudget
from pytriton.transport.sockets import BACKLOG, adopt_connection

# What one read takes at most, as uvloop's own read buffer.
READ_BUFFER_BYTES = 256 * 1024
# In-flight responses get this long to finish when the server stops (the engine has drained by then).
STOP_GRACE_S = 1.0


class ServerState:
    """What the connections of one server share: the app, the limits and the set of open connections."""

    def __init__(
        self,
        app: App,
        limits: ServerLimits,
        header_names: bool = False,
        receive_budget: Optional[ReceiveBudget] = None,
    ) -> None:
        """State for a server of `app` under `limits`; `header_names`: scopes carry the names as sent (HEADER_NAMES).

        `receive_budget` bounds its large bodies (the server's).
        """
        self.app = app
        self.limits = limits
        self.header_names = header_names
        self.receive_budget = receive_budget or ReceiveBudget(limits.received_bytes())
        self.hangups = Hangups()  # connections that wait for the budget, watched for their clients leaving
        self.connections: OpenConnections[HttpConnection] = OpenConnections()
        self.cap: ConnectionCap[HttpConnection] = ConnectionCap(limits.max_connections)  # those of them served
        self.leaving = False  # the server stops soon: responses say `Connection: close`
        # Every connection reads into this one buffer: what arrives is parsed (and copied out by the parser)
        # before the next read, so one is enough, and a connection costs no buffer of its own.
        self.read_buffer = bytearray(READ_BUFFER_BYTES)
        self.read_view = memoryview(self.read_buffer)


class AsgiServer:
    """Serves an ASGI app on a listening socket, started and stopped on the engine's loop."""

    def __init__(
        self,
        app: App,
        sock: Optional[socket.socket],
        *,
        limits: Optional[ServerLimits] = None,
        header_names: bool = False,
        receive_budget: Optional[ReceiveBudget] = None,
    ) -> None:
        """Prepare a server for `app` on a bound, listening socket, enforcing `limits` (defaults when None).

        Without a socket it serves the connections handed to `adopt` (a frontend process's: the hub accepts them).
        With `header_names`, each request's scope also has its headers' names as the client wrote them
        (HEADER_NAMES; ASGI's `headers` are lower-cased): for the callables' forwarded headers, which Triton hands
        on as sent. `receive_budget` bounds what large bodies hold while they arrive: the server's, shared with its
        other frontends (by default one of its own, of limits.max_received_bytes).
        """
        self._state = ServerState(app, limits or ServerLimits(), header_names, receive_budget)
        self._socket = sock
        self._server: Optional[asyncio.AbstractServer] = None
        self._serving = False
        self._adopting: Set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Start accepting connections."""
        loop = asyncio.get_running_loop()
        state = self._state
        if self._socket is not None:
            factory = functools.partial(HttpConnection, state, loop)
            self._server = await loop.create_server(factory, sock=self._socket, backlog=BACKLOG)
        self._serving = True

    @property
    def connections(self) -> OpenConnections[HttpConnection]:
        """The connections open now."""
        return self._state.connections

    def adopt(self, sock: socket.socket, over_cap: bool = False) -> None:
        """Serve a connection accepted elsewhere (closed at once once the server stops).

        `over_cap`: it is one over ServerLimits.max_connections, as counted where it was accepted.
        """
        state = self._state
        if not self._serving:
            sock.close()
            state.connections.never_opened()
            return
        loop = asyncio.get_running_loop()

        def connection() -> HttpConnection:
            made = HttpConnection(state, loop)
            made.over_cap = over_cap
            return made

        task = loop.create_task(adopt_connection(loop, sock, connection, failed=state.connections.never_opened))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def hurry(self) -> None:
        """Stop waiting for responses still leaving once the grace is over (a second signal)."""
        self._state.connections.hurry()

    async def steer(self) -> None:
        """From now on, each connection closes after its next response (the lame duck's first step)."""
        self._state.leaving = True

    async def leave(self) -> None:
        """Keep serving, but close each connection after its next response so that clients reconnect elsewhere."""
        self._state.leaving = True

    async def stop(self, sending_s: float = 0.0) -> None:
        """Stop accepting, let responses under way finish (STOP_GRACE_S; `sending_s` for those still leaving).

        Then every connection closes.
        """
        if not self._serving:
            return
        self._serving = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._state.connections.close_all(STOP_GRACE_S, sending_s)
        self._state.hangups.close()
        if self._socket is not None:
            self._socket.close()
