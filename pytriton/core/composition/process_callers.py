"""Where the inner calls of a callable outside the server's process go (an instance process's, a RemoteTriton's).

An instance process's host sets the process's caller, which sends each call to the server over its channel; a
RemoteTriton process serves several instances and route handlers at once and sets each thread's (or task's) own.
"""

from __future__ import annotations

import contextvars
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np

from pytriton.core.composition.path import CallArguments

# In an instance process: how its callable calls models of the server (core/process_instances/host.py): each
# response's outputs, as they come.
ProcessCaller = Callable[[CallArguments], Iterator[Dict[str, np.ndarray]]]
_PROCESS_CALLER: List[ProcessCaller] = []
# A RemoteTriton process serves several instances (and route handlers) at once: each thread's own caller.
_THREAD_CALLER: contextvars.ContextVar[Optional[ProcessCaller]] = contextvars.ContextVar(
    "pytriton_process_caller", default=None
)


def set_process_caller(caller: Optional[ProcessCaller]) -> None:
    """Make this process's calls go to the server through `caller` (an instance process's host sets it; None: not)."""
    _PROCESS_CALLER[:] = [caller] if caller is not None else []


def use_caller_here(caller: Optional[ProcessCaller]) -> contextvars.Token[Optional[ProcessCaller]]:
    """Make the calls of this thread (or task) go through `caller`, whatever the process's is; reset with the token."""
    return _THREAD_CALLER.set(caller)


def process_caller() -> Optional[ProcessCaller]:
    """The caller of this thread or task, else the one set in this process (an instance process's), if any."""
    caller = _THREAD_CALLER.get()
    if caller is not None:
        return caller
    return _PROCESS_CALLER[0] if _PROCESS_CALLER else None
