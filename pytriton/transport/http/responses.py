"""Sending HTTP responses over ASGI: JSON documents, errors, infer bodies."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Sequence, Tuple

from pytriton.protocol import json_text
from pytriton.transport.http.cycle import CONNECTION_LOST

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = List[Tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")
OCTET_TYPE = (b"content-type", b"application/octet-stream")
# What tritonserver's HTTP server (libevhtp) sends when a handler set no content type: its health and readiness
# answers, routing's 404, the 403 of a restricted API, and what an infer handler refuses before it reads the JSON.
PLAIN_TYPE = (b"content-type", b"text/plain")


async def send_body(send: Send, status: int, body: bytes, headers: Sequence[Tuple[bytes, bytes]] = ()) -> None:
    """Send a complete response."""
    all_headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, document: Any) -> None:
    """Send a JSON document (NaN and infinities spelled out, as Triton writes them)."""
    await send_body(send, status, json_text.dumps(document), (JSON_TYPE,))


async def send_error(
    send: Send, status: int, message: str, headers: Sequence[Tuple[bytes, bytes]] = (JSON_TYPE,)
) -> None:
    """Send Triton's error body: {"error": message}, with `headers` (its content type among them)."""
    await send_body(send, status, json_text.dumps({"error": message}), headers)


async def send_empty(send: Send, status: int, headers: Sequence[Tuple[bytes, bytes]] = ()) -> None:
    """Send a status with an empty body (Triton's have a content type: PLAIN_TYPE or JSON_TYPE)."""
    await send_body(send, status, b"", headers)


async def until_disconnect(receive: Receive, stopped_sending: Optional[Callable[[], Awaitable[None]]] = None) -> None:
    """Return once the client has disconnected (the request body has been read already).

    A client that only stopped sending (it half-closed, as `nc -N` does) may still read its answer: with this
    server's connections, that waits until it is seen to have left (`CONNECTION_LOST`), after `stopped_sending()`
    (a stream's way to find out sooner).
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            lost = message.get(CONNECTION_LOST)
            if lost is not None:
                if stopped_sending is not None:
                    await stopped_sending()
                await lost()
            return


def header_map(scope: Scope) -> Dict[str, str]:
    """Request headers by lower-case name (the last value of a repeated header wins)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
