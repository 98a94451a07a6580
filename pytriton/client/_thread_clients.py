"""tritonclient clients for a ModelClient that threads share: one per thread where the client is bound to its thread.

tritonclient.http sends over geventhttpclient, whose pooled sockets wait on the gevent hub of the thread that
opened them: a call from another thread fails with `greenlet.error` ("Cannot switch to a different thread") or
hangs. tritonclient.grpc's client is thread-safe and is shared. A thread's own client is closed when the thread
ends (its thread-local storage is freed then, in that thread), so that a program starting a thread per call
does not keep a connection for every thread it ever ran.

A process forked from one that used a client (gunicorn --preload, multiprocessing's fork start method) makes
clients of its own: the ones it inherits share their connections with the parent's and its other children's, and
answers to one process's requests would be read by another. The forking thread's gevent hub is made ready for
the child too, as gevent asks (its resolver's threads are not in the child: a new connection waited forever).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from typing import Any, Callable, List

_LOGGER = logging.getLogger(__name__)

# How many forks separate this process from the one that imported this module: clients are this process's own
# when they were made under the same count.
_forks = 0


def _after_fork_in_child() -> None:
    """In a forked child: its clients are to be made again, and the hub of the thread that forked made usable."""
    global _forks
    _forks += 1
    gevent = sys.modules.get("gevent")  # imported by tritonclient.http's geventhttpclient
    if gevent is not None:
        gevent.reinit()  # the forking thread's hub, if it has one (what gevent.os.fork does)


os.register_at_fork(after_in_child=_after_fork_in_child)


class _ThreadsOwn:
    """Held in a thread's local storage only: freed as the thread ends, which closes that thread's client."""

    __slots__ = ("__weakref__", "client")

    def __init__(self, client: Any) -> None:
        self.client = client


class ThreadClients:
    """The tritonclient clients `create` makes at first use: one per calling thread (`per_thread`), or one for all."""

    def __init__(self, create: Callable[[], Any], per_thread: bool) -> None:
        """Make clients with `create`; `per_thread` gives each thread its own."""
        self._create = create
        self._per_thread = per_thread
        self._local = threading.local()
        self._lock = threading.Lock()
        self._closers: List[weakref.finalize[[Any], _ThreadsOwn]] = []  # one a thread's client, until it is closed
        self._shared: Any = None
        self._forks = _forks

    def get(self) -> Any:
        """This thread's client (the shared one without `per_thread`); one made in this process."""
        if self._forks != _forks:
            self._forget_inherited()
        if not self._per_thread:
            with self._lock:
                if self._shared is None:
                    self._shared = self._create()
                return self._shared
        own = getattr(self._local, "own", None)
        if own is None:
            own = _ThreadsOwn(self._create())
            closer = weakref.finalize(own, _close, own.client)
            closer.atexit = False  # at exit the process's sockets close with it: no gevent work on the way out
            with self._lock:
                self._closers = [other for other in self._closers if other.alive]
                self._closers.append(closer)
            self._local.own = own
        return own.client

    def _forget_inherited(self) -> None:
        """In a forked child: drop the parent's clients unclosed: what they hold is the parent's as well."""
        with self._lock:
            if self._forks == _forks:
                return
            for closer in self._closers:
                closer.detach()
            self._closers = []
            self._shared = None
            self._local = threading.local()
            self._forks = _forks

    def close(self) -> None:
        """Close every client made so far; one made by another thread may fail to close, and is left to the GC."""
        with self._lock:
            closers, self._closers = self._closers, []
            shared, self._shared = self._shared, None
        for closer in closers:
            closer()
        if shared is not None:
            _close(shared)


def _close(client: Any) -> None:
    """Close a tritonclient client, from its own thread or another."""
    try:
        client.close()
    except Exception as error:  # noqa: BLE001 - a gevent socket of another (maybe ended) thread
        _LOGGER.debug("could not close a tritonclient client of another thread: %r", error)
