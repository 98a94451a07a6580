"""Serving an ASGI app with uvicorn (httptools parser where installed) on a socket we bound."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
from typing import Any, Optional

import uvicorn

LOGGER = logging.getLogger(__name__)


class AsgiServer:
    """One uvicorn server on the engine's loop, started and stopped from it."""

    def __init__(self, app: Any, sock: socket.socket, *, keep_alive_s: float = 5.0) -> None:
        """Prepare a server for `app` on a listening socket."""
        http_impl = "httptools" if importlib.util.find_spec("httptools") else "h11"
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
            timeout_keep_alive=int(keep_alive_s),
            timeout_graceful_shutdown=1,
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
