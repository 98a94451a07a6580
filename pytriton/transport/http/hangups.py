"""Connections whose reading is paused, watched for their client hanging up.

A transport that does not read does not see its peer close either: the end of the stream lies behind the bytes
nobody reads. A body waiting for room in the receive budget (`transport/receive_budget.py`) must give its place
back as soon as its client leaves, so its socket is registered here, in an epoll set of its own that asks for
the peer's hang-up alone (EPOLLRDHUP, with EPOLLHUP and EPOLLERR, which it always reports), not for readable
bytes; the event loop watches that set's descriptor. Nothing is registered while no body waits.
"""

from __future__ import annotations

import asyncio
import logging
import select
from typing import Callable, Dict, Optional

LOGGER = logging.getLogger(__name__)

_EVENTS = getattr(select, "EPOLLRDHUP", 0x2000) | select.EPOLLHUP | select.EPOLLERR if hasattr(select, "epoll") else 0


class Hangups:
    """Sockets watched for their peer's hang-up; `lost()` is called once for each (on the loop)."""

    def __init__(self) -> None:
        """Nothing watched yet: the epoll set and its reader are made at the first `watch`."""
        self._epoll: Optional[select.epoll] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._watched: Dict[int, Callable[[], None]] = {}

    def watch(self, fd: int, lost: Callable[[], None], *, reset_only: bool = False) -> bool:
        """Call `lost()` once the peer of socket `fd` hangs up; whether it is watched (not without epoll).

        `reset_only`: once the connection is reset or shut both ways (the peer's half-close has been seen already).
        """
        if not _EVENTS or fd < 0:
            return False
        epoll = self._epoll
        if epoll is None:
            epoll = self._epoll = select.epoll()
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(epoll.fileno(), self._ready)
        try:
            epoll.register(fd, 0 if reset_only else _EVENTS)  # epoll always reports EPOLLHUP and EPOLLERR
        except OSError:
            return False
        self._watched[fd] = lost
        return True

    def forget(self, fd: int) -> None:
        """Stop watching socket `fd` (before it is closed: its number may be reused)."""
        if self._watched.pop(fd, None) is not None and self._epoll is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass

    def close(self) -> None:
        """Watch nothing more (the server stops)."""
        epoll, self._epoll = self._epoll, None
        if epoll is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(epoll.fileno())
        if epoll is not None:
            epoll.close()
        self._watched.clear()

    def _ready(self) -> None:
        """Some watched peers hung up."""
        epoll = self._epoll
        if epoll is None:
            return
        for fd, _ in epoll.poll(0):
            lost = self._watched.get(fd)
            self.forget(fd)
            if lost is not None:
                try:
                    lost()
                except Exception:
                    LOGGER.exception("closing a connection whose client hung up")
