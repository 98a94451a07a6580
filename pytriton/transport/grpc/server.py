"""Placeholder gRPC frontend: replaced by the grpc.aio servicer."""

from __future__ import annotations

import logging
from typing import Optional

from pytriton.core.engine import Engine
from pytriton.runtime.options import ServerOptions

LOGGER = logging.getLogger("pytriton")


class GrpcFrontend:
    """Serves nothing yet."""

    def __init__(self, engine: Engine, options: ServerOptions, *, server_version: str) -> None:
        """Keep the arguments."""
        self.port: Optional[int] = None

    async def start(self) -> None:
        """Warn that gRPC is not served yet."""
        LOGGER.warning("gRPC is not served yet")

    async def stop(self) -> None:
        """Nothing to stop."""
