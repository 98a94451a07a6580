"""Blocking readiness checks and model config retrieval over a tritonclient (http or grpc) client.

The loop's logic (`_polling.readiness_plan`) is shared with the asyncio helpers; this module runs its probes.
"""

from __future__ import annotations

import http.client
import time
from typing import Any, Dict, Optional

import grpc
import tritonclient.grpc
from tritonclient.utils import InferenceServerException

from pytriton.client._config import config_from_reply
from pytriton.client._errors import unavailable_error
from pytriton.client._polling import (
    DEFAULT_MODEL_READY_TIMEOUT_S,
    DEFAULT_SERVER_READY_TIMEOUT_S,
    Deadline,
    Pause,
    Probe,
    readiness_plan,
)
from pytriton.client._state import ModelRef, ModelState, model_state
from pytriton.model_config.triton_model_config import TritonModelConfig

# A probe failing so means "not ready yet"; HTTPException: geventhttpclient's for a connection closed unanswered.
_PROBE_ERRORS = (InferenceServerException, grpc.RpcError, OSError, http.client.HTTPException)


def _timeout_kwargs(client: Any, deadline: Deadline) -> Dict[str, float]:
    """Per-call timeout arguments: gRPC calls take one, HTTP clients carry theirs from construction."""
    if isinstance(client, tritonclient.grpc.InferenceServerClient):
        return {"client_timeout": deadline.probe_timeout()}
    return {}


def _probe(client: Any, probe: Probe, headers: Optional[Dict[str, str]], deadline: Deadline) -> bool:
    """Run one probe; one that raises has failed."""
    kwargs = _timeout_kwargs(client, deadline)
    try:
        if probe.model is not None:
            return bool(client.is_model_ready(**probe.model.ready_request(), **kwargs))
        return bool(
            client.is_server_live(headers=headers, **kwargs) and client.is_server_ready(headers=headers, **kwargs)
        )
    except _PROBE_ERRORS:
        return False


def wait_ready(
    client: Any, deadline: Deadline, headers: Optional[Dict[str, str]], model: Optional[ModelRef] = None
) -> None:
    """Wait, with blocking calls and sleeps, for the server and (given one) the model (`readiness_plan`).

    Raises:
        PyTritonClientTimeoutError: if they are not ready before the deadline.
    """
    plan = readiness_plan(deadline, model)
    answer: Optional[bool] = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                answer = None
            else:
                answer = _probe(client, step, headers, deadline)
    except StopIteration:
        return


def wait_for_server_ready(
    client: Any, timeout_s: Optional[float] = None, headers: Optional[Dict[str, str]] = None
) -> None:
    """Wait until the server is live and ready (default timeout 60 s).

    Raises:
        PyTritonClientTimeoutError: if the server is not ready in time.
    """
    wait_ready(client, Deadline(DEFAULT_SERVER_READY_TIMEOUT_S if timeout_s is None else timeout_s), headers)


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
    wait_for_model(client, ModelRef(model_name, model_version, headers), timeout_s)


def wait_for_model(client: Any, model: ModelRef, timeout_s: Optional[float]) -> None:
    """`wait_for_model_ready` for a ModelRef (what the clients call)."""
    wait_ready(
        client, Deadline(DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s), model.headers, model
    )


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
    return fetch_model_config(client, ModelRef(model_name, model_version, headers), timeout_s)


def fetch_model_config(client: Any, model: ModelRef, timeout_s: Optional[float]) -> TritonModelConfig:
    """`get_model_config` for a ModelRef (what the clients call)."""
    timeout_s = DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = Deadline(timeout_s)
    wait_ready(client, deadline, model.headers, model)
    is_grpc = isinstance(client, tritonclient.grpc.InferenceServerClient)
    try:
        reply = client.get_model_config(**model.config_request(is_grpc), **_timeout_kwargs(client, deadline))
    except _PROBE_ERRORS as error:
        raise unavailable_error(error, model.name, timeout_s) from error
    return config_from_reply(reply, is_grpc)


def get_model_state(
    client: Any, model_name: str, model_version: Optional[str] = None, headers: Optional[Dict[str, str]] = None
) -> ModelState:
    """The state of a model version (its latest when `model_version` is None), UNAVAILABLE when not found."""
    return model_state(client.get_model_repository_index(headers=headers), model_name, model_version)
