"""The hub's own servers, beside one frontend process: what they change reaches the frontend before they answer.

With `frontends=2` the hub serves a share of the connections itself (options/frontends.HUB_SHARE). A request
a frontend forwards is answered only once every frontend knows what it changed (pool.py); the same request on
a connection the hub serves must keep that promise too: a region registered there serves the next request on
the frontend's connection, and a region unregistered there is refused while a frontend's request holds it.
Inference goes straight to the hub's app or servicer, as on a server of one process.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict

from pytriton.runtime.frontends.forwarding import GRPC_METHODS, served_by_frontends
from pytriton.transport.grpc.handlers import RPCS
from pytriton.transport.http.responses import Receive, Scope, Send

# pool.FrontendPool.mirrored: runs a call that may change the mirrored state ("http" and the scope, or "grpc"
# and the RPC's name), an unregister under the frontends' holds of its regions.
Mirrored = Callable[[str, Any, Callable[[], Awaitable[Any]]], Awaitable[Any]]
Sync = Callable[[], Awaitable[None]]


class SyncingApp:
    """The hub's HTTP app for the connections it serves itself: state changes reach the frontend first."""

    def __init__(self, app: Any, mirrored: Mirrored, sync: Sync) -> None:
        """Serve with `app`; run other requests than inference through `mirrored`, and `sync` before answering."""
        self._app = app
        self._mirrored = mirrored
        self._sync = sync

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request."""
        if scope["type"] != "http" or served_by_frontends(scope):
            await self._app(scope, receive, send)
            return
        synced = False

        async def send_synced(message: Dict[str, Any]) -> None:
            nonlocal synced
            if not synced:
                synced = True
                await self._sync()
            await send(message)

        await self._mirrored("http", scope, lambda: self._app(scope, receive, send_synced))


class SyncingServicer:
    """The hub's gRPC servicer for the connections it serves itself: state changes reach the frontend first."""

    def __init__(self, servicer: Any, mirrored: Mirrored, sync: Sync) -> None:
        """Serve with `servicer`; run other RPCs than inference through `mirrored`, and `sync` before answering."""
        for rpc in RPCS:
            name = rpc.method.name
            method = getattr(servicer, name)
            setattr(self, name, method if name in GRPC_METHODS else _synced(name, method, mirrored, sync))


def _synced(name: str, method: Callable[..., Awaitable[Any]], mirrored: Mirrored, sync: Sync) -> Any:
    async def synced(request: Any, context: Any) -> Any:
        try:
            return await mirrored("grpc", name, lambda: method(request, context))
        finally:  # an RPC refused halfway may have changed some (log settings apply one at a time)
            await sync()

    synced.__name__ = name
    return synced
