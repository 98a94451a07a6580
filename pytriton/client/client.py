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

__all__ = [
    "DEFAULT_INFERENCE_TIMEOUT_S",
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "BaseModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]
