"""A server's cap on the connections it serves, which connections that send nothing cannot hold.

A connection that has sent no complete request (HTTP: a request head; gRPC: a call) since it opened or since its
last answer waits on its client: idle between requests, or with a head begun and not finished. Such connections
held their places under the cap until a timeout (30 s for a head, 75 s idle, 10 s for a gRPC preface), so a
client that opened the cap's worth of them and sent half a head on each shut every other client out meanwhile
(300 of them kept Prometheus off the metrics port). As nginx reclaims its idle connections, a new connection
that finds the cap reached takes the place of the connection that has waited on its client the longest, which
is closed; only when every connection served is busy (a request arriving or being answered, a call in progress)
is the new one over the cap, and refused. A body arriving, however slowly, is never cut off for it.
"""

from __future__ import annotations

from typing import Dict, Generic, Protocol, Set, TypeVar


class Reclaimable(Protocol):
    """A connection that can give its place under the cap to a new one."""

    def reclaim(self) -> None:
        """Close now (saying why where its protocol can): a new connection takes its place."""


R = TypeVar("R", bound=Reclaimable)


class ConnectionCap(Generic[R]):
    """The connections a server serves under its cap, and which of them wait on their clients."""

    def __init__(self, cap: int) -> None:
        """At most `cap` connections served at once."""
        self.cap = cap
        self._served: Set[R] = set()
        # The served connections waiting on their clients, in the order they began to: the first has waited longest.
        self._waiting: Dict[R, None] = {}
        self.reclaimed = 0  # connections closed for a new one since the start

    @property
    def served(self) -> int:
        """How many connections are served now."""
        return len(self._served)

    def admit(self, connection: R, over_cap: bool = False) -> bool:
        """Serve a new connection, which waits on its client; False: it is over the cap.

        At the cap, or when `over_cap` (counted so where it was accepted: the hub, for a frontend process), the
        connection waiting longest is reclaimed and the new one takes its place; with none waiting, it is over.
        """
        if over_cap or len(self._served) >= self.cap:
            victim = next(iter(self._waiting), None)
            if victim is None:
                return False
            self.leave(victim)
            self.reclaimed += 1
            victim.reclaim()
        self._served.add(connection)
        self._waiting[connection] = None
        return True

    def waiting(self, connection: R) -> None:
        """A served connection has answered all it was sent: it waits on its client (kept in place if it did)."""
        if connection in self._served and connection not in self._waiting:
            self._waiting[connection] = None

    def busy(self, connection: R) -> None:
        """A connection received something complete (or is closing): it is not reclaimed until it waits again."""
        self._waiting.pop(connection, None)

    def leave(self, connection: R) -> None:
        """A connection closed (or was reclaimed): its place is free."""
        self._served.discard(connection)
        self._waiting.pop(connection, None)
