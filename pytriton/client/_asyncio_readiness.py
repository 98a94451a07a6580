"""Asyncio readiness checks and model config retrieval over tritonclient.http.aio or tritonclient.grpc.aio.

The loop's logic (`_polling.readiness_plan`) is shared with the blocking helpers; this module runs its probes
and bounds the whole wait with `asyncio.wait_for`, so a probe that hangs cannot outlast the deadline.
`asyncio_utils` offers these with nvidia-pytriton 0.7's signatures; the clients call them with their headers.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Dict, Optional, TypeVar

import aiohttp
import grpc
import tritonclient.grpc.aio
from tritonclient.utils import InferenceServerException

from pytriton.client._config import config_from_reply
from pytriton.client._errors import unavailable_error
from pytriton.client._polling import DEFAULT_MODEL_READY_TIMEOUT_S, Deadline, Pause, Probe, readiness_plan
from pytriton.client._state import ModelRef
from pytriton.model_config.triton_model_config import TritonModelConfig

PROBE_ERRORS = (InferenceServerException, grpc.RpcError, OSError, aiohttp.ClientError, asyncio.TimeoutError)
_T = TypeVar("_T")


async def within(awaitable: Awaitable[_T], deadline: Deadline, what: str) -> _T:
    """Await with the deadline's time left, turning its expiry into PyTritonClientTimeoutError."""
    try:
        return await asyncio.wait_for(awaitable, deadline.remaining_or_none())
    except asyncio.TimeoutError:
        raise deadline.timeout_error(what) from None


async def _probe(client: Any, probe: Probe, headers: Optional[Dict[str, str]]) -> bool:
    """Run one probe; one that raises has failed."""
    try:
        if probe.model is not None:
            return bool(await client.is_model_ready(**probe.model.ready_request()))
        return bool(await client.is_server_live(headers=headers) and await client.is_server_ready(headers=headers))
    except PROBE_ERRORS:
        return False


async def _run_plan(
    client: Any, deadline: Deadline, headers: Optional[Dict[str, str]], model: Optional[ModelRef], server: bool
) -> None:
    """Run `readiness_plan` with awaited probes and `asyncio.sleep`."""
    plan = readiness_plan(deadline, model, server=server)
    answer: Optional[bool] = None
    try:
        while True:
            step = plan.send(answer)
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                answer = None
            else:
                answer = await _probe(client, step, headers)
    except StopIteration:
        return


async def wait_ready(
    client: Any,
    deadline: Deadline,
    headers: Optional[Dict[str, str]],
    model: Optional[ModelRef] = None,
    *,
    server: bool = True,
) -> None:
    """Wait for the server (unless `server` is False) and then (given one) the model, within the deadline.

    Raises:
        PyTritonClientTimeoutError: if they are not ready before the deadline.
    """
    what = f"{model.describe()} to be ready" if model is not None else "server to be ready"
    await within(_run_plan(client, deadline, headers, model, server), deadline, what)


async def wait_for_model(client: Any, model: ModelRef, timeout_s: Optional[float]) -> None:
    """Wait for the server and the model (default timeout 300 s).

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time.
    """
    deadline = Deadline(DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s)
    await wait_ready(client, deadline, model.headers, model)


async def fetch_model_config(client: Any, model: ModelRef, timeout_s: Optional[float]) -> TritonModelConfig:
    """Wait for the model to be ready (default timeout 300 s), then fetch and parse its config.

    Raises:
        PyTritonClientTimeoutError: if the server or the model is not ready in time.
        PyTritonClientModelUnavailableError: if the config cannot be obtained from a ready server.
    """
    timeout_s = DEFAULT_MODEL_READY_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = Deadline(timeout_s)
    is_grpc = isinstance(client, tritonclient.grpc.aio.InferenceServerClient)

    async def ready_then_fetch() -> Any:
        await _run_plan(client, deadline, model.headers, model, server=True)
        return await client.get_model_config(**model.config_request(is_grpc))

    try:
        reply = await within(ready_then_fetch(), deadline, f"config of model {model.name}")
    except PROBE_ERRORS as error:
        raise unavailable_error(error, model.name, timeout_s) from error
    return config_from_reply(reply, is_grpc)
