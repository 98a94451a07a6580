"""Blocking readiness checks and model config retrieval over a tritonclient (http or grpc) client."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

import grpc
import tritonclient.grpc
from tritonclient.utils import InferenceServerException

from pytriton.client._config import parse_model_config
from pytriton.client._errors import client_error
from pytriton.client._polling import DEFAULT_MODEL_READY_TIMEOUT_S, DEFAULT_SERVER_READY_TIMEOUT_S, Deadline
from pytriton.client._state import LATEST_MODEL_VERSION, ModelState, config_document, model_state
from pytriton.client.exceptions import PyTritonClientModelUnavailableError, PyTritonClientTimeoutError
from pytriton.model_config.triton_model_config import TritonModelConfig

_PROBE_ERRORS = (InferenceServerException, grpc.RpcError, OSError)


def _timeout_kwargs(client: Any, deadline: Deadline) -> Dict[str, float]:
    """Per-call timeout arguments: gRPC calls take one, HTTP clients carry theirs from construction."""
    if isinstance(client, tritonclient.grpc.InferenceServerClient):
        return {"client_timeout": deadline.probe_timeout()}
    return {}


def _wait_until(probe: Callable[[Deadline], bool], deadline: Deadline, what: str) -> None:
    """Probe until it succeeds, pausing between probes; a probe that raises counts as a failure."""
    while True:
        try:
            if probe(deadline):
                return
        except _PROBE_ERRORS:
            pass
        if deadline.expired():
            raise PyTritonClientTimeoutError(f"Waiting for {what} timed out after {deadline.timeout_s:g} s.")
        time.sleep(deadline.next_pause())


def _server_ready(client: Any, deadline: Deadline, headers: Optional[Dict[str, str]]) -> bool:
    """One probe of server liveness and readiness."""
    kwargs = _timeout_kwargs(client, deadline)
    return bool(client.is_server_live(headers=headers, **kwargs) and client.is_server_ready(headers=headers, **kwargs))


def wait_for_server_ready(
    client: Any, timeout_s: Optional[float] = None, headers: Optional[Dict[str, str]] = None
) -> None:
    """Wait until the server is live and ready (default timeout 60 s).

    Raises:
        PyTritonClientTimeoutError: if the server is not ready in time.
    """
    deadline = Deadline(DEFAULT_SERVER_READY_TIMEOUT_S if timeout_s is None else timeout_s)
    _wait_until(lambda d: _server_ready(client, d, headers), deadline, "server to be ready")


def wait_for_model_ready(
    client: Any,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: Optional[float] = None,
    headers: Optional[Dict[str, str]] = None,
) -> None:
    """Wait until the server and the model (its latest version when `model_version` is None) are ready.

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time (default timeout 300 s).
    """
    deadline = Deadline(DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s)
    _wait_for_model(client, model_name, model_version, deadline, headers)


def _wait_for_model(
    client: Any, model_name: str, model_version: Optional[str], deadline: Deadline, headers: Optional[Dict[str, str]]
) -> None:
    """Wait for the server, then for the model, within one deadline."""
    _wait_until(lambda d: _server_ready(client, d, headers), deadline, "server to be ready")

    def model_ready(d: Deadline) -> bool:
        kwargs = _timeout_kwargs(client, d)
        return bool(client.is_model_ready(model_name, model_version or "", headers=headers, **kwargs))

    what = f"model {model_name}/{model_version or LATEST_MODEL_VERSION} to be ready"
    _wait_until(model_ready, deadline, what)


def get_model_config(
    client: Any,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: Optional[float] = None,
    headers: Optional[Dict[str, str]] = None,
) -> TritonModelConfig:
    """Wait for the model to be ready (default timeout 300 s), then fetch and parse its config.

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time.
        PyTritonClientModelUnavailableError: if the config cannot be obtained from a ready server.
    """
    deadline = Deadline(DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s)
    _wait_for_model(client, model_name, model_version, deadline, headers)
    is_grpc = isinstance(client, tritonclient.grpc.InferenceServerClient)
    try:
        if is_grpc:
            reply = client.get_model_config(
                model_name, model_version or "", headers=headers, as_json=True, **_timeout_kwargs(client, deadline)
            )
        else:
            reply = client.get_model_config(model_name, model_version or "", headers=headers)
    except _PROBE_ERRORS as error:
        raise unavailable_error(error, model_name, deadline.timeout_s) from error
    return parse_model_config(config_document(reply, is_grpc))


def unavailable_error(error: BaseException, model_name: str, timeout_s: float) -> Exception:
    """A timeout stays a timeout; any other failure to read the config means the model is unavailable."""
    translated = client_error(error, timeout_s)
    if isinstance(translated, PyTritonClientTimeoutError):
        return translated
    return PyTritonClientModelUnavailableError(f"Could not obtain the config of model {model_name}: {error}")


def get_model_state(
    client: Any, model_name: str, model_version: Optional[str] = None, headers: Optional[Dict[str, str]] = None
) -> ModelState:
    """The state of a model version (its latest when `model_version` is None), UNAVAILABLE when not found."""
    return model_state(client.get_model_repository_index(headers=headers), model_name, model_version)
