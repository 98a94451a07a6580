"""The open connections of one server, and how a server closes them when it stops."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Generic, Iterator, Optional, Protocol, Set, TypeVar

from pytriton.core.waiters import wake

# How often a stop looks again at the connections still sending an answer, once the others are closed.
_SENDING_POLL_S = 0.1


class Closable(Protocol):
    """A connection as a server stops it."""

    @property
    def sending(self) -> bool:
        """Whether an answer is still leaving (bytes queued for the client, or waiting for its window)."""

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
        self._placeless: Set[C] = set()  # open, but told closed to on_closed: they hold no place under the cap
        self._all_closed: Optional[asyncio.Future[None]] = None  # made on the loop by close_all()
        self._hurried = False
        self._closing = False  # close_all has begun: the server takes no connection now
        # Called when a connection closes: a frontend process tells the hub, which counts every frontend's.
        self.on_closed: Optional[Callable[[], None]] = None

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._open))

    def add(self, connection: C) -> bool:
        """A connection opened; False: the server is stopping, and the connection must close at once.

        A connection the loop accepted just before its listener closed reaches its protocol (connection_made) a
        step later, maybe after `close_all` looked at what was open: nothing else would close it.
        """
        self._open.add(connection)
        return not self._closing

    def forget(self, connection: C) -> None:
        """A connection closed."""
        if connection in self._open:
            self._open.discard(connection)
            if connection in self._placeless:
                self._placeless.discard(connection)
            elif self.on_closed is not None:
                self.on_closed()
        if not self._open:
            wake(self._all_closed)

    def placeless(self, connection: C) -> None:
        """A connection holds no place under the cap any more, but stays open a while to say why: tell `on_closed` now.

        It was refused over the cap, or closed for a new one. Where it was accepted (the hub, for a frontend
        process), the connections that count toward the cap are those told open and not closed, as the cap of a
        server of one process counts those it serves. Counted until they closed, refused connections lingering to
        say why (an HTTP one until its first request, for its 503) made every new one over the cap there, and
        refused too, by a process that served none (test_connection_reclaim.py).
        """
        if connection in self._open and connection not in self._placeless:
            self._placeless.add(connection)
            if self.on_closed is not None:
                self.on_closed()

    def never_opened(self) -> None:
        """A connection handed to this server was closed before it was served (its TLS handshake failed).

        Where it was accepted, it counts as open until `on_closed` says otherwise.
        """
        if self.on_closed is not None:
            self.on_closed()

    def hurry(self) -> None:
        """Stop waiting for answers still leaving past `grace_s` (a second signal): close_all ends at the grace."""
        self._hurried = True
        wake(self._all_closed)

    async def close_all(self, grace_s: float, sending_s: float = 0.0) -> None:
        """Shut every connection down; abort those still open after `grace_s` seconds.

        A connection still sending an answer then (a large response a slow client reads) is left until
        `sending_s` from now, unless `hurry` comes first; one that only waits for its client (an idle stream, a
        request never finished) is not.
        """
        self._closing = True
        for connection in self:
            connection.shutdown()
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        grace_end, sending_end = started + grace_s, started + max(sending_s, grace_s)
        while self._open:
            now = time.monotonic()
            if now < grace_end:
                wait_s = grace_end - now
            elif self._hurried or now >= sending_end:
                break
            else:
                for connection in self:
                    if not connection.sending:
                        connection.abort()
                wait_s = min(_SENDING_POLL_S, sending_end - now)
            self._all_closed = loop.create_future()
            await asyncio.wait({self._all_closed}, timeout=wait_s)
        for connection in self:
            connection.abort()
        await asyncio.sleep(0)  # let the cancelled handlers and the closed transports finish
