"""The gRPC frontend: a grpc.aio server on the engine's loop serving inference.GRPCInferenceService."""

from __future__ import annotations

import logging
from typing import Any, Optional

import grpc

from pytriton.core.engine import Engine
from pytriton.runtime.options import ServerOptions
from pytriton.runtime.settings import ServerSettings
from pytriton.transport.grpc.handlers import CallLimit, add_service
from pytriton.transport.grpc.servicer import InferenceServicer
from pytriton.transport.grpc.settings import bind_address, channel_options, server_credentials

LOGGER = logging.getLogger("pytriton")

# In-flight calls get this long to finish when the server stops (the engine has drained by then).
STOP_GRACE_S = 1.0


class GrpcFrontend:
    """Serves Triton's gRPC API; `port` is the bound port once started."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions,
        *,
        server_version: str,
        settings: Optional[ServerSettings] = None,
    ) -> None:
        """Prepare the frontend; nothing is bound until `start`; `settings` serves LogSettings and TraceSetting."""
        self._engine = engine
        self._settings = settings
        self._options = options
        self._server_version = server_version
        self._server: Optional[Any] = None
        self.port: Optional[int] = None

    async def start(self) -> None:
        """Create the server on the running loop, bind the port, start serving."""
        options = self._options
        server = grpc.aio.server(options=channel_options(options))
        servicer = InferenceServicer(
            self._engine,
            server_version=self._server_version,
            header_forward_pattern=options.grpc_header_forward_pattern,
            settings=self._settings,
        )
        add_service(servicer, server, options.grpc_access, CallLimit(options.limits.grpc_max_concurrent_rpcs))
        address = bind_address(options.grpc_address, options.grpc_port)
        try:
            if options.grpc_tls is not None:
                port = server.add_secure_port(address, server_credentials(options.grpc_tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as error:
            raise OSError(f"gRPC cannot listen on {address}: {error}") from None
        if not port:
            raise OSError(f"gRPC cannot listen on {address}")
        await server.start()
        self._server = server
        self.port = port

    async def stop(self) -> None:
        """Stop accepting calls; cancel those still running after a short grace period."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(STOP_GRACE_S)
