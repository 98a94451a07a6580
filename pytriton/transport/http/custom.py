"""Serving the user's custom routes and mounted ASGI apps (options/routes.py) on the HTTP port.

A route's handler gets a `RouteRequest` and returns a `RouteResponse`, a JSON-able value (dict, list; numpy
arrays in it become lists), `str` or `bytes`. It runs with a call path of its own (core/composition/path.py), so
it can call bound models in-process (pytriton.compose), sharing their batchers. An `async def` handler runs on
the event loop; a plain function in a worker thread of the loop's default executor.

A handler whose client disconnects before it answers is given up, as a running inference request is: an async
one is cancelled, and its call path closed, so its inner calls in flight are cancelled; a sync one's thread
cannot be interrupted, but its call path closes, so its inner calls fail (CANCELLED) from then on. The
request is counted with status 499.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple, Union
from urllib.parse import parse_qsl

import orjson

from pytriton.core.composition.path import CURRENT, CallPath, Models
from pytriton.core.daemon_threads import DaemonThreads, awaited
from pytriton.core.errors import CallableRaised, InferenceError, callable_error, exception_text
from pytriton.options.routes import CustomRoutes, Match
from pytriton.transport.http.responses import JSON_TYPE, Receive, Scope, Send, send_error, until_disconnect

LOGGER = logging.getLogger(__name__)
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# The status a route's request is counted with when its client left before the answer (nginx's "client closed
# request"); the client never sees it.
CLIENT_LEFT = 499


class RouteRequest:
    """One request to a custom route: method, path, path parameters, query, headers (lower-case names), body."""

    __slots__ = ("body", "headers", "method", "path", "path_params", "query")

    def __init__(
        self,
        method: str,
        path: str,
        path_params: Dict[str, str],
        query: Dict[str, str],
        headers: Dict[str, str],
        body: bytes,
    ) -> None:
        """Create a request."""
        self.method = method
        self.path = path
        self.path_params = path_params
        self.query = query
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        """The body, parsed as JSON (a ValueError when it is not JSON)."""
        return orjson.loads(self.body)


class RouteResponse:
    """A custom route's answer: body, status and headers (content-type from `media_type`)."""

    __slots__ = ("body", "headers", "media_type", "status")

    def __init__(
        self,
        body: Union[bytes, str] = b"",
        status: int = 200,
        headers: Optional[Dict[str, str]] = None,
        media_type: str = "application/octet-stream",
    ) -> None:
        """Create a response; a `str` body is sent as UTF-8."""
        self.body = _body_bytes(body)
        self.status = status
        self.headers = dict(headers or {})
        self.media_type = media_type

    @classmethod
    def json(cls, value: Any, status: int = 200, headers: Optional[Dict[str, str]] = None) -> RouteResponse:
        """A JSON response (numpy arrays become lists)."""
        return cls(orjson.dumps(value, option=_JSON_OPTIONS), status, headers, "application/json")


def _body_bytes(body: Any) -> bytes:
    """A response body as bytes: a `str` as UTF-8."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"a RouteResponse's body must be bytes or str, not {type(body).__name__}")


def response_of(value: Any) -> RouteResponse:
    """What a handler returned, as a response."""
    if isinstance(value, RouteResponse):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return RouteResponse(bytes(value))
    if isinstance(value, str):
        return RouteResponse(value.encode(), media_type="text/plain; charset=utf-8")
    return RouteResponse.json(value)


async def serve_custom(
    routes: CustomRoutes,
    match: Match,
    models: Models,
    scope: Scope,
    receive: Receive,
    send: Send,
    read_body: Callable[[], Awaitable[Any]],
) -> None:
    """Serve one request a custom route or mount matched; counted by route, method and status.

    `read_body()` reads the whole body within the server's limit (an error with an HTTP `status` past it).
    """
    method: str = scope["method"]
    status = [500]

    async def counted_send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = int(message["status"])
        await send(message)

    if match.mount is not None:
        label = match.mount.prefix
        prefix = match.mount.prefix
        inner = dict(scope, path=scope["path"][len(prefix) :] or "/", root_path=scope.get("root_path", "") + prefix)
        raw_path = scope.get("raw_path")
        if isinstance(raw_path, bytes) and raw_path.startswith(prefix.encode()):
            inner["raw_path"] = raw_path[len(prefix) :] or b"/"
        routes.mounted_started()
        try:
            await _in_path(models, match.mount.app(inner, receive, counted_send))
        finally:
            routes.mounted_ended()
            routes.count(label, method, status[0])
        return
    if match.route is None:
        routes.count(scope["path"], method, 405)
        allow = ", ".join(sorted(match.allowed)).encode()
        await send_error(send, 405, "Method Not Allowed", (JSON_TYPE, (b"allow", allow)))  # RFC 9110 15.5.6
        return
    route = match.route
    handler: Optional[asyncio.Future[Any]] = None
    watcher: Optional[asyncio.Future[None]] = None
    counted = False
    try:
        try:
            body = bytes(await read_body())
        except Exception as error:
            refused = getattr(error, "status", None)
            if not isinstance(refused, int):
                raise
            status[0] = refused  # read_body's refusal (413)
            await send_error(send, refused, str(error))
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        request = RouteRequest(method, scope["path"], match.parameters, query, headers, body)
        stopped = routes.handler_started()
        counted = True
        handler = asyncio.ensure_future(_in_path(models, _run_handler(route.handler, request)))
        watcher = asyncio.ensure_future(until_disconnect(receive))
        await asyncio.wait((handler, watcher, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not handler.done():
            _abandon(handler)
            if stopped.done():
                status[0] = 503
                LOGGER.debug("custom route %s %s: the server stopped, its handler is given up", method, route.path)
                await send_error(send, 503, f"the server stopped before route '{route.path}' answered")
                return
            status[0] = CLIENT_LEFT
            LOGGER.debug("custom route %s %s: the client left, its handler is cancelled", method, route.path)
            await send_error(send, CLIENT_LEFT, "the client disconnected before the route answered")
            return
        watcher.cancel()  # before the answer: once it is sent, receive() says the request is over
        if handler.cancelled():  # the handler raised CancelledError itself: this request was not cancelled
            raise _HandlerFailed("CancelledError")
        response = response_of(handler.result())
        await _send_response(counted_send, response)
    except InferenceError as error:
        status[0] = error.status.http_status
        await send_error(send, error.status.http_status, error.message)
    except asyncio.CancelledError:  # the server stops, or (on the hub) the frontend's client left
        if handler is not None and not handler.done():
            _abandon(handler)
            status[0] = CLIENT_LEFT
        raise
    except Exception as error:
        shown = error.error if isinstance(error, CallableRaised) else error
        LOGGER.error("custom route %s %s failed", method, route.path, exc_info=shown)
        status[0] = 500
        text = str(error) if isinstance(error, _HandlerFailed) else callable_error(error).message
        await send_error(send, 500, text)
    finally:
        if watcher is not None:
            watcher.cancel()
        if counted:
            routes.handler_ended()
        routes.count(route.path, method, status[0])


def _abandon(handler: asyncio.Future[Any]) -> None:
    """Cancel a handler whose client left: an async one at its next await; a sync one's thread runs on.

    Either way its call path closes as the task ends (`_in_path`): its inner calls in flight are cancelled and
    a sync handler's further calls fail at once. What it raises or returns afterwards is dropped.
    """
    handler.cancel()
    handler.add_done_callback(_drop_outcome)


def _drop_outcome(handler: asyncio.Future[Any]) -> None:
    """Read an abandoned handler's outcome, so that asyncio does not report it as never retrieved."""
    if not handler.cancelled():
        handler.exception()


# As many as the loop's default executor would have had.
_HANDLER_THREADS = DaemonThreads(min(32, (os.cpu_count() or 1) + 4), "pytriton-route")


class _HandlerFailed(Exception):
    """A handler raised a BaseException that is no Exception (SystemExit, KeyboardInterrupt...); its text."""


async def _run_handler(handler: Any, request: RouteRequest) -> Any:
    """Await an async handler; run a plain one in the loop's default executor, in this context (its call path).

    A SystemExit or KeyboardInterrupt it raises becomes `_HandlerFailed`: raised through the loop's task, it would
    end the server's event loop (the request fails, the server goes on, as for an inference callable).
    """
    try:
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
            return await handler(request)
        context = contextvars.copy_context()
        # Not the loop's default executor: its threads are joined as the interpreter exits, so a handler still
        # running when the server stopped would hold the process until it returned (core/daemon_threads.py).
        result = await awaited(_HANDLER_THREADS, functools.partial(context.run, handler, request))
        if inspect.isawaitable(result):
            return await result
        return result
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as error:
        message = exception_text(error)
        raise _HandlerFailed(f"{type(error).__name__}: {message}" if message else type(error).__name__) from error


async def _in_path(models: Models, awaitable: Any) -> Any:
    """Await with a fresh call path (no model on it yet, no deadline), its inner calls cancelled at the end."""
    path = CallPath(models, (), 0)
    token = CURRENT.set(path)
    try:
        return await awaitable
    finally:
        CURRENT.reset(token)
        path.close("the route's request has ended")


async def _send_response(send: Send, response: RouteResponse) -> None:
    """Send a response whole.

    Whatever is refused (a body set to another type, a header that is not latin-1) is refused before the head goes,
    so that the request is still answered 500.
    """
    body = _body_bytes(response.body)
    headers: List[Tuple[bytes, bytes]] = [(b"content-type", response.media_type.encode("latin-1"))]
    for name, value in response.headers.items():
        if name.lower() not in ("content-type", "content-length"):
            headers.append((name.encode("latin-1"), value.encode("latin-1")))
        elif name.lower() == "content-type":
            headers[0] = (b"content-type", value.encode("latin-1"))
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
