"""The one log line that tells an operator the server is up: where it listens and what it serves."""

from __future__ import annotations

import os
from typing import Sequence

from pytriton import __version__
from pytriton.core.model import ServedModel


def startup_line(urls: Sequence[str], models: Sequence[ServedModel], frontends: int = 1) -> str:
    """'pytriton 0.1.0 serving add_sub v1 (1 instance) on http://0.0.0.0:8000, grpc://0.0.0.0:8001 (pid 42)'.

    With frontend processes: '... (pid 42, 4 frontend processes)'.
    """
    served = ", ".join(model_line(model) for model in models) or "no models yet"
    processes = f", {frontends} frontend processes" if frontends > 1 else ""
    return f"pytriton {__version__} serving {served} on {', '.join(urls)} (pid {os.getpid()}{processes})"


def model_line(model: ServedModel) -> str:
    """'add_sub v1 (2 instances)', with 'decoupled' for a streaming model."""
    spec = model.spec
    if spec.ensemble is not None:
        return f"{spec.name} v{spec.version} (ensemble of {len(spec.ensemble.steps)} steps)"
    count = spec.instance_count
    kind = ", decoupled" if spec.decoupled else ""
    return f"{spec.name} v{spec.version} ({count} instance{'' if count == 1 else 's'}{kind})"
