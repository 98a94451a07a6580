"""How the HTTP server turns a request away: JSON error responses, and the Upgrade header it ignores."""

from __future__ import annotations

import http
import re
from typing import Any

import orjson

from pytriton.protocol.openai_codec import PATH_PREFIX, OpenAIError
from pytriton.transport.http.cycle import App, Message

_ERROR_HEADERS = "Content-Type: application/json\r\nConnection: close\r\nContent-Length: "


def error_response(status: int, message: str) -> bytes:
    """A complete JSON error response that closes the connection."""
    body = orjson.dumps({"error": message})
    head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n{_ERROR_HEADERS}{len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


def refusal(status: int, message: str) -> App:
    """An ASGI app answering every request with `status` and a JSON error, closing the connection.

    The error has Triton's shape, `{"error": message}`, except under the OpenAI API's `/v1/`, where it has
    OpenAI's, which its SDKs parse.
    """
    bodies = (orjson.dumps({"error": message}), orjson.dumps(OpenAIError(status, message).document()))
    heads = [
        [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for body in bodies
    ]

    async def refuse(scope: Message, receive: Any, send: Any) -> None:
        shape = 1 if scope["path"].startswith(PATH_PREFIX) else 0
        await send({"type": "http.response.start", "status": status, "headers": heads[shape]})
        await send({"type": "http.response.body", "body": bodies[shape]})

    return refuse


UPGRADE_WITH_BODY = refusal(
    400, "an HTTP/1.1 Upgrade request cannot carry a body on this server: send it without the Upgrade header"
)

CONFLICTING_HOSTS = refusal(400, "the request has Host headers of different values")

# RFC 9112 section 6.1. llhttp undoes chunked, and refuses a request whose codings do not end with it; one it
# takes ("gzip, chunked") would reach the app with the other codings still applied.
UNKNOWN_TRANSFER_CODING = refusal(501, "transfer codings other than chunked are not supported")

_UPGRADE_LINE = re.compile(rb"\r\nupgrade[ \t]*:[^\r\n]*(?=\r\n)", re.IGNORECASE)


def without_upgrade_header(data: bytes) -> bytes:
    """A chunk starting a request head, without its Upgrade header (`curl --http2` sends one: h2c).

    The server does not switch protocols and RFC 9110 lets it ignore the header; removing it keeps
    llhttp parsing the body and the next requests as HTTP/1.1.
    """
    end = data.find(b"\r\n\r\n")
    head_end = len(data) if end < 0 else end + 2
    return _UPGRADE_LINE.sub(b"", data[:head_end]) + data[head_end:]
