"""Clients for models served over the Triton (KServe v2) HTTP and gRPC protocols.

The client classes load on first access, so importing this package loads neither tritonclient nor aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytriton.client._asyncio import AsyncioModelClient
    from pytriton.client._asyncio_decoupled import AsyncioDecoupledModelClient
    from pytriton.client._decoupled import DecoupledModelClient
    from pytriton.client._futures import FuturesModelClient
    from pytriton.client._sync import ModelClient

__all__ = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]

_MODULES = {
    "AsyncioDecoupledModelClient": "pytriton.client._asyncio_decoupled",
    "AsyncioModelClient": "pytriton.client._asyncio",
    "DecoupledModelClient": "pytriton.client._decoupled",
    "FuturesModelClient": "pytriton.client._futures",
    "ModelClient": "pytriton.client._sync",
}


# Submodules nvidia-pytriton's `import pytriton.client` makes attributes (it imports them all at once).
_SUBMODULES = ("asyncio_utils", "auth", "client", "exceptions", "utils", "warnings")


def __getattr__(name: str) -> Any:
    """Import a client class, or a submodule, when it is first used."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value
    return value
