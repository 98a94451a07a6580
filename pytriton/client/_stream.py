"""Decoupled (streaming) inference messages: one ModelInferRequest out, responses in until the final flag.

tritonclient's asyncio gRPC client cannot send `triton_enable_empty_final_response` (it refuses `triton_`
parameters), so both decoupled clients build the request message themselves and call ModelStreamInfer on
tritonclient's generated stub.
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Tuple

import numpy as np
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

from pytriton.client._errors import client_error
from pytriton.client._request import Arrays, Parameters
from pytriton.client.exceptions import PyTritonClientError
from pytriton.model_config.triton_model_config import TritonModelConfig

# tritonclient's own channel settings: no limit below 2 GiB on message sizes.
CHANNEL_OPTIONS: List[Tuple[str, int]] = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
]
_EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
_FINAL_RESPONSE = "triton_final_response"


def stream_request(
    model_name: str,
    model_version: Optional[str],
    request_id: str,
    inputs: Arrays,
    config: TritonModelConfig,
    parameters: Optional[Parameters],
) -> Any:
    """A ModelInferRequest asking for every output and for an empty response carrying the final flag."""
    request = service_pb2.ModelInferRequest(model_name=model_name, model_version=model_version or "", id=request_id)
    for name, array in inputs.items():
        datatype = np_to_triton_dtype(array.dtype)
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        request.raw_input_contents.append(_raw_content(array, datatype))
    for spec in config.outputs or []:
        request.outputs.add(name=spec.name)
    for key, value in (parameters or {}).items():
        _set_parameter(request.parameters[key], value)
    request.parameters[_EMPTY_FINAL_RESPONSE].bool_param = True
    return request


def _raw_content(array: np.ndarray, datatype: str) -> bytes:
    """An array's bytes as the binary tensor protocol lays them out (BYTES: length-prefixed elements)."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array).tobytes()
    serialized = serialize_byte_tensor(array)
    return bytes(serialized.item()) if serialized.size > 0 else b""


def _set_parameter(parameter: Any, value: object) -> None:
    """Fill an InferParameter (bool is checked before int, as bool is an int)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    else:
        parameter.string_param = str(value)


def stream_outputs(
    reply: Any, timeout_s: float, translate: Callable[[BaseException, float], PyTritonClientError] = client_error
) -> Optional[Arrays]:
    """The outputs of one ModelStreamInferResponse; None for the final one (its outputs are dropped).

    Raises:
        PyTritonClientError: the error the response carries, as `translate` words it (ModelClient's words by default).
    """
    if reply.error_message:
        raise translate(InferenceServerException(msg=reply.error_message), timeout_s)
    response = reply.infer_response
    final = response.parameters.get(_FINAL_RESPONSE)
    if final is not None and final.bool_param:
        return None
    result = InferResult(response)
    return {output.name: result.as_numpy(output.name) for output in response.outputs}


def stream_metadata(headers: Optional[Mapping[str, object]]) -> Optional[Tuple[Tuple[str, str], ...]]:
    """Headers as gRPC metadata: lowercase keys, string values."""
    if not headers:
        return None
    return tuple((key.lower(), str(value)) for key, value in headers.items())
