"""Helpers for the clients: url parsing, tritonclient client creation, readiness, model config and state."""

from __future__ import annotations

from typing import Any, Optional

import tritonclient.grpc
import tritonclient.http
from grpc import RpcError
from tritonclient.utils import InferenceServerException

from pytriton.client._polling import DEFAULT_MODEL_READY_TIMEOUT_S, DEFAULT_SERVER_READY_TIMEOUT_S
from pytriton.client._readiness import get_model_config, get_model_state, wait_for_model_ready, wait_for_server_ready
from pytriton.client._state import LATEST_MODEL_VERSION, ModelState, parse_grpc_response, parse_http_response
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientInvalidUrlError, PyTritonClientTimeoutError
from pytriton.client.warnings import NotSupportedTimeoutWarning
from pytriton.constants import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT
from pytriton.model_config.parser import ModelConfigParser

# nvidia-pytriton's names for the default timeouts, which its client modules import from here.
_DEFAULT_NETWORK_TIMEOUT_S = 60.0
_DEFAULT_WAIT_FOR_SERVER_READY_TIMEOUT_S = DEFAULT_SERVER_READY_TIMEOUT_S
_DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = DEFAULT_MODEL_READY_TIMEOUT_S

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HTTP_PORT",
    "LATEST_MODEL_VERSION",
    "InferenceServerException",
    "ModelConfigParser",
    "ModelState",
    "NotSupportedTimeoutWarning",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientTimeoutError",
    "RpcError",
    "TritonUrl",
    "create_client_from_url",
    "get_model_config",
    "get_model_state",
    "parse_grpc_response",
    "parse_http_response",
    "wait_for_model_ready",
    "wait_for_server_ready",
]


def create_client_from_url(url: str, network_timeout_s: Optional[float] = None) -> Any:
    """A blocking tritonclient client (tritonclient.http or tritonclient.grpc) for `url`.

    Args:
        url: server url; no scheme means http, no port the scheme's default (8000 for http, 8001 for grpc).
        network_timeout_s: connection and network timeout of HTTP clients (gRPC ones take timeouts per call).

    Raises:
        PyTritonClientInvalidUrlError: if the url is invalid.
    """
    triton_url = TritonUrl.from_url(url)
    if triton_url.scheme == "grpc":
        return tritonclient.grpc.InferenceServerClient(triton_url.without_scheme)
    kwargs = (
        {}
        if network_timeout_s is None
        else {"connection_timeout": network_timeout_s, "network_timeout": network_timeout_s}
    )
    return tritonclient.http.InferenceServerClient(triton_url.without_scheme, **kwargs)
