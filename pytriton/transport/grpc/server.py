"""The gRPC frontend: an HTTP/2 server on the engine's loop serving inference.GRPCInferenceService.

Why not grpc.aio: on one core a grpc.aio server answering a fixed, pre-serialized response does about
3,100 calls/s with 1 or 32 in flight (~14 context switches a call between grpc's threads and the
loop), below NVIDIA's PyTriton serving a real model. The same echo on this module's framing answers
about 23,000 calls/s with one in flight and 128,000 with 32 (bench figures in docs/performance.md).
The server keeps to what gRPC clients need of HTTP/2: h2c or TLS with ALPN h2, flow control both
ways, HPACK, deadlines, message compression, keepalive pings and their enforcement, GOAWAY on stop,
and the limits that keep one client from taking the server down (ServerLimits' grpc_* fields, the
flood counters of floods.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as ssl_module
from typing import Any, Callable, Dict, Optional, Set

from pytriton.core.request_spans import FixedStamps
from pytriton.core.serving import ServingEngine
from pytriton.options.limits import ServerLimits
from pytriton.options.log_trace import ServerSettings
from pytriton.options.server import GrpcKeepalive, ServerOptions
from pytriton.transport.connection_cap import ConnectionCap
from pytriton.transport.connections import OpenConnections
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc.connection import GrpcConnection
from pytriton.transport.grpc.cutoffs import CutoffLog
from pytriton.transport.grpc.handlers import CallLimit, Method, method_table
from pytriton.transport.grpc.headers import OVERSIZE_FACTOR
from pytriton.transport.grpc.servicer import InferenceServicer
from pytriton.transport.grpc.session import Http2Session
from pytriton.transport.grpc.settings import COMPRESSION_LEVELS, bind_address, tls_context
from pytriton.transport.inflate import InflationBudget
from pytriton.transport.receive_budget import ReceiveBudget
from pytriton.transport.sockets import BACKLOG, adopt_connection, bind_socket, bound_port

LOGGER = logging.getLogger("pytriton")

# In-flight calls get this long to finish when the server stops (the engine has drained by then).
STOP_GRACE_S = 1.0
# The connections' shared read buffer: a read takes at most this much. 1 MiB made h2load's 1 MiB requests (16 KiB
# frames) ~3 % cheaper, but a read that large takes grpc's large frames before their headers are known, so more
# of a message is copied rather than read in place (tritonclient's 1 MiB: 33 % in place, against 58 %).
READ_BUFFER_BYTES = 256 * 1024


class GrpcServerState:
    """What the connections of one server share: its methods, limits and settings, and the open connections."""

    def __init__(
        self,
        methods: Dict[bytes, Method],
        limits: ServerLimits,
        *,
        keepalive: GrpcKeepalive,
        compression_level: int,
        inflation_budget: Optional[InflationBudget] = None,
        receive_budget: Optional[ReceiveBudget] = None,
    ) -> None:
        """State for a server of `methods` (by HTTP/2 path) under `limits`.

        `inflation_budget` bounds what inflated request messages hold at once, `receive_budget` what large
        messages hold while they arrive: the server's, shared with its other frontends (by default the
        server's own, of limits.max_inflated_bytes and limits.max_received_bytes).
        """
        self.methods = methods
        self.max_message_bytes = limits.grpc_max_message_bytes
        self.max_header_list_bytes = limits.max_header_bytes
        # A block over the list's limit is still read (a stream error, as with grpc), within a wider bound.
        self.max_header_block_bytes = limits.max_header_bytes * OVERSIZE_FACTOR
        # A header block fits in this many CONTINUATION frames of the 16 KiB this server allows, and then some.
        self.max_continuations = 8 + self.max_header_block_bytes // h2.DEFAULT_MAX_FRAME
        self.max_concurrent_streams = limits.grpc_max_concurrent_streams
        self.max_connections = limits.grpc_max_connections
        self.max_buffered_bytes = limits.grpc_max_buffered_bytes
        self.idle_timeout_s = limits.grpc_idle_timeout_s
        self.handshake_timeout_s = limits.grpc_handshake_timeout_s
        self.send_timeout_s = limits.send_timeout_s
        self.keepalive = keepalive
        self.compression_level = compression_level
        self.inflation_budget = inflation_budget or InflationBudget(limits.max_inflated_bytes)
        self.receive_budget = receive_budget or ReceiveBudget(limits.received_bytes())
        self.connections: OpenConnections[GrpcConnection] = OpenConnections()
        self.cap: ConnectionCap[Http2Session] = ConnectionCap(limits.grpc_max_connections)  # the served, by session
        self.cutoffs = CutoffLog()  # connections ended for what their clients did, logged at WARNING
        # Every connection reads into this one buffer (connection.py): a connection costs no buffer of its own.
        self.read_view = memoryview(bytearray(READ_BUFFER_BYTES))


class GrpcFrontend:
    """Serves Triton's gRPC API; `port` is the bound port once started."""

    def __init__(
        self,
        engine: ServingEngine,
        options: ServerOptions,
        *,
        server_version: str,
        settings: Optional[ServerSettings] = None,
        inflation_budget: Optional[InflationBudget] = None,
        receive_budget: Optional[ReceiveBudget] = None,
        listen: bool = True,
        servicer: Optional[Callable[[Any], Any]] = None,
        trace_stamps: Optional[FixedStamps] = None,
    ) -> None:
        """Prepare the frontend; nothing is bound until `start`; `settings` serves LogSettings and TraceSetting.

        `inflation_budget`, `receive_budget`: the server's bounds on what inflated requests and large messages
        hold (GrpcServerState). Without `listen`
        it binds no port and serves the connections handed to `adopt` (a frontend process's: the hub accepts
        them). `servicer` wraps the servicer (a frontend process's forwards what it does not answer itself).
        `trace_stamps`: whether requests are timed for trace files, without `settings` (a frontend process's).
        """
        self._trace_stamps = trace_stamps
        self._listen = listen
        self._wrap_servicer = servicer
        self._ssl: Optional[ssl_module.SSLContext] = None
        self._handshake_s: Optional[float] = None
        self._adopting: Set[asyncio.Task[Any]] = set()
        self._engine = engine
        self._inflation_budget = inflation_budget
        self._receive_budget = receive_budget
        self._settings = settings
        self._options = options
        self._server_version = server_version
        self._server: Optional[asyncio.AbstractServer] = None
        self._state: Optional[GrpcServerState] = None
        self.port: Optional[int] = None

    async def start(self) -> None:
        """Bind the port and start serving on the running loop."""
        options = self._options
        servicer: Any = InferenceServicer(
            self._engine,
            server_version=self._server_version,
            header_forward_pattern=options.grpc_header_forward_pattern,
            settings=self._settings,
            max_stream_requests=options.limits.grpc_max_stream_requests,
            trace_stamps=self._trace_stamps,
        )
        if self._wrap_servicer is not None:
            servicer = self._wrap_servicer(servicer)
        limits = options.limits
        methods = method_table(servicer, options.grpc_access, CallLimit(limits.grpc_max_concurrent_rpcs))
        ssl = tls_context(options.grpc_tls) if options.grpc_tls is not None else None
        state = GrpcServerState(
            methods,
            limits,
            keepalive=options.grpc_keepalive,
            compression_level=COMPRESSION_LEVELS[options.grpc_compression_level],
            inflation_budget=self._inflation_budget,
            receive_budget=self._receive_budget,
        )
        loop = asyncio.get_running_loop()
        handshake_s = limits.grpc_handshake_timeout_s if ssl is not None and limits.grpc_handshake_timeout_s else None
        self._ssl, self._handshake_s = ssl, handshake_s
        if not self._listen:
            self._state = state
            return
        sock = listening_socket(options)
        try:
            self._server = await loop.create_server(
                lambda: GrpcConnection(state, loop),
                sock=sock,
                ssl=ssl,
                backlog=BACKLOG,
                ssl_handshake_timeout=handshake_s,
            )
        except BaseException:
            sock.close()
            raise
        self._state = state
        self.port = bound_port(sock)

    @property
    def connections(self) -> Optional[OpenConnections[GrpcConnection]]:
        """The connections open now (None before the start)."""
        return self._state.connections if self._state is not None else None

    def adopt(self, sock: socket.socket, over_cap: bool = False) -> None:
        """Serve a connection accepted elsewhere (closed at once once the server stops).

        `over_cap`: it is one over ServerLimits.grpc_max_connections, as counted where it was accepted.
        """
        state = self._state
        if state is None:
            sock.close()
            return
        loop = asyncio.get_running_loop()

        def made() -> GrpcConnection:
            connection = GrpcConnection(state, loop)
            connection.over_cap = over_cap
            return connection

        connection = adopt_connection(
            loop,
            sock,
            made,
            ssl=self._ssl,
            ssl_handshake_timeout=self._handshake_s,
            failed=state.connections.never_opened,
        )
        task = loop.create_task(connection)
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def hurry(self) -> None:
        """Stop waiting for answers still leaving once the grace is over (a second signal)."""
        if self._state is not None:
            self._state.connections.hurry()

    async def steer(self) -> None:
        """Nothing before `leave`: its graceful GOAWAY is the step, and it is sent at once."""

    async def leave(self) -> None:
        """Send every open connection a graceful GOAWAY (calls go on); return once their final GOAWAYs are out."""
        if self._state is not None:
            await asyncio.gather(*(connection.leave() for connection in self._state.connections))

    async def stop(self, sending_s: float = 0.0) -> None:
        """Stop accepting calls (GOAWAY); cancel those still running after STOP_GRACE_S (`sending_s` if sending)."""
        server, self._server = self._server, None
        state, self._state = self._state, None
        if state is None:
            return
        if server is not None:
            server.close()
        await state.connections.close_all(STOP_GRACE_S, sending_s)
        state.cutoffs.flush()


def listening_socket(options: ServerOptions) -> socket.socket:
    """The gRPC port's socket, bound and listening (OSError names the address when it cannot be)."""
    address = bind_address(options.grpc_address, options.grpc_port)
    try:
        return bind_socket(options.grpc_address, options.grpc_port, dual_stack=True)  # as Triton's C-core binds it
    except OSError as error:
        raise OSError(f"gRPC cannot listen on {address}: {error.strerror or error}") from None
