"""Clients for models served over the Triton (KServe v2) protocols, at PyTriton's import path.

Examples:
    with ModelClient("localhost", "MyModel") as client:
        result_dict = client.infer_sample(input1, input2)  # or client.infer_sample(a=input1, b=input2)

Mixing positional and named inputs raises PyTritonClientValueError.
"""

from pytriton.client._asyncio import AsyncioModelClient
from pytriton.client._asyncio_decoupled import AsyncioDecoupledModelClient
from pytriton.client._base import DEFAULT_INFERENCE_TIMEOUT_S, BaseModelClient
from pytriton.client._decoupled import DecoupledModelClient
from pytriton.client._futures import FuturesModelClient
from pytriton.client._sync import ModelClient

# What nvidia-pytriton's client module imports, and code written for it may import from there.
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.utils import TritonUrl, get_model_config, wait_for_model_ready, wait_for_server_ready
from pytriton.client.warnings import NotSupportedTimeoutWarning
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "DEFAULT_INFERENCE_TIMEOUT_S",
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "BaseModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
    "NotSupportedTimeoutWarning",
    "PyTritonClientClosedError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientQueueFullError",
    "PyTritonClientTimeoutError",
    "PyTritonClientValueError",
    "TritonModelConfig",
    "TritonUrl",
    "get_model_config",
    "wait_for_model_ready",
    "wait_for_server_ready",
]
