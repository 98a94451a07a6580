"""The SageMaker frontend: GET /ping and POST /invocations for the single served model, as Triton serves them."""

from __future__ import annotations

from pytriton.core.engine import Engine
from pytriton.core.errors import InferenceError
from pytriton.options.server import SageMakerOptions
from pytriton.transport.cloud.forwarding import App, forward, single_model
from pytriton.transport.http.responses import Receive, Scope, Send, send_empty, send_error

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="


class SageMakerFrontend:
    """ASGI app: /ping is server health (SAGEMAKER_TRITON_PING_MODE), /invocations a KServe v2 infer request.

    /invocations runs SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, or the only model served when it is not set, through
    the v2 app's infer (or generate / generate_stream, per SAGEMAKER_TRITON_INFERENCE_TYPE). Other paths get 400.
    """

    def __init__(self, engine: Engine, options: SageMakerOptions, api: App) -> None:
        """Serve SageMaker routes with `api`, the v2 app, under its restrictions (2.51's SageMaker server has none)."""
        self._engine = engine
        self._options = options
        self._api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request."""
        if scope["type"] != "http":
            return
        path = scope["path"]
        options = self._options
        if path == "/ping":
            await forward(self._api, scope, receive, send, path=f"/v2/health/{options.ping_mode}")
        elif path == "/invocations":
            try:
                model = single_model(self._engine, options.model, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
            except InferenceError as error:
                await send_error(send, 400, error.message)
                return
            target = f"/v2/models/{model}/{options.inference_type}"
            await forward(self._api, scope, receive, send, path=target, binary_mime=BINARY_MIME)
        elif path == "/models" or path.startswith("/models/"):
            await send_error(send, 501, "SageMaker multi-model endpoints are not supported: models are bound here")
        else:
            await send_empty(send, 400)
