"""The generate extension: flat JSON in (fields named after inputs), flat JSON out (one field per output)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from pytriton.core.datatypes import BYTES
from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.protocol.http_codec import Body, parse_json_object
from pytriton.protocol.parameters import ENSEMBLE_RESPONSE_PARAMETERS, RequestOptions, split_parameters
from pytriton.protocol.tensors import array_from_json, check_json_output


def decode_generate_request(
    spec: ModelSpec, body: Body, forwarded_headers: Optional[Mapping[str, str]] = None
) -> tuple[InferenceRequest, RequestOptions]:
    """Decode a generate request: each field named like an input is that input, the rest are parameters."""
    document = parse_json_object(body)
    request_id = document.pop("id", "")
    if not isinstance(request_id, str):
        raise InferenceError.invalid("the request 'id' must be a string")
    parameters = document.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise InferenceError.invalid("'parameters' must be a JSON object")
    missing = [tensor.name for tensor in spec.inputs if not tensor.optional and tensor.name not in document]
    if missing:
        try:  # Triton's words when the request has fewer inputs than the model requires
            spec.check_input_count([key for key in document if key in spec.input_by_name])
        except InferenceError as error:
            raise error.for_request(request_id) from None
        raise InferenceError.invalid(f"generate request for model '{spec.name}' is missing input '{missing[0]}'")
    inputs: Dict[str, np.ndarray] = {}
    for tensor in spec.inputs:
        if tensor.name in document:
            inputs[tensor.name] = input_array(spec, tensor, document.pop(tensor.name))
    extra = {key: value for key, value in document.items() if isinstance(value, (str, int, float, bool))}
    if len(extra) != len(document):
        unknown = sorted(set(document) - set(extra))
        raise InferenceError.invalid(f"generate request fields {unknown} are neither inputs nor scalar parameters")
    user_parameters, options = split_parameters({**extra, **parameters}, forwarded_headers)
    request = InferenceRequest(
        request_id=request_id,
        inputs=inputs,
        parameters=user_parameters,
        requested_outputs=None,
        batch_size=1,
        priority=options.priority,
        timeout_us=options.timeout_us,
        sequence=options.sequence,
    )
    return request, options


def input_array(spec: ModelSpec, tensor: TensorDef, value: Any) -> np.ndarray:
    """A generate field as an input tensor: its elements fill the tensor's dims (batch of 1 for batching models)."""
    flat = value if isinstance(value, list) else [value]
    dims = list(tensor.dims)
    if dims.count(-1) > 1:
        raise InferenceError.invalid(f"input '{tensor.name}' has more than one variable dim: send it with /infer")
    known = 1
    for dim in dims:
        known *= dim if dim != -1 else 1
    if -1 in dims:
        dims[dims.index(-1)] = len(flat) // known if known else 0
    shape = [1, *dims] if spec.batching else dims
    spec.check_input(tensor.name, tensor.datatype, shape)
    return array_from_json(flat, tensor.datatype, shape, tensor.name)


def encode_generate_response(spec: ModelSpec, request_id: str, response: InferenceResponse) -> Dict[str, Any]:
    """A generate response: model name and version, the id, each output as a scalar or a flat list.

    Its keys are sorted, as Triton writes them (checked against nvidia-pytriton 0.7: "Zed", "a_out", "id",
    "model_name", "model_version", "text_output").
    """
    document: Dict[str, Any] = {"model_name": spec.name, "model_version": spec.version_str}
    if request_id:
        document["id"] = request_id
    if spec.ensemble is not None:  # Triton's ensemble answers with its steps' sequence parameters
        document.update(ENSEMBLE_RESPONSE_PARAMETERS)
        document.update(response.parameters or {})
    for output in response.outputs:
        check_json_output(output.datatype)  # an FP16 or BF16 output has no JSON form: Triton refuses it here too
        values: List[Any] = [_plain(item, output.datatype) for item in output.array.reshape(-1).tolist()]
        document[output.name] = values[0] if len(values) == 1 else values
    return dict(sorted(document.items()))


def _plain(item: Any, datatype: str) -> Any:
    """A tensor element as a JSON value (BYTES as text)."""
    if datatype == BYTES and isinstance(item, bytes):
        return item.decode("utf-8", errors="replace")
    return item
