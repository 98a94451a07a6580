"""An ASGI app called on one event loop that runs another ASGI app on the engine's loop thread.

Ray Serve calls a replica's ASGI app on the replica's own event loop, while the engine, its
scheduler and its HTTP app live on the engine's loop (`LoopThread`). The bridge reads the request
body on the caller's loop, runs the app on the engine's loop, and hands each response message back
through a queue on the caller's loop: one hop each way, plus one per response message. A caller that
goes away (the request is cancelled) cancels the app's task, which takes a queued request out of
the scheduler's queue as a disconnect does.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Dict, List, Optional

Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Dict[str, Any], Receive, Send], Awaitable[None]]


class LoopBridge:
    """Serves `app`, which must run on `loop`, to callers on any other event loop."""

    def __init__(self, app: App, loop: asyncio.AbstractEventLoop) -> None:
        """Bridge to `app` on `loop` (the engine's)."""
        self._app = app
        self._loop = loop

    async def __call__(self, scope: Dict[str, Any], receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope: lifespan here, HTTP on the engine's loop."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        caller = asyncio.get_running_loop()
        outbox: asyncio.Queue[Optional[Message]] = asyncio.Queue()

        def post(message: Optional[Message]) -> None:
            caller.call_soon_threadsafe(outbox.put_nowait, message)

        running = asyncio.run_coroutine_threadsafe(self._run(scope, body, post), self._loop)
        try:
            while True:
                message = await outbox.get()
                if message is None:
                    break
                await send(message)
        finally:
            running.cancel()  # nothing when it is done; else the caller left: stop the app

    async def _run(self, scope: Dict[str, Any], body: bytes, post: Callable[[Optional[Message]], None]) -> None:
        """Call the app on the engine's loop with the whole body; post what it sends, then None."""
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.get_running_loop().create_future()  # the caller leaving cancels this task
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            post(message)

        try:
            await self._app(scope, receive, send)
        finally:
            post(None)


async def _read_body(receive: Receive) -> bytes:
    """The whole request body."""
    parts: List[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("the client disconnected")
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Answer the lifespan protocol: nothing to start or stop here (the engine has its own lifecycle)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
