"""tritonclient clients for a ModelClient that threads share: one per thread where the client is bound to its thread.

tritonclient.http sends over geventhttpclient, whose pooled sockets wait on the gevent hub of the thread that
opened them: a call from another thread fails with `greenlet.error` ("Cannot switch to a different thread") or
hangs. tritonclient.grpc's client is thread-safe and is shared.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List

_LOGGER = logging.getLogger(__name__)


class ThreadClients:
    """The tritonclient clients `create` makes at first use: one per calling thread (`per_thread`), or one for all."""

    def __init__(self, create: Callable[[], Any], per_thread: bool) -> None:
        """Make clients with `create`; `per_thread` gives each thread its own."""
        self._create = create
        self._per_thread = per_thread
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: List[Any] = []
        self._shared: Any = None

    def get(self) -> Any:
        """This thread's client (the shared one without `per_thread`)."""
        if not self._per_thread:
            with self._lock:
                if self._shared is None:
                    self._shared = self._remember(self._create())
                return self._shared
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._create()
            with self._lock:
                self._remember(client)
            self._local.client = client
        return client

    def _remember(self, client: Any) -> Any:
        self._made.append(client)
        return client

    def close(self) -> None:
        """Close every client made so far; one made by another thread may fail to close, and is left to the GC."""
        with self._lock:
            made, self._made = self._made, []
        for client in made:
            try:
                client.close()
            except Exception as error:  # noqa: BLE001 - a gevent socket of another (maybe ended) thread
                _LOGGER.debug("could not close a tritonclient client of another thread: %r", error)
