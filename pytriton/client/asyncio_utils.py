"""Asyncio readiness checks and model config retrieval over tritonclient.http.aio or tritonclient.grpc.aio."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Dict, Optional, TypeVar

import aiohttp
import grpc
import tritonclient.grpc.aio
from tritonclient.utils import InferenceServerException

from pytriton.client._config import parse_model_config
from pytriton.client._polling import DEFAULT_MODEL_READY_TIMEOUT_S, DEFAULT_SERVER_READY_TIMEOUT_S, Deadline
from pytriton.client._readiness import unavailable_error
from pytriton.client._state import LATEST_MODEL_VERSION, ModelState, config_document, model_state
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "asyncio_get_model_config",
    "asyncio_get_model_state",
    "asyncio_wait_for_model_ready",
    "asyncio_wait_for_server_ready",
]

_PROBE_ERRORS = (InferenceServerException, grpc.RpcError, OSError, aiohttp.ClientError, asyncio.TimeoutError)
_T = TypeVar("_T")


async def _within(awaitable: Awaitable[_T], deadline: Deadline, what: str) -> _T:
    """Await with the deadline's time left, turning its expiry into PyTritonClientTimeoutError."""
    try:
        return await asyncio.wait_for(awaitable, deadline.remaining())
    except asyncio.TimeoutError:
        raise PyTritonClientTimeoutError(f"Waiting for {what} timed out after {deadline.timeout_s:g} s.") from None


async def _poll(probe: Callable[[], Awaitable[bool]], deadline: Deadline, what: str) -> None:
    """Probe until it succeeds, pausing between probes; a probe that raises counts as a failure."""
    while True:
        try:
            if await probe():
                return
        except _PROBE_ERRORS:
            pass
        if deadline.expired():
            raise PyTritonClientTimeoutError(f"Waiting for {what} timed out after {deadline.timeout_s:g} s.")
        await asyncio.sleep(deadline.next_pause())


async def _server_ready(client: Any, headers: Optional[Dict[str, str]]) -> bool:
    """One probe of server liveness and readiness."""
    return bool(await client.is_server_live(headers=headers) and await client.is_server_ready(headers=headers))


async def asyncio_wait_for_server_ready(
    client: Any, timeout_s: Optional[float] = None, headers: Optional[Dict[str, str]] = None
) -> None:
    """Wait until the server is live and ready (default timeout 60 s).

    Raises:
        PyTritonClientTimeoutError: if the server is not ready in time.
    """
    deadline = Deadline(DEFAULT_SERVER_READY_TIMEOUT_S if timeout_s is None else timeout_s)
    what = "server to be ready"
    await _within(_poll(lambda: _server_ready(client, headers), deadline, what), deadline, what)


async def _wait_for_model(
    client: Any, model_name: str, model_version: Optional[str], deadline: Deadline, headers: Optional[Dict[str, str]]
) -> None:
    """Wait for the server, then for the model, within one deadline."""

    async def model_ready() -> bool:
        return bool(await client.is_model_ready(model_name, model_version or "", headers=headers))

    await _poll(lambda: _server_ready(client, headers), deadline, "server to be ready")
    await _poll(model_ready, deadline, f"model {model_name}/{model_version or LATEST_MODEL_VERSION} to be ready")


async def asyncio_wait_for_model_ready(
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
    what = f"model {model_name}/{model_version or LATEST_MODEL_VERSION} to be ready"
    await _within(_wait_for_model(client, model_name, model_version, deadline, headers), deadline, what)


async def asyncio_get_model_config(
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
    is_grpc = isinstance(client, tritonclient.grpc.aio.InferenceServerClient)

    async def ready_then_fetch() -> Any:
        await _wait_for_model(client, model_name, model_version, deadline, headers)
        if is_grpc:
            return await client.get_model_config(model_name, model_version or "", headers=headers, as_json=True)
        return await client.get_model_config(model_name, model_version or "", headers=headers)

    try:
        reply = await _within(ready_then_fetch(), deadline, f"config of model {model_name}")
    except _PROBE_ERRORS as error:
        raise unavailable_error(error, model_name, deadline.timeout_s) from error
    return parse_model_config(config_document(reply, is_grpc))


async def asyncio_get_model_state(
    client: Any, model_name: str, model_version: Optional[str] = None, headers: Optional[Dict[str, str]] = None
) -> ModelState:
    """The state of a model version (its latest when `model_version` is None), UNAVAILABLE when not found."""
    return model_state(await client.get_model_repository_index(headers=headers), model_name, model_version)
