"""The generate extension: flat JSON in (fields named after inputs), flat JSON out (one field per output)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.core.tensors.datatypes import BYTES
from pytriton.protocol.http_codec import Body, parse_json_object
from pytriton.protocol.parameters import ENSEMBLE_RESPONSE_PARAMETERS, RequestOptions, split_parameters
from pytriton.protocol.tensors import array_from_json, check_json_output

_PARAMETERS = "parameters"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def decode_generate_request(
    spec: ModelSpec, body: Body, forwarded_headers: Optional[Mapping[str, str]] = None
) -> tuple[InferenceRequest, RequestOptions]:
    """Decode a generate request as tritonserver 2.51 reads one (its GenerateRequestClass::ConvertGenerateRequest).

    Each key, in the order the body has them, is an input when the model has an input of that name and a
    parameter otherwise (the request's `id` too); the keys of a `parameters` object are read the same way. Then
    the inputs get the checks an /infer request's get, in Triton's core's order.
    """
    document = _document(spec, body)
    request_id = document.get("id", "")
    if not isinstance(request_id, str):  # Triton's words; it answers them with 500, here 400: the client sent it
        raise InferenceError.invalid("Unable to parse 'id': attempt to access JSON non-string as string")
    reading = _Reading(spec, request_id)
    reading.members(document)
    try:
        batch_size = _check_inputs(spec, reading.inputs)
        if reading.refusal is not None:
            raise reading.refusal
    except InferenceError as error:
        if error.of_request:  # Triton's core names the request
            raise error.for_request(request_id) from None
        raise
    user_parameters, options = split_parameters(reading.parameters, forwarded_headers)
    request = InferenceRequest(
        request_id=request_id,
        inputs=reading.inputs,
        parameters=user_parameters,
        requested_outputs=None,
        batch_size=batch_size,
        priority=options.priority,
        timeout_us=options.timeout_us,
        sequence=options.sequence,
    )
    return request, options


class _Pairs(Dict[str, Any]):
    """A JSON object that keeps its keys as the body has them, in order and repeats included (`pairs`)."""

    def __init__(self, pairs: List[Tuple[str, Any]]) -> None:
        """The object of these pairs (a repeated key's last value, as other JSON readers keep)."""
        super().__init__(pairs)
        self.pairs = pairs


def _document(spec: ModelSpec, body: Body) -> Dict[str, Any]:
    """The request's JSON object; read as `_Pairs` when the body may name an input twice.

    Triton refuses an input given twice; a JSON reader keeps one value of a repeated key. The body is read again,
    with its repeats, only when an input's quoted name appears in it more than once.
    """
    document = parse_json_object(body)
    raw = bytes(body)
    if any(raw.count(b'"%s"' % name.encode()) > 1 for name in spec.input_by_name):
        try:
            document = json.loads(raw, object_pairs_hook=_Pairs)
        except ValueError:  # what only json_text reads (as Triton does): its reading stands, repeats unseen
            pass
    return document


def _members(document: Dict[str, Any]) -> Any:
    """An object's keys and values in order; when it was read as `_Pairs`, each repeat of a key too.

    A repeated key comes with its first value each time, as Triton's reader finds a key's value.
    """
    if not isinstance(document, _Pairs):
        return document.items()
    first: Dict[str, Any] = {}
    for key, value in document.pairs:
        first.setdefault(key, value)
    return [(key, first[key]) for key, _ in document.pairs]


class _Reading:
    """The inputs and parameters of one generate request, read key by key."""

    def __init__(self, spec: ModelSpec, request_id: str) -> None:
        """Nothing read yet."""
        self.spec = spec
        self.request_id = request_id
        self.inputs: Dict[str, np.ndarray] = {}
        self.parameters: Dict[str, Any] = {}
        self.refusal: Optional[InferenceError] = None  # the core's refusal of an input's data, due after its checks

    def members(self, document: Dict[str, Any]) -> None:
        """Read the request's keys in order; `parameters` is an object whose keys are read the same way."""
        for key, value in _members(document):
            if key == _PARAMETERS:
                self._nested(value)
            else:
                self._member(key, value)

    def _nested(self, value: Any) -> None:
        """The `parameters` object: Triton's errors in it are prefixed with the keyword."""
        if _PARAMETERS in self.spec.input_by_name:
            raise InferenceError.invalid(  # Triton's words
                "Keyword 'parameters' for nested schema also given as input tensor name"
            )
        if not isinstance(value, dict):  # Triton's words; it answers them with 500, here 400: the client sent it
            raise InferenceError.invalid(
                "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"
            )
        try:
            for key, item in _members(value):
                self._member(key, item)
        except InferenceError as error:
            raise InferenceError(error.status, f"Converting keyword: 'parameters': {error.message}") from None

    def _member(self, key: str, value: Any) -> None:
        """One key: an input, or a parameter (a later key of the same name replaces an earlier one, as in Triton)."""
        tensor = self.spec.input_by_name.get(key)
        if tensor is None:
            self.parameters[key] = _parameter(key, value)
            return
        shape = _shape(self.spec, tensor, value)
        try:
            array = array_from_json(value, tensor.datatype, shape, key, self.spec.name)  # in Triton's words
        except InferenceError as error:
            if not error.of_request:
                raise
            # Triton's core counts a BYTES input's strings only after its checks of every input, as for /infer
            self.refusal = self.refusal or error
            array = np.empty(shape, np.object_)
        if key in self.inputs:
            raise InferenceError.invalid_input(f"input '{key}' already exists in request").for_request(self.request_id)
        self.inputs[key] = array


def _parameter(key: str, value: Any) -> Any:
    """A key that names no input, as the parameter Triton makes of it: an integer beyond INT64 becomes a double."""
    if isinstance(value, (str, bool, float)):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    raise InferenceError.invalid(  # Triton's words
        f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def _shape(spec: ModelSpec, tensor: TensorDef, value: Any) -> List[int]:
    """The shape Triton gives a generate value: its element count (a list's length, else 1) over the input's shape.

    As tritonserver 2.51 does, the fixed dims divide the count, from the innermost; the innermost variable dim
    takes what remains and every other variable dim (a batching model's batch dim among them) is 1. So a batching
    model gets as many rows as the value fills.
    """
    shape = [-1, *tensor.dims] if spec.batching else list(tensor.dims)
    remaining = len(value) if isinstance(value, list) else 1
    for dim in reversed(shape):
        if dim != -1:
            if dim <= 0 or remaining % dim:
                raise _no_shape(tensor.name)
            remaining //= dim
    for index in reversed(range(len(shape))):
        if shape[index] == -1:
            shape[index], remaining = remaining, 1
    if remaining != 1:
        raise _no_shape(tensor.name)
    return shape


def _no_shape(name: str) -> InferenceError:
    """Triton's words for a value whose element count fits no shape of the input."""
    return InferenceError.invalid(f"The schema can not convert input '{name}' to tensor with proper shape")


def _check_inputs(spec: ModelSpec, inputs: Dict[str, np.ndarray]) -> int:
    """Triton's core's checks of the request's inputs (their count, each shape, the batch sizes); its batch size."""
    names = list(inputs)
    spec.check_input_count(names)
    headers: List[Tuple[str, str, List[int]]] = [
        (name, spec.input_by_name[name].datatype, list(array.shape)) for name, array in inputs.items()
    ]
    batch_sizes: List[int] = []
    for index, (name, datatype, shape) in enumerate(headers):
        try:
            batch_sizes.append(spec.check_input(name, datatype, shape))
        except InferenceError:
            spec.check_inputs_visited_before(headers, index)
            raise
    return spec.check_input_set(names, batch_sizes)


def input_array(spec: ModelSpec, tensor: TensorDef, value: Any) -> np.ndarray:
    """An OpenAI request's field as an input tensor: its elements fill the tensor's dims (a batch of 1 when batching).

    (A generate request's fields take Triton's shapes instead: `_shape`.)
    """
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
