"""Custom HTTP routes and mounted ASGI apps a user adds to the server's HTTP port, and their request counts.

The runtime fills the table (`Triton.add_route`, `Triton.mount`); the HTTP app serves it and the metrics
endpoint reads its counts. Paths under /v1 and /v2 are Triton's and the OpenAI API's, and are refused.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Pattern, Tuple

from pytriton.exceptions import PyTritonValidationError

_RESERVED = ("/v1", "/v2")
_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# (route label, method, status) -> requests answered.
RouteCounts = Dict[Tuple[str, str, int], int]


class Route(NamedTuple):
    """One custom route: its methods, its path template (which labels its metrics) and its handler."""

    methods: FrozenSet[str]
    path: str
    pattern: Pattern[str]
    handler: Callable[..., Any]


class Mount(NamedTuple):
    """An ASGI app served under a path prefix."""

    prefix: str
    app: Any


class Match(NamedTuple):
    """What serves a path: a route (with its path parameters) or a mount; `allowed` when the method is not."""

    route: Optional[Route]
    mount: Optional[Mount]
    parameters: Dict[str, str]
    allowed: FrozenSet[str]


class CustomRoutes:
    """The server's custom routes and mounts; read on the event loop, changed from any thread."""

    def __init__(self) -> None:
        """An empty table."""
        self._routes: List[Route] = []
        self._mounts: List[Mount] = []
        self._lock = threading.Lock()
        self.counts: RouteCounts = {}
        self.running = 0  # requests whose route handler or mounted app runs (on the event loop, as the rest below)
        self._mounted_running = 0  # of which a mounted app's: the stop waits for them, but cuts none off
        self._idle: Optional[asyncio.Future[None]] = None  # done once none runs
        self._cut: Optional[asyncio.Future[None]] = None  # done once a stop gives up the running ones

    def __bool__(self) -> bool:
        """Whether any route or mount was added."""
        return bool(self._routes or self._mounts)

    def add_route(self, path: str, handler: Callable[..., Any], methods: Iterable[str]) -> Route:
        """Serve `handler` at `path` ('{name}' segments match any one segment) for `methods`.

        Raises:
            PyTritonValidationError: the path is reserved or malformed, no method is given, or the same path and
                method were added already.
        """
        _check_path(path, "route path")
        wanted = frozenset(method.upper() for method in methods)
        if not wanted:
            raise PyTritonValidationError(f"route '{path}': give at least one HTTP method")
        if not callable(handler):
            raise PyTritonValidationError(f"route '{path}': the handler must be callable")
        pattern = re.compile(
            "^" + _PARAMETER.sub(r"(?P<\1>[^/]+)", re.escape(path).replace(r"\{", "{").replace(r"\}", "}")) + "$"
        )
        with self._lock:
            for route in self._routes:
                if route.path == path and route.methods & wanted:
                    taken = ", ".join(sorted(route.methods & wanted))
                    raise PyTritonValidationError(f"route '{path}' is already served for {taken}")
            route = Route(wanted, path, pattern, handler)
            self._routes = [*self._routes, route]
        return route

    def remove_route(self, route: Route) -> None:
        """Serve `route` no more (a RemoteTriton's, once it closed); its counts stay."""
        with self._lock:
            self._routes = [known for known in self._routes if known is not route]

    def mount(self, prefix: str, app: Any) -> None:
        """Serve the ASGI app `app` for every path under `prefix`.

        Raises:
            PyTritonValidationError: the prefix is reserved, malformed or mounted already.
        """
        _check_path(prefix, "mount prefix")
        prefix = prefix.rstrip("/")
        if not prefix:
            raise PyTritonValidationError("mount prefix '/' would take every path: mount under a prefix")
        with self._lock:
            if any(mount.prefix == prefix for mount in self._mounts):
                raise PyTritonValidationError(f"an app is mounted at '{prefix}' already")
            self._mounts = [*self._mounts, Mount(prefix, app)]

    def match(self, path: str, method: str) -> Optional[Match]:
        """What serves `path` for `method`; None when nothing does (a Match without a route: another method does)."""
        allowed: FrozenSet[str] = frozenset()
        for route in self._routes:
            found = route.pattern.match(path)
            if found is not None:
                if method in route.methods:
                    return Match(route, None, found.groupdict(), route.methods)
                allowed = allowed | route.methods
        if allowed:
            return Match(None, None, {}, allowed)
        for mount in self._mounts:
            if path == mount.prefix or path.startswith(mount.prefix + "/"):
                return Match(None, mount, {}, frozenset())
        return None

    def handler_started(self) -> asyncio.Future[None]:
        """Count a request whose handler starts; the future is done once a stop gives it up (`cut_off`)."""
        self.running += 1
        if self._cut is None:
            self._cut = asyncio.get_running_loop().create_future()
        return self._cut

    def handler_ended(self) -> None:
        """A request counted by `handler_started` was answered (or given up)."""
        self.running -= 1
        if not self.running and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def mounted_started(self) -> None:
        """Count a request a mounted app serves: the stop's drain waits for it, as for a route's handler."""
        self.running += 1
        self._mounted_running += 1

    def mounted_ended(self) -> None:
        """A request counted by `mounted_started` ended."""
        self._mounted_running -= 1
        self.handler_ended()

    async def until_idle(self) -> None:
        """Return once no route handler runs."""
        if not self.running:
            return
        if self._idle is None or self._idle.done():
            self._idle = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._idle)  # a waiter that gives up leaves the future to the others

    def cut_off(self) -> int:
        """Give up every handler still running (the server's stop): each request is answered 503; how many.

        A mounted app's requests are not given up here: they end as the ports close, as the app's own.
        """
        cut, self._cut = self._cut, None
        if cut is not None and not cut.done():
            cut.set_result(None)
        return self.running - self._mounted_running

    def count(self, label: str, method: str, status: int) -> None:
        """Count one answered request (on the event loop)."""
        key = (label, method, status)
        self.counts[key] = self.counts.get(key, 0) + 1


def _check_path(path: str, what: str) -> None:
    """Refuse a path that is not absolute, or lies in Triton's or the OpenAI API's namespace."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise PyTritonValidationError(f"{what} {path!r} must start with '/'")
    for reserved in _RESERVED:
        if path == reserved or path.startswith(reserved + "/"):
            raise PyTritonValidationError(
                f"{what} '{path}' lies under {reserved}/, which Triton's API and the OpenAI API serve: "
                "choose another prefix"
            )
