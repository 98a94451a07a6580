"""ModelInfer / ModelStreamInfer messages built field by field, answered as tritonserver 2.51 answers them.

Every expected answer here is what nvidia-pytriton 0.7 (tritonserver 2.51) gave to the same message, side by side.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterator, List

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request as http_request

DTYPES: Dict[str, Any] = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "FP16": np.float16,
    "BYTES": bytes,
}


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"]} for request in requests]


def bind_models(triton: Triton) -> None:
    for datatype, dtype in DTYPES.items():
        triton.bind(
            f"id_{datatype}",
            _identity,
            inputs=[Tensor(name="IN", dtype=dtype, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=dtype, shape=(-1,))],
            config=ModelConfig(batching=False),
        )
    triton.bind(
        "batched",
        _identity,
        inputs=[Tensor(name="IN", dtype=np.int32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.int32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(bind_models) as triton:
        yield triton


@pytest.fixture(scope="module")
def channel(server: Triton) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_url(server)) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(channel: Any) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request(datatype: str, shape: List[int], model: str = "") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model or f"id_{datatype}", id="c")
    request.inputs.add(name="IN", datatype=datatype, shape=shape)
    return request


def _raw_request(datatype: str, values: List[Any]) -> Any:
    request = _request(datatype, [len(values)])
    request.raw_input_contents.append(np.array(values, DTYPES[datatype]).tobytes())
    return request


def _refusal(stub: Any, request: Any) -> Any:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request)
    return raised.value.code(), raised.value.details()


def _invalid(message: str) -> Any:
    return grpc.StatusCode.INVALID_ARGUMENT, message


def _values(response: Any, datatype: str) -> List[Any]:
    return np.frombuffer(response.raw_output_contents[0], DTYPES[datatype]).tolist()


def _stream(stub: Any, *requests: Any) -> List[Any]:
    return list(stub.ModelStreamInfer(iter(requests), timeout=30))


@pytest.mark.parametrize(
    ("datatype", "field", "sent", "kept"),
    [
        ("INT8", "int_contents", [1, 300, -129, 128], [1, 44, 127, -128]),
        ("INT16", "int_contents", [70000, -70000], [4464, -4464]),
        ("UINT8", "uint_contents", [256, 2**32 - 1], [0, 255]),
        ("UINT16", "uint_contents", [65536, 1], [0, 1]),
    ],
)
def test_typed_integers_too_wide_keep_their_low_bytes(
    stub: Any, datatype: str, field: str, sent: Any, kept: Any
) -> None:
    # Triton copies the low bytes of each 32-bit value; this server refused them ("do not fit INT8").
    request = _request(datatype, [len(sent)])
    getattr(request.inputs[0].contents, field).extend(sent)
    assert _values(stub.ModelInfer(request), datatype) == kept


@pytest.mark.parametrize(("second", "values"), [("int64_contents", [1, 2]), ("fp32_contents", [1.0, 2.0])])
def test_a_second_contents_field_is_data_already_supplied(stub: Any, second: str, values: Any) -> None:
    request = _request("INT32", [2])
    request.inputs[0].contents.int_contents.extend([1, 2])
    getattr(request.inputs[0].contents, second).extend(values)
    assert _refusal(stub, request) == _invalid(
        "unexpected explicit tensor data for input tensor 'IN' for model 'id_INT32', binary data was already supplied."
    )


def test_contents_without_values_are_no_data_for_fp16_too(stub: Any) -> None:
    request = _request("FP16", [2])
    request.inputs[0].contents.SetInParent()
    assert _refusal(stub, request) == _invalid(
        "[request id: c] input byte size mismatch for input 'IN' for model 'id_FP16'. Expected 4, got 0"
    )
    request.inputs[0].shape[:] = [0]
    response = stub.ModelInfer(request)
    assert (list(response.outputs[0].shape), list(response.raw_output_contents)) == ([0], [b""])


def _strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_strings_too_many_are_counted_as_tritons_core_counts_them(stub: Any) -> None:
    request = _request("BYTES", [2])
    request.inputs[0].contents.bytes_contents.extend([b"a", b"b", b"c", b"d"])
    too_many = (
        "[request id: c] unexpected number of string elements 3 for inference input 'IN' for model 'id_BYTES', "
        "expecting 2"
    )
    assert _refusal(stub, request) == _invalid(too_many)
    # The core stops at the element past the count: a cut string after it is not read.
    cut_after = _request("BYTES", [1])
    cut_after.raw_input_contents.append(_strings(b"a") + struct.pack("<I", 5) + b"ab")
    assert _refusal(stub, cut_after) == _invalid(
        "[request id: c] unexpected number of string elements 2 for inference input 'IN' for model 'id_BYTES', "
        "expecting 1"
    )


def test_a_cut_string_is_the_models_error_in_a_stream(stub: Any) -> None:
    cut = _request("BYTES", [1])
    cut.raw_input_contents.append(struct.pack("<I", 5) + b"ab")
    message = "incomplete string data for inference input 'IN', expecting string of length 5 but only 2 bytes available"
    assert _refusal(stub, cut) == _invalid(message)
    good = _raw_request("INT32", [1, 2])
    first, second = _stream(stub, cut, good)
    expected = service_pb2.ModelInferResponse(id="c", model_name="id_BYTES")
    expected.parameters["triton_final_response"].bool_param = True
    assert (first.error_message, first.infer_response) == (message, expected)
    assert not second.error_message and _values(second.infer_response, "INT32") == [1, 2]


def test_a_dimension_of_minus_one_is_named_as_triton_names_it(stub: Any) -> None:
    request = _request("INT32", [-1])
    request.raw_input_contents.append(b"")
    assert _refusal(stub, request) == _invalid(
        "[request id: c] All input dimensions should be specified for input 'IN' for model 'id_INT32', got [-1]"
    )


def test_an_input_without_shape_of_a_batching_model(stub: Any) -> None:
    request = _request("INT32", [], model="batched")
    request.raw_input_contents.append(b"\0" * 4)
    assert _refusal(stub, request) == _invalid(
        "[request id: c] input 'IN' has no shape but model requires batch dimension for 'batched'"
    )


def _with_parameter(parameters: Any, key: str, kind: Any, value: Any) -> None:
    if kind is None:
        parameters[key].SetInParent()
    else:
        setattr(parameters[key], kind, value)


@pytest.mark.parametrize(
    ("key", "kind", "value", "expected"),
    [
        ("foo", "uint64_param", 7, "int64_param, bool_param, or string_param"),
        ("foo", None, None, "int64_param, bool_param, or string_param"),
        ("binary_data_output", "uint64_param", 1, "int64_param, bool_param, or string_param"),
        ("triton_enable_empty_final_response", "int64_param", 1, "bool_param"),
        ("triton_enable_empty_final_response", None, None, "bool_param"),
    ],
)
def test_request_parameters_of_a_kind_triton_does_not_take(
    stub: Any, key: str, kind: Any, value: Any, expected: str
) -> None:
    request = _raw_request("INT32", [1, 2])
    _with_parameter(request.parameters, key, kind, value)
    assert _refusal(stub, request) == _invalid(f"invalid value type for '{key}' parameter, expected {expected}.")


def test_tensor_parameters_without_a_value_are_taken(stub: Any) -> None:
    request = _raw_request("INT32", [1, 2])
    request.inputs[0].parameters["foo"].SetInParent()
    request.outputs.add(name="OUT").parameters["bar"].SetInParent()
    assert _values(stub.ModelInfer(request), "INT32") == [1, 2]


_REGION_REFUSALS = [
    (
        {"shared_memory_region": ("int64_param", 1)},
        "invalid value type for 'shared_memory_region' parameter for tensor '{name}', expected string_param.",
    ),
    (
        {"shared_memory_region": ("string_param", "r")},
        "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor '{name}'",
    ),
    (
        {"shared_memory_offset": ("int64_param", 8)},
        "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor '{name}'",
    ),
    (
        {"shared_memory_byte_size": ("string_param", "8")},
        "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor '{name}'",
    ),
    (
        {"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("uint64_param", 8)},
        "invalid value type for 'shared_memory_byte_size' parameter for tensor '{name}', expected int64_param.",
    ),
]


@pytest.mark.parametrize(("parameters", "refusal"), _REGION_REFUSALS)
@pytest.mark.parametrize("tensor", ["input", "output"])
def test_shared_memory_parameters_are_checked_in_tritons_words(
    stub: Any, parameters: Dict[str, Any], refusal: str, tensor: str
) -> None:
    request = _raw_request("INT32", [1, 2])
    target = request.inputs[0] if tensor == "input" else request.outputs.add(name="OUT")
    for key, (kind, value) in parameters.items():
        _with_parameter(target.parameters, key, kind, value)
    assert _refusal(stub, request) == _invalid(refusal.format(name=target.name))


@pytest.mark.parametrize(("datatype", "values"), [("BOOL", [True, False]), ("FP16", [1.0, 3.0])])
def test_classes_of_an_output_triton_cannot_order(stub: Any, datatype: str, values: Any) -> None:
    request = _raw_request(datatype, values)
    request.outputs.add(name="OUT").parameters["classification"].int64_param = 1
    message = f"class result not available for output due to unsupported type '{datatype}'"
    assert _refusal(stub, request) == _invalid(message)
    (answer,) = _stream(stub, request)
    expected = service_pb2.ModelInferResponse(id="c", model_name=f"id_{datatype}")
    expected.parameters["triton_final_response"].bool_param = True  # the model answered: the response's error
    assert (answer.error_message, answer.infer_response) == (message, expected)


def test_a_message_that_does_not_parse_is_internal_as_in_triton(channel: Any) -> None:
    call = channel.unary_unary(  # raw bytes: an id that is not UTF-8
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda data: data,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    data = _raw_request("INT32", [1, 2]).SerializeToString().replace(b"\x1a\x01c", b"\x1a\x01\xff")
    with pytest.raises(grpc.RpcError) as raised:
        call(data)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")


def test_over_http_what_triton_finds_in_the_answer_has_no_content_type(server: Triton) -> None:
    """A cut string (the Python backend's error) and a class count of BOOL (the response's): Triton's response
    callback answers them, with no content type (tritonserver's text/plain); both were application/json."""
    header = json.dumps(
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]}
    )
    cut = http_request(
        server.http_port,
        "POST",
        "/v2/models/id_BYTES/infer",
        header.encode() + struct.pack("<I", 5) + b"ab",
        {"Inference-Header-Content-Length": str(len(header))},
    )
    classes = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [2], "datatype": "BOOL", "data": [True, False]}],
            "outputs": [{"name": "OUT", "parameters": {"classification": 1}}],
        }
    )
    unordered = http_request(server.http_port, "POST", "/v2/models/id_BOOL/infer", classes)
    assert [(status, headers["content-type"], json.loads(raw)) for status, headers, raw in (cut, unordered)] == [
        (
            400,
            "text/plain",
            {
                "error": "incomplete string data for inference input 'IN', expecting string of length 5 but only 2 "
                "bytes available"
            },
        ),
        (400, "text/plain", {"error": "class result not available for output due to unsupported type 'BOOL'"}),
    ]


def _typed_fp32(request: Any) -> Any:
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    return request


def _bytes_request(data: bytes) -> Any:
    request = _request("BYTES", [1])
    request.raw_input_contents.append(data)
    return request


def _shaped(request: Any, shape: List[int]) -> Any:
    request.inputs[0].shape[:] = shape
    return request


def _in_shared_memory(request: Any) -> Any:
    request.inputs[0].contents.int_contents.extend([1, 2])
    request.inputs[0].parameters["shared_memory_region"].string_param = "none"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 8
    return request


def _unknown_output(request: Any) -> Any:
    request.outputs.add(name="NOPE")
    return request


def _string_class_count(request: Any) -> Any:
    request.outputs.add(name="OUT").parameters["classification"].string_param = "x"
    return request


def _named_twice(request: Any) -> Any:
    request.inputs.add().CopyFrom(request.inputs[0])
    return request


def _region_without_size(request: Any) -> Any:
    request.inputs[0].parameters["shared_memory_region"].string_param = "none"
    return request


def _reserved_parameter(request: Any) -> Any:
    request.parameters["triton_x"].int64_param = 1
    return request


_RESERVED = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with "
    "'triton_' are allowed: triton_enable_empty_final_response"
)


@pytest.mark.parametrize(
    ("request_message", "refusal"),
    [
        (  # the frontend adds every input (a name given twice refused) before it reads any data
            _named_twice(_typed_fp32(_raw_request("INT32", [1, 2]))),
            "[request id: c] input 'IN' already exists in request",
        ),
        (_named_twice(_request("INT32", [2])), "[request id: c] input 'IN' already exists in request"),
        (
            _named_twice(_region_without_size(_request("INT32", [2]))),
            "[request id: c] input 'IN' already exists in request",
        ),
        # the request's parameters before its inputs
        (_reserved_parameter(_named_twice(_request("INT32", [2]))), _RESERVED),
        (_reserved_parameter(_region_without_size(_request("INT32", [2]))), _RESERVED),
        (  # the frontend reads the data before its core checks the shape
            _typed_fp32(_request("INT32", [2, 2])),
            "unexpected explicit tensor data for input tensor 'IN' for model 'id_INT32' of type 'FP32', expected "
            "datatype 'INT32'",
        ),
        (  # then the outputs' parameters, before its core checks the inputs
            _string_class_count(_shaped(_raw_request("INT32", [1, 2]), [2, 1])),
            "invalid value type for 'classification' parameter, expected int64_param",
        ),
        (
            _string_class_count(_request("INT32", [2])),
            "unable to find data for input tensor 'IN' for model 'id_INT32' in request.",
        ),
        (  # the core checks the outputs before the inputs, their strings too
            _unknown_output(_bytes_request(b"\x01")),
            "unexpected inference output 'NOPE' for model 'id_BYTES'",
        ),
        (
            _unknown_output(_shaped(_raw_request("INT32", [1, 2]), [2, 1])),
            "unexpected inference output 'NOPE' for model 'id_INT32'",
        ),
        (
            _unknown_output(_in_shared_memory(_request("INT32", [2]))),
            "unexpected 'content' provided when using shared memory for input tensor 'IN' for model 'id_INT32'",
        ),
    ],
    ids=[
        "name twice before contents",
        "name twice before missing data",
        "name twice before shared-memory parameters",
        "request parameters before names",
        "request parameters before shared-memory parameters",
        "contents before shape",
        "output parameters before inputs",
        "data before output parameters",
        "output before strings",
        "output before shape",
        "contents in shared memory",
    ],
)
def test_of_several_errors_the_one_triton_checks_first(stub: Any, request_message: Any, refusal: str) -> None:
    assert _refusal(stub, request_message) == _invalid(refusal)


def test_an_inputs_region_is_looked_up_before_the_next_inputs_data(stub: Any) -> None:
    # tritonserver 2.51's frontend reads the inputs one by one, each with its region: the first input's region, not
    # registered, is NOT_FOUND before the second's contents in shared memory (nvidia-pytriton 0.7.0); this server
    # checked every input's data before any region.
    request = _request("INT32", [2])
    request.inputs[0].parameters["shared_memory_region"].string_param = "none"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 8
    request.inputs.add().CopyFrom(_in_shared_memory(_request("INT32", [2])).inputs[0])
    request.inputs[1].name = "IN2"
    assert _refusal(stub, request) == (grpc.StatusCode.NOT_FOUND, "Unable to find shared memory region: 'none'")


def test_an_inputs_shared_memory_parameters_are_read_after_the_inputs_before_it(stub: Any) -> None:
    # tritonserver 2.51's frontend reads the inputs one by one, each with its shared-memory parameters: the first
    # input's missing data is named before the second's region without a byte size (nvidia-pytriton 0.7.0); this
    # server read every input's parameters first.
    request = _request("INT32", [2])
    second = request.inputs.add(name="IN2", datatype="INT32", shape=[2])
    second.parameters["shared_memory_region"].string_param = "none"
    assert _refusal(stub, request) == _invalid(
        "unable to find data for input tensor 'IN' for model 'id_INT32' in request."
    )
