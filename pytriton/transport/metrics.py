"""Placeholder metrics frontend: replaced by the Prometheus endpoint."""

from __future__ import annotations

from typing import Optional

from pytriton.core.engine import Engine
from pytriton.runtime.options import ServerOptions


class MetricsFrontend:
    """Serves nothing yet."""

    def __init__(self, engine: Engine, options: ServerOptions) -> None:
        """Keep the arguments."""
        self.port: Optional[int] = None

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
