"""The event loops of this process's servers, and the ports each serves.

A blocking client call made on one of those loops (from an `async def` callable or route handler) to one of its own
ports waits for an answer that only the loop it blocks could give.
"""

from __future__ import annotations

import threading
from typing import Dict, FrozenSet, Iterable

_PORTS: Dict[int, FrozenSet[int]] = {}  # the loop's thread (its ident) -> the ports its server listens on


def serving(thread_ident: int, ports: Iterable[int]) -> None:
    """The loop of `thread_ident` serves `ports` from now on."""
    _PORTS[thread_ident] = frozenset(ports)


def stopped(thread_ident: int) -> None:
    """The loop of `thread_ident` serves no port any more."""
    _PORTS.pop(thread_ident, None)


def ports_served_here() -> FrozenSet[int]:
    """The ports whose server's loop runs in the calling thread (none outside such a loop)."""
    return _PORTS.get(threading.get_ident(), frozenset())
