"""The awaited inner calls of a RemoteTriton's async route handler, which runs on that process's own loop."""

from __future__ import annotations

import contextvars
from typing import AsyncIterator, Callable, Dict, Optional

import numpy as np

from pytriton.core.composition.path import CallArguments

# An async route handler in a RemoteTriton's process awaits its calls on its own loop: each response's outputs.
AsyncProcessCaller = Callable[[CallArguments], AsyncIterator[Dict[str, np.ndarray]]]
_ASYNC_CALLER: contextvars.ContextVar[Optional[AsyncProcessCaller]] = contextvars.ContextVar(
    "pytriton_async_process_caller", default=None
)


def use_async_caller_here(caller: AsyncProcessCaller) -> contextvars.Token[Optional[AsyncProcessCaller]]:
    """Make the awaited calls (call_model_async, async for over stream_model) of this task go through `caller`."""
    return _ASYNC_CALLER.set(caller)


def async_process_caller() -> Optional[AsyncProcessCaller]:
    """The async caller of this task, if it is a RemoteTriton's async route handler."""
    return _ASYNC_CALLER.get()
