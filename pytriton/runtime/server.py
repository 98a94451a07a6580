"""The running server: engine and transports on the background loop, started and stopped as one."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Protocol

from pytriton import __version__
from pytriton.core.engine import Engine
from pytriton.core.spec import ModelSpec
from pytriton.runtime.loop_thread import LoopThread
from pytriton.runtime.options import ServerOptions
from pytriton.transport.sockets import bind_socket, bound_port

LOGGER = logging.getLogger("pytriton")


class Frontend(Protocol):
    """A transport server on the loop."""

    async def start(self) -> None:
        """Start serving."""

    async def stop(self) -> None:
        """Stop serving."""


class ServerRuntime:
    """The engine and its frontends, living on one background event loop."""

    def __init__(self, options: ServerOptions) -> None:
        """Start the loop and create the engine on it (no port is opened yet)."""
        self.options = options
        self._loop = LoopThread()
        self.stopped = threading.Event()
        self.failure: Optional[str] = None
        self.engine: Engine = self._loop.call(
            lambda: Engine(
                cache_capacity_bytes=options.cache_capacity_bytes,
                strict_readiness=options.strict_readiness,
                on_unrecoverable=self._on_unrecoverable,
            )
        )
        self._frontends: List[Frontend] = []
        self.http_port: Optional[int] = None
        self.grpc_port: Optional[int] = None
        self.metrics_port: Optional[int] = None
        self.running = False

    def add_model(self, spec: ModelSpec, callables: List[Callable[..., Any]]) -> None:
        """Serve a model (before or after start)."""
        self._loop.call(self.engine.add_model, spec, callables)

    def start(self) -> None:
        """Open the ports and start the frontends."""
        self._loop.run(self._start())
        self.running = True

    async def _start(self) -> None:
        """Start every enabled frontend on the loop."""
        options = self.options
        try:
            if options.http_enabled:
                self.http_port = await self._start_http()
            if options.grpc_enabled:
                from pytriton.transport.grpc.server import GrpcFrontend

                grpc_frontend = GrpcFrontend(self.engine, options, server_version=__version__)
                await self._start_frontend(grpc_frontend)
                self.grpc_port = grpc_frontend.port
            if options.metrics_enabled:
                from pytriton.transport.metrics import MetricsFrontend

                metrics_frontend = MetricsFrontend(self.engine, options)
                await self._start_frontend(metrics_frontend)
                self.metrics_port = metrics_frontend.port
        except BaseException:
            await self._stop_frontends()
            raise

    async def _start_http(self) -> int:
        """Start the HTTP/REST frontend; return its port."""
        from pytriton.transport.http.app import HttpFrontend
        from pytriton.transport.http.server import AsgiServer

        options = self.options
        sock = bind_socket(options.http_address, options.http_port)
        app = HttpFrontend(
            self.engine,
            server_version=__version__,
            header_forward_pattern=options.http_header_forward_pattern,
        )
        await self._start_frontend(AsgiServer(app, sock))
        return bound_port(sock)

    async def _start_frontend(self, frontend: Frontend) -> None:
        """Start a frontend and remember it for shutdown."""
        await frontend.start()
        self._frontends.append(frontend)

    async def _stop_frontends(self) -> None:
        """Stop every started frontend, last started first."""
        while self._frontends:
            frontend = self._frontends.pop()
            try:
                await frontend.stop()
            except Exception:
                LOGGER.exception("error while stopping a frontend")

    def stop(self) -> None:
        """Graceful stop: refuse new requests, finish in-flight ones (exit_timeout_secs), close ports."""
        if self._loop.alive:
            try:
                self._loop.run(self._stop())
            finally:
                self._loop.stop()
        self.running = False
        self.stopped.set()

    async def _stop(self) -> None:
        """Drain the engine, then stop the frontends."""
        await self.engine.shutdown(self.options.exit_timeout_s)
        await self._stop_frontends()

    def _on_unrecoverable(self, reason: str) -> None:
        """A callable raised PyTritonUnrecoverableError: the server must stop (serve() returns)."""
        LOGGER.error("stopping the server: %s", reason)
        self.failure = reason
        self.engine.live = False
        self.stopped.set()
