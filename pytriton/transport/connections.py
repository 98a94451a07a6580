"""The open connections of one server, and how a server closes them when it stops."""

from __future__ import annotations

import asyncio
from typing import Generic, Iterator, Optional, Protocol, Set, TypeVar

from pytriton.core.waiters import wake


class Closable(Protocol):
    """A connection as a server stops it."""

    def shutdown(self) -> None:
        """Finish what is in progress, take nothing new, then close."""

    def abort(self) -> None:
        """Close now."""


C = TypeVar("C", bound=Closable)


class OpenConnections(Generic[C]):
    """The connections a server has open."""

    def __init__(self) -> None:
        """No connection yet."""
        self._open: Set[C] = set()
        self._all_closed: Optional[asyncio.Future[None]] = None  # made on the loop by close_all()

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._open))

    def add(self, connection: C) -> None:
        """A connection opened."""
        self._open.add(connection)

    def forget(self, connection: C) -> None:
        """A connection closed."""
        self._open.discard(connection)
        if not self._open:
            wake(self._all_closed)

    async def close_all(self, grace_s: float) -> None:
        """Shut every connection down; abort those still open after `grace_s` seconds."""
        for connection in self:
            connection.shutdown()
        if self._open:
            self._all_closed = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._all_closed, grace_s)
            except asyncio.TimeoutError:
                for connection in self:
                    connection.abort()
                await asyncio.sleep(0)  # let the cancelled handlers and the closed transports finish
