"""Serving a cloud route with the KServe v2 app: another path and method, and the cloud's binary MIME type."""

from __future__ import annotations

from typing import Awaitable, Callable, List, Optional, Tuple
from urllib.parse import quote

from pytriton.core.engine import Engine
from pytriton.core.errors import InferenceError
from pytriton.transport.http.responses import Message, Receive, Scope, Send, send_error

App = Callable[[Scope, Receive, Send], Awaitable[None]]
_HEADER_LENGTH = b"inference-header-content-length"
# The cloud frontends neither decompress requests nor compress responses (Triton's, neither).
_DROPPED = frozenset({_HEADER_LENGTH, b"accept-encoding", b"content-encoding"})


async def forward(
    app: App,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    path: str,
    method: Optional[str] = None,
    binary_mime: Optional[str] = None,
) -> None:
    """Serve a request with `app` as `method path`.

    With `binary_mime` (e.g. `application/vnd.sagemaker-triton.binary+json;json-header-size=`), a request of that
    Content-Type carries binary tensors after a JSON header of the size it names, and a response with binary
    tensors is sent with that Content-Type instead of Inference-Header-Content-Length.
    """
    headers: List[Tuple[bytes, bytes]] = [(name, value) for name, value in scope["headers"] if name not in _DROPPED]
    if binary_mime is not None:
        content_type = next((value for name, value in headers if name == b"content-type"), b"").decode("latin-1")
        position = content_type.find(binary_mime)
        if position > 0:
            await send_error(
                send, 400, f"expect MIME type for binary data starts with '{binary_mime}', got: {content_type}"
            )
            return
        if position == 0:
            size = content_type[len(binary_mime) :].strip()
            if not size.isdigit():
                await send_error(send, 400, f"Unable to parse inference header size, got: {size}")
                return
            headers.append((_HEADER_LENGTH, size.encode()))
        send = _binary_mime_sender(send, binary_mime)
    forwarded = dict(scope, path=path, raw_path=quote(path).encode("ascii"), query_string=b"", headers=headers)
    if method is not None:
        forwarded["method"] = method
    await app(forwarded, receive, send)


def _binary_mime_sender(send: Send, binary_mime: str) -> Send:
    """A `send` that turns Inference-Header-Content-Length into the cloud's binary Content-Type."""

    async def send_with_mime(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            length = next((value for name, value in headers if name == _HEADER_LENGTH), None)
            if length is not None:
                message = dict(message)
                message["headers"] = [
                    (name, value) for name, value in headers if name not in (_HEADER_LENGTH, b"content-type")
                ] + [(b"content-type", binary_mime.encode() + length)]
        await send(message)

    return send_with_mime


def single_model(engine: Engine, configured: Optional[str], setting: str) -> str:
    """The model a cloud route serves: the configured one, else the only model served."""
    if configured:
        return configured
    names = sorted({model.spec.name for model in engine.models()})
    if len(names) == 1:
        return names[0]
    raise InferenceError.invalid(
        f"{setting} is not set and {len(names)} models are served: expect a single model if the default model is "
        "not specified"
    )
