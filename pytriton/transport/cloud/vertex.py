"""The Vertex AI frontend: AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE, with Triton's X-Vertex-Ai-Triton-Redirect."""

from __future__ import annotations

from typing import Dict

from pytriton.core.engine import Engine
from pytriton.core.errors import InferenceError
from pytriton.options.server import VertexAiOptions
from pytriton.transport.cloud.forwarding import App, forward, single_model
from pytriton.transport.http.responses import Receive, Scope, Send, header_map, send_empty, send_error

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "x-vertex-ai-triton-redirect"
# Redirected v2 routes that keep POST; every other redirected route is read with GET.
_POST_ACTIONS = ("infer", "generate", "generate_stream", "load", "unload", "index", "register", "unregister")


class VertexAiFrontend:
    """ASGI app: the health route is server readiness, the predict route infers the default model.

    A predict request with the X-Vertex-Ai-Triton-Redirect header is served by the v2 route it names
    (e.g. `v2/models/m/config`); Vertex AI only sends POST, so read-only routes are served as GET.
    """

    def __init__(self, engine: Engine, options: VertexAiOptions, api: App) -> None:
        """Serve Vertex AI routes with `api`, the v2 app."""
        self._engine = engine
        self._options = options
        self._api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request."""
        if scope["type"] != "http":
            return
        path = scope["path"]
        options = self._options
        if path == options.health_route:
            await forward(self._api, scope, receive, send, path="/v2/health/ready")
        elif path == options.predict_route:
            await self._predict(scope, receive, send, header_map(scope))
        else:
            await send_empty(send, 400)

    async def _predict(self, scope: Scope, receive: Receive, send: Send, headers: Dict[str, str]) -> None:
        """Infer the default model, or serve the redirected v2 route."""
        redirect = headers.get(REDIRECT_HEADER)
        if redirect is None:
            try:
                model = single_model(self._engine, self._options.default_model, "vertex_ai_default_model")
            except InferenceError as error:
                await send_error(send, 400, error.message)
                return
            await forward(self._api, scope, receive, send, path=f"/v2/models/{model}/infer", binary_mime=BINARY_MIME)
            return
        if scope["method"] != "POST":
            await send_empty(send, 405)
            return
        target = "/" + redirect.strip()
        method = "POST" if target.rstrip("/").rsplit("/", 1)[-1] in _POST_ACTIONS else "GET"
        await forward(self._api, scope, receive, send, path=target, method=method, binary_mime=BINARY_MIME)
