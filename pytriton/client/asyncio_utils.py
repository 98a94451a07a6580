"""nvidia-pytriton 0.7's asyncio helpers: readiness waits, model config and state over a tritonclient aio client.

Names, parameters and defaults are 0.7's. The two waits that take `sleep_time_s` have no deadline of their own:
they probe every `sleep_time_s` until ready, and their caller bounds them (`asyncio.wait_for`), as in 0.7. The
others wait at most `timeout_s`, probing after 50 ms, then at doubling intervals up to 1 s (0.7 sleeps a tenth
of the timeout). A probe that fails to connect counts as "not ready" in every wait.
"""

from __future__ import annotations

from typing import Optional, Union

import tritonclient.grpc.aio
import tritonclient.http.aio

from pytriton.client import _asyncio_readiness
from pytriton.client._polling import Deadline
from pytriton.client._state import ModelRef, ModelState, model_state
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "aio_clients",
    "asyncio_get_model_config",
    "asyncio_get_model_state",
    "asyncio_wait_for_model_ready",
    "asyncio_wait_for_model_status_loaded",
    "asyncio_wait_for_server_ready",
]

aio_clients = Union[tritonclient.grpc.aio.InferenceServerClient, tritonclient.http.aio.InferenceServerClient]

_DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = 60.0


async def asyncio_get_model_state(
    client: aio_clients, model_name: str, model_version: Optional[str] = None
) -> ModelState:
    """The state of a model version (its latest when `model_version` is None), UNAVAILABLE when not found.

    The repository index it reads is restricted by default: against a server with an access token, use
    `pytriton.client.utils.get_model_state`, which sends headers.
    """
    return model_state(await client.get_model_repository_index(), model_name, model_version)


async def asyncio_get_model_config(
    client: aio_clients,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: float = _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
) -> TritonModelConfig:
    """Wait up to `timeout_s` for the server and the model, then fetch and parse the model's config.

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time.
        PyTritonClientModelUnavailableError: if the config cannot be obtained from a ready server.
    """
    try:
        return await _asyncio_readiness.fetch_model_config(client, ModelRef(model_name, model_version), timeout_s)
    except PyTritonClientTimeoutError as error:  # 0.7's words
        raise PyTritonClientTimeoutError(
            f"Timeout while waiting for model {model_name} config (timeout={timeout_s:0.2f})"
        ) from error


async def asyncio_wait_for_server_ready(asyncio_client: aio_clients, sleep_time_s: float) -> None:
    """Probe the server's liveness and readiness every `sleep_time_s` seconds until both hold; no deadline."""
    await _asyncio_readiness.wait_ready(asyncio_client, Deadline(None, pause_s=sleep_time_s), None)


async def asyncio_wait_for_model_status_loaded(
    asyncio_client: aio_clients, model_name: str, sleep_time_s: float, model_version: Optional[str] = None
) -> None:
    """Probe the model's readiness (not the server's) every `sleep_time_s` seconds until it is ready; no deadline."""
    model = ModelRef(model_name, model_version)
    await _asyncio_readiness.wait_ready(asyncio_client, Deadline(None, pause_s=sleep_time_s), None, model, server=False)


async def asyncio_wait_for_model_ready(
    asyncio_client: aio_clients,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: float = _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
) -> None:
    """Wait up to `timeout_s` for the server, then the model (its latest version when `model_version` is None).

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time.
    """
    try:
        await _asyncio_readiness.wait_for_model(asyncio_client, ModelRef(model_name, model_version), timeout_s)
    except PyTritonClientTimeoutError as error:  # 0.7's words
        raise PyTritonClientTimeoutError(
            f"Timeout while waiting for model {model_name} to be ready (timeout={timeout_s:0.2f})"
        ) from error
