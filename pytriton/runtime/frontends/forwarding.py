"""What a frontend process does not answer itself goes to the hub whole, and comes back whole.

A frontend answers inference (HTTP infer, generate and generate_stream; gRPC ModelInfer and ModelStreamInfer)
itself, the models' work done on the hub. Every other API request (health, metadata, statistics, the model
repository, shared-memory registration, logging and trace settings) is run by the hub's own HTTP app or gRPC
servicer, exactly as a server of one process runs it, so each answer is the hub's state, the same whichever
frontend a client lands on. Such requests are few and small: one call to the hub each. A client that leaves
before its answer makes the frontend abandon the call, which the hub's app sees as its own client's disconnect
(a custom route's handler is then cancelled, as on a server of one process).

A response the hub's app sends in parts (a mounted app's server-sent events, a download it streams) crosses in
parts, each sent on as it comes (the call's progress, ipc/calls.py), as a server of one process sends it: held
until whole, a stream's client heard nothing until it ended, and one that never ends never. The frontend says
when it has written each part to its client, and the app's send waits while too much is not yet written
(ipc/credit.py), as one process's send waits while its client's socket is full: a client that reads slowly, or
not at all, holds the app, not the memory of both processes. A response sent whole comes with the call's reply,
after what it changed reached every frontend.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Tuple

import grpc

from pytriton.core.errors import InferenceError
from pytriton.ipc.calls import Calls, abandoned, progress
from pytriton.transport.grpc.call import Metadata, RpcAbort
from pytriton.transport.grpc.errors import status_of
from pytriton.transport.grpc.handlers import RPCS
from pytriton.transport.http.app import path_segments
from pytriton.transport.http.responses import Receive, Scope, Send, send_error, until_disconnect

# Served by the frontend itself: the model's work goes to the hub as a request (remote.py).
_HTTP_ACTIONS = frozenset(("infer", "generate", "generate_stream"))
GRPC_METHODS = frozenset(("ModelInfer", "ModelStreamInfer"))
_SCOPE_KEYS = ("type", "asgi", "http_version", "server", "client", "scheme", "method", "root_path", "path")

# A forwarded request's answer: status, headers, body, and whether the status and headers went ahead (a
# response in parts: the body is its last part).
HttpAnswer = Tuple[int, List[Tuple[bytes, bytes]], bytes, bool]
_START, _PART, _ENDED = 0, 1, 2  # what the frontend's queue of a forwarded answer holds: (kind, ...)


class ForwardingApp:
    """An ASGI app that serves inference with `app` and has the hub answer every other request."""

    def __init__(self, app: Any, calls: Calls, max_body_bytes: int, max_json_bytes: int) -> None:
        """Serve inference with `app`; forward the rest through `calls`.

        Bodies cross whole up to the limit the hub's app reads them within: `max_json_bytes` for Triton's and the
        OpenAI API's routes, `max_body_bytes` for the user's own.
        """
        self._app = app
        self._calls = calls
        self._max_body_bytes = max_body_bytes
        self._max_json_bytes = max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request, here or on the hub."""
        if scope["type"] != "http":
            return
        if served_by_frontends(scope):
            await self._app(scope, receive, send)
            return
        parts = path_segments(scope)
        limit = self._max_json_bytes if len(parts) > 1 and parts[1] in ("v1", "v2") else self._max_body_bytes
        try:
            body = await _read_within(receive, limit)
        except InferenceError as error:
            await send_error(send, error.status.http_status, error.message)
            return
        forwarded = {key: scope[key] for key in _SCOPE_KEYS if key in scope}
        forwarded["raw_path"] = scope.get("raw_path")
        forwarded["query_string"] = scope.get("query_string", b"")
        forwarded["headers"] = list(scope["headers"])
        pieces: asyncio.Queue[Tuple[Any, ...]] = asyncio.Queue()
        call = asyncio.ensure_future(self._calls.call("http", forwarded, body, on_progress=pieces.put_nowait))
        call.add_done_callback(lambda _: pieces.put_nowait((_ENDED,)))  # after the parts that came before the reply
        gone = asyncio.ensure_future(until_disconnect(receive))
        started = False
        try:
            while True:
                part = asyncio.ensure_future(pieces.get())
                await asyncio.wait((part, gone), return_when=asyncio.FIRST_COMPLETED)
                if gone.done():  # the client left: the hub's handler is told, as its own client's leaving tells it
                    # (even with a part come meanwhile: sent on, each would earn the handler room for another,
                    # and a stream that awaits nothing else would run on to its end)
                    part.cancel()
                    self._calls.abandon(call)
                    return
                item = part.result()
                if item[0] == _START:
                    started = True
                    await send({"type": "http.response.start", "status": item[1], "headers": item[2]})
                elif item[0] == _PART:
                    await send({"type": "http.response.body", "body": item[1], "more_body": True})
                else:
                    break
                self._calls.took(call)  # written on (send waits while the client's socket is full): the hub sends more
        finally:
            gone.cancel()
        try:
            status, headers, answer, streamed = call.result()
        except Exception:  # noqa: BLE001 - the hub went away: the server is stopping
            if started:  # a response in parts ends where it got to
                await send({"type": "http.response.body", "body": b""})
            else:
                await send_error(send, 503, "the server is stopping")
            return
        if not streamed:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def _read_within(receive: Receive, limit: int) -> bytes:
    """The body, or its first `limit` + 1 bytes when it is longer (the rest is not waited for).

    The hub's app refuses a body past `limit` as it would the whole one (413), and a route that reads none (health,
    metadata) answers as it would: a longer body would only cost the memory of both processes, and the copies.
    Its answer goes out at once: the rest of a body of declared length is dropped as it comes, and a chunked one
    closes the connection after the answer (waiting for it, a body that never ended was read for ever, unanswered).
    """
    kept = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InferenceError.invalid("client disconnected while sending the request")
        chunk = message.get("body", b"")
        kept += chunk[: limit + 1 - len(kept)]
        if len(kept) > limit or not message.get("more_body", False):
            return bytes(kept)


def served_by_frontends(scope: Scope) -> bool:
    """Whether an HTTP request is inference, which a frontend serves itself (the rest is the hub's state)."""
    parts = path_segments(scope)
    if len(parts) >= 5 and parts[2] == "models" and parts[-1] in _HTTP_ACTIONS:
        return True
    return len(parts) >= 3 and parts[1] == "v1" and parts[2] != "models"  # the OpenAI API's, but its listing


async def run_http(app: Any, scope: Dict[str, Any], body: bytes) -> HttpAnswer:
    """On the hub: serve a forwarded request with the hub's app; its status, headers and body.

    After the body, the app's receive() says "http.disconnect" once the frontend's client has left (the
    frontend abandoned the call) or the response has been sent, as the server's own connections say it.
    """
    scope = dict(scope, extensions={})
    delivered = False
    over = asyncio.get_running_loop().create_future()
    left = abandoned()

    async def receive() -> Dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        waits = [over] if left is None else [over, left]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        return {"type": "http.disconnect"}

    status = 500
    headers: List[Tuple[bytes, bytes]] = []
    parts: List[bytes] = []
    ahead = progress()  # a response in parts goes on in parts (the module's docstring)
    streamed = False

    async def send(message: Dict[str, Any]) -> None:
        nonlocal status, headers, streamed
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            more = message.get("more_body", False)
            if more and left is not None and left.done():
                await asyncio.sleep(0)  # the client left: dropped, and a loop turn all the same, as in one process
                return
            parts.append(bytes(message.get("body", b"")))
            if more and ahead is not None and not over.done():
                if not streamed:
                    streamed = True
                    await ahead((_START, status, headers), 0)
                part = b"".join(parts)
                parts.clear()
                await ahead((_PART, part), len(part))  # waits while the frontend has too much of it not written
            if not more and not over.done():
                over.set_result(None)

    try:
        await app(scope, receive, send)
    finally:
        if not over.done():
            over.set_result(None)
    return status, headers, b"".join(parts), streamed


class ForwardingServicer:
    """The gRPC servicer of a frontend: inference from `servicer`, every other RPC answered by the hub."""

    def __init__(self, servicer: Any, calls: Calls) -> None:
        """Serve inference with `servicer`; forward the rest through `calls`."""
        for rpc in RPCS:
            name = rpc.method.name
            if name in GRPC_METHODS:
                setattr(self, name, getattr(servicer, name))
            else:
                setattr(self, name, _forwarder(calls, name, rpc.response_type.FromString))


def _forwarder(calls: Calls, name: str, parse: Callable[[bytes], Any]) -> Callable[[Any, Any], Any]:
    """A servicer method that has the hub answer RPC `name`."""

    async def forward(request: Any, context: Any) -> Any:
        if isinstance(request, InferenceError):  # the frontend could not parse the message
            code, details = status_of(request)
            await context.abort(code, details)
        try:
            answer = await calls.call("grpc", name, request.SerializeToString(), context.invocation_metadata())
        except Exception:  # noqa: BLE001 - the hub went away: the server is stopping
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        if answer[0] != "ok":
            await context.abort(grpc.StatusCode[answer[1]], answer[2])
        return parse(answer[1])

    forward.__name__ = name
    return forward


class _ForwardedContext:
    """The servicer context of a forwarded call: its metadata, and `abort`."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        """The call's metadata, as the frontend read it."""
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """End the call with a status (raises)."""
        raise RpcAbort(code, details)


async def run_grpc(servicer: Any, name: str, request: bytes, metadata: Metadata) -> Tuple[Any, ...]:
    """On the hub: answer a forwarded RPC with the hub's servicer: ("ok", response) or ("abort", code, details)."""
    rpc = next((rpc for rpc in RPCS if rpc.method.name == name), None)
    if rpc is None or name in GRPC_METHODS:
        return ("abort", "UNIMPLEMENTED", f"unknown method {name}")
    try:
        response = await getattr(servicer, name)(rpc.request_type.FromString(request), _ForwardedContext(metadata))
    except RpcAbort as abort:
        return ("abort", abort.code.name, abort.details)
    except Exception as error:  # noqa: BLE001 - every failure reaches the client as a status
        code, details = status_of(error)
        return ("abort", code.name, details)
    return ("ok", response.SerializeToString())
