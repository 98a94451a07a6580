"""Every datatype through identity models, over every tensor encoding, as tritonserver 2.51 answers it.

Each datatype goes in and out as HTTP JSON (flat and nested `data`), as binary data (asked for per output, for the
whole request, or overridden per output), mixed (JSON in, binary out and back), and over gRPC as raw contents and
as typed contents, with its edge values: NaN, the infinities, -0.0, subnormals, each integer type's bounds, UINT64
past 2**63, strings with NULs, not UTF-8, empty. nvidia-pytriton 0.7.0 (its tritonserver 2.51) answered the same
requests side by side: the values, datatypes and shapes here are its answers, bit for bit, and the JSON text of
integers, booleans and strings is its text. Where the two differ on purpose (docs/migration.md) only what is the
same is compared: JSON numbers are the same doubles in other digits, BYTES that are no UTF-8 carry U+FFFD in JSON.
BF16 is this server's alone (0.7 binds no BF16 tensor).

The refusals below are Triton's words for data its HTTP frontend refuses: it reads every input's JSON `data` (the
values and their count) before its core checks any input against the model, and reads none for a shape of no
elements. Triton answers them 500; this server 400, as for every other JSON that does not fit its datatype.
Of several faults in one request, the answer names the one Triton names: its HTTP frontend reads the id, the
parameters, every input (its source, binary bytes, JSON data) and the outputs; then its core checks the outputs,
the input count, and each input's datatype, shape and byte size, the last input first.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

import grpc
import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

NUMPY: Dict[str, Any] = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.bytes_,
}
NAN, INF = float("nan"), float("inf")
VALUES: Dict[str, List[Any]] = {
    "BOOL": [True, False, True],
    "INT8": [-128, -1, 0, 1, 127],
    "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "UINT8": [0, 1, 255],
    "UINT16": [0, 65535],
    "UINT32": [0, 2**32 - 1],
    "UINT64": [0, 2**63, 2**64 - 1, 2**63 - 1],
    "FP16": [NAN, INF, -INF, -0.0, 2**-24, 65504.0, -65504.0, 6.1e-5, 0.1],
    "FP32": [
        *(NAN, INF, -INF, -0.0, 1e-45, 3.4028234663852886e38, -3.4028234663852886e38, 1.1754943508222875e-38),
        *(0.1, 1e-40, 16777217.0),
    ],
    "FP64": [
        *(NAN, INF, -INF, -0.0, 5e-324, 1.7976931348623157e308, -1.7976931348623157e308, 2.2250738585072014e-308),
        *(0.1, 1e21, 1e-7, 123456789012345680.0, 1e22),
    ],
    "BF16": [NAN, INF, -INF, -0.0, 9.2e-41, 3.3895313892515355e38, 1.0, 0.1],
    "BYTES": [b"", b"a\x00b", b"\xff\xfe", b"ab\x00", "é".encode(), b"\x00", b'"\\'],
}
# Datatypes JSON carries (FP16 and BF16 go as binary data only).
JSON_TYPES = [datatype for datatype in VALUES if datatype not in ("FP16", "BF16")]
# tritonserver 2.51's JSON text of each datatype's values (BYTES: those that are UTF-8).
TRITON_TEXT = {
    "BOOL": "[true,false,true]",
    "INT8": "[-128,-1,0,1,127]",
    "INT16": "[-32768,-1,0,32767]",
    "INT32": "[-2147483648,-1,0,2147483647]",
    "INT64": "[-9223372036854775808,-1,0,9223372036854775807]",
    "UINT8": "[0,1,255]",
    "UINT16": "[0,65535]",
    "UINT32": "[0,4294967295]",
    "UINT64": "[0,9223372036854775808,18446744073709551615,9223372036854775807]",
    "BYTES": '["","a\\u0000b","ab\\u0000","é","\\u0000","\\"\\\\"]',
}
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"]} for request in requests]


def _two(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"A_OUT": request["A"], "B_OUT": request["B"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "two",
        _two,
        inputs=[Tensor(name="A", dtype=np.int32, shape=(-1, -1)), Tensor(name="B", dtype=np.float32, shape=(-1, -1))],
        outputs=[
            Tensor(name="A_OUT", dtype=np.int32, shape=(-1, -1)),
            Tensor(name="B_OUT", dtype=np.float32, shape=(-1, -1)),
        ],
        config=ModelConfig(batching=False),
    )
    for datatype, dtype in NUMPY.items():
        triton.bind(
            f"id_{datatype}",
            _identity,
            inputs=[Tensor(name="IN", dtype=dtype, shape=(-1, -1))],
            outputs=[Tensor(name="OUT", dtype=dtype, shape=(-1, -1))],
            config=ModelConfig(batching=False),
        )


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_bind) as triton:
        yield triton


@pytest.fixture(scope="module")
def stub(server: Triton) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_url(server)) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _raw(datatype: str, values: List[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(value)) + value for value in values)
    return np.array(values, NUMPY[datatype]).tobytes()


def _json_values(datatype: str) -> List[Any]:
    """The datatype's values JSON can carry (BYTES that are UTF-8, as text)."""
    if datatype != "BYTES":
        return VALUES[datatype]
    return [value.decode() for value in VALUES[datatype] if value != b"\xff\xfe"]


def _dumps(document: Any) -> bytes:
    """JSON with NaN and the infinities spelled out (`NaN`, `Infinity`), as tritonclient writes them."""
    return json.dumps(document).encode()


def _post(server: Triton, datatype: str, body: bytes, header_length: Optional[int] = None) -> Tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    status, _, answer = request(server.http_port, "POST", f"/v2/models/id_{datatype}/infer", body, headers)
    return status, answer


def _json_part(answer: bytes) -> Dict[str, Any]:
    return json.loads(answer[: answer.index(b"}]}") + 3]) if b'"binary_data_size"' in answer else json.loads(answer)


def _binary_output(answer: bytes) -> bytes:
    end = answer.index(b"}]}") + 3
    return answer[end:]


def _check_json_output(datatype: str, output: Dict[str, Any], values: List[Any], text: bytes) -> None:
    """An output written as JSON holds `values`: Triton's text for integers, booleans and strings, its doubles else."""
    assert output["datatype"] == datatype
    if datatype in TRITON_TEXT:
        assert b'"data":' + TRITON_TEXT[datatype].encode() in text
    else:  # FP32 as the doubles of its floats, as Triton writes it
        expected = np.array(values, NUMPY[datatype]).astype(np.float64).tobytes()
        assert np.array(output["data"], np.float64).tobytes() == expected


@pytest.mark.parametrize("datatype", JSON_TYPES)
@pytest.mark.parametrize("nested", [False, True])
def test_json_in_json_out(server: Triton, datatype: str, nested: bool) -> None:
    values = _json_values(datatype)
    count = len(values)
    shape = [count, 1] if nested else [1, count]
    data = [[value] for value in values] if nested else values
    status, answer = _post(server, datatype, _dumps({"inputs": [_json_input(datatype, shape, data)]}))
    assert status == 200, answer
    output = json.loads(answer)["outputs"][0]
    assert output["shape"] == shape
    _check_json_output(datatype, output, values, answer)


def _json_input(datatype: str, shape: List[int], data: Any) -> Dict[str, Any]:
    return {"name": "IN", "datatype": datatype, "shape": shape, "data": data}


# How a request asks for its output as binary data: (outputs, request parameters).
BINARY_ASKS = {
    "per_output": ([{"name": "OUT", "parameters": {"binary_data": True}}], None),
    "request_wide": (None, {"binary_data_output": True}),
}


@pytest.mark.parametrize("datatype", JSON_TYPES)
@pytest.mark.parametrize("ask", sorted(BINARY_ASKS))
def test_json_in_binary_out(server: Triton, datatype: str, ask: str) -> None:
    values = _json_values(datatype)
    outputs, parameters = BINARY_ASKS[ask]
    document: Dict[str, Any] = {"inputs": [_json_input(datatype, [1, len(values)], values)]}
    if outputs is not None:
        document["outputs"] = outputs
    if parameters is not None:
        document["parameters"] = parameters
    status, answer = _post(server, datatype, _dumps(document))
    assert status == 200, answer
    output = _json_part(answer)["outputs"][0]
    assert (output["datatype"], output["shape"]) == (datatype, [1, len(values)])
    expected = _raw(datatype, [value.encode() for value in values] if datatype == "BYTES" else values)
    assert _binary_output(answer) == expected
    assert output["parameters"] == {"binary_data_size": len(expected)}


def _binary_request(datatype: str, outputs: Any = None, parameters: Any = None) -> Tuple[bytes, int]:
    payload = _raw(datatype, VALUES[datatype])
    document: Dict[str, Any] = {
        "inputs": [
            {
                "name": "IN",
                "datatype": datatype,
                "shape": [1, len(VALUES[datatype])],
                "parameters": {"binary_data_size": len(payload)},
            }
        ]
    }
    if outputs is not None:
        document["outputs"] = outputs
    if parameters is not None:
        document["parameters"] = parameters
    header = json.dumps(document).encode()
    return header + payload, len(header)


@pytest.mark.parametrize("datatype", list(VALUES))
@pytest.mark.parametrize("ask", sorted(BINARY_ASKS))
def test_binary_in_binary_out_is_bit_exact(server: Triton, datatype: str, ask: str) -> None:
    body, header_length = _binary_request(datatype, *BINARY_ASKS[ask])
    status, answer = _post(server, datatype, body, header_length)
    assert status == 200, answer
    output = _json_part(answer)["outputs"][0]
    assert (output["datatype"], output["shape"]) == (datatype, [1, len(VALUES[datatype])])
    assert _binary_output(answer) == _raw(datatype, VALUES[datatype])


@pytest.mark.parametrize("datatype", JSON_TYPES)
@pytest.mark.parametrize(
    "asks",
    [
        (None, None),
        ([{"name": "OUT"}], None),
        (None, {"binary_data_output": False}),
        ([{"name": "OUT", "parameters": {"binary_data": False}}], {"binary_data_output": True}),
    ],
    ids=["default", "named", "request_wide_false", "overridden"],
)
def test_binary_in_json_out(server: Triton, datatype: str, asks: Any) -> None:
    body, header_length = _binary_request(datatype, *asks)
    status, answer = _post(server, datatype, body, header_length)
    assert status == 200, answer
    output = json.loads(answer)["outputs"][0]
    assert output["shape"] == [1, len(VALUES[datatype])]
    if datatype == "BYTES":  # Triton writes \xff\xfe as they are (no JSON): U+FFFD here (docs/migration.md)
        assert output["data"] == ["", "a\x00b", "\ufffd\ufffd", "ab\x00", "é", "\x00", '"\\']
        assert output["datatype"] == datatype
    else:
        _check_json_output(datatype, output, VALUES[datatype], answer)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp16_and_bf16_outputs_asked_for_as_json_are_refused(server: Triton, datatype: str) -> None:
    body, header_length = _binary_request(datatype)
    status, answer = _post(server, datatype, body, header_length)
    assert (status, json.loads(answer)) == (
        400,
        {"error": f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"},
    )


def _grpc_request(datatype: str, shape: List[int]) -> Any:
    message = service_pb2.ModelInferRequest(model_name=f"id_{datatype}")
    message.inputs.add(name="IN", datatype=datatype, shape=shape)
    return message


@pytest.mark.parametrize("datatype", list(VALUES))
def test_grpc_raw_contents_are_bit_exact(stub: Any, datatype: str) -> None:
    message = _grpc_request(datatype, [1, len(VALUES[datatype])])
    message.raw_input_contents.append(_raw(datatype, VALUES[datatype]))
    response = stub.ModelInfer(message)
    output = response.outputs[0]
    assert (output.datatype, list(output.shape)) == (datatype, [1, len(VALUES[datatype])])
    assert response.raw_output_contents[0] == _raw(datatype, VALUES[datatype])


@pytest.mark.parametrize("datatype", sorted(CONTENTS))
def test_grpc_typed_contents_come_back_as_raw_contents(stub: Any, datatype: str) -> None:
    message = _grpc_request(datatype, [1, len(VALUES[datatype])])
    getattr(message.inputs[0].contents, CONTENTS[datatype]).extend(VALUES[datatype])
    response = stub.ModelInfer(message)
    assert response.outputs[0].datatype == datatype
    assert not response.outputs[0].HasField("contents")  # Triton answers raw contents only
    assert response.raw_output_contents[0] == _raw(datatype, VALUES[datatype])


@pytest.mark.parametrize("datatype", list(VALUES))
@pytest.mark.parametrize("route", ["http", "grpc"])
def test_a_shape_of_no_elements_is_answered_with_one(server: Triton, stub: Any, datatype: str, route: str) -> None:
    """nvidia-pytriton 0.7's proxy failed these (`cannot cast view with zeros in shape`); tritonserver takes them."""
    if route == "grpc":
        message = _grpc_request(datatype, [0, 3])
        message.raw_input_contents.append(b"")
        response = stub.ModelInfer(message)
        assert (response.outputs[0].datatype, list(response.outputs[0].shape)) == (datatype, [0, 3])
        assert response.raw_output_contents[0] == b""
        return
    document = {
        "inputs": [{"name": "IN", "datatype": datatype, "shape": [0, 3], "parameters": {"binary_data_size": 0}}],
        "parameters": {"binary_data_output": True},
    }
    status, answer = _post(server, datatype, json.dumps(document).encode())
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0] == {
        "name": "OUT",
        "datatype": datatype,
        "shape": [0, 3],
        "parameters": {"binary_data_size": 0},
    }


# What tritonserver 2.51 answered (500 there, 400 here): (model datatype, inputs, its error).
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_FRONTEND_FIRST = {
    "too few values": ("INT32", [("IN", "INT32", [1, 3], [1, 2])], _SHAPE_MISMATCH),
    "too many values": ("FP64", [("IN", "FP64", [1, 1], [1.0, 2.0])], _SHAPE_MISMATCH),
    "too few booleans": ("BOOL", [("IN", "BOOL", [1, 2], [True])], _SHAPE_MISMATCH),
    "too few, nested": ("INT32", [("IN", "INT32", [2, 2], [[1, 2], [3]])], _SHAPE_MISMATCH),
    "none for one": ("INT32", [("IN", "INT32", [1, 1], [])], _SHAPE_MISMATCH),
    "count before the datatype": ("INT32", [("IN", "FP32", [1, 2], [1.0])], _SHAPE_MISMATCH),
    "count before the shape": ("INT32", [("IN", "INT32", [3], [1, 2])], _SHAPE_MISMATCH),
    "count before the name": ("INT32", [("XX", "INT32", [1, 2], [1])], _SHAPE_MISMATCH),
    "values before the datatype": (
        "INT32",
        [("IN", "FP32", [1, 1], ["x"])],
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    "booleans before the datatype": (
        "INT32",
        [("IN", "BOOL", [1, 1], [1])],
        "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
    ),
    "strings before the datatype": (
        "INT32",
        [("IN", "BYTES", [1, 1], [1])],
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
    ),
    "no array before the datatype": (
        "INT32",
        [("IN", "FP32", [1, 1], 5)],
        "Unable to parse 'data': attempt to access JSON non-array as array",
    ),
    "values before the shape": (
        "INT32",
        [("IN", "INT32", [3], ["a", "b", "c"])],
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    "values before the name": (
        "INT32",
        [("XX", "INT32", [1, 1], ["a"])],
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    "fp16 before the datatype": (
        "INT32",
        [("IN", "FP16", [1], [1.0])],
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input IN",
    ),
    "bf16 before the name": (
        "INT32",
        [("XX", "BF16", [1, 1], [1])],
        "receiving BF16 data via JSON is not supported. Please use the binary data format for input XX",
    ),
    "bf16 before the datatype": (
        "FP32",
        [("IN", "BF16", [1, 1], [1.0])],
        "receiving BF16 data via JSON is not supported. Please use the binary data format for input IN",
    ),
    "a later input's values before the input count": (
        "INT32",
        [("IN", "FP32", [1, 1], [1.0]), ("IN2", "INT32", [1, 1], ["a"])],
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    "a later input's count before an earlier one's name": (
        "INT32",
        [("XX", "INT32", [1, 1], [1]), ("IN", "INT32", [1, 2], [1])],
        _SHAPE_MISMATCH,
    ),
    "a later input's datatype before the input count": (
        "INT32",
        [("IN", "INT32", [1, 1], [1]), ("IN2", "NOPE", [1, 1], [1])],
        "invalid datatype for input IN2",
    ),
    # The core's checks in the core's order: the datatype before the count of strings, a name given twice first.
    "the datatype before the count of strings": (
        "INT32",
        [("IN", "BYTES", [1, 2], ["a"])],
        "[request id: <id_unknown>] inference input 'IN' data-type is 'BYTES', but model 'id_INT32' expects 'INT32'",
    ),
    "a name given twice before the second's values": (
        "INT32",
        [("IN", "INT32", [1, 1], [1]), ("IN", "INT32", [1, 1], ["a"])],
        "[request id: <id_unknown>] input 'IN' already exists in request",
    ),
    # A shape of no dimensions holds no elements to Triton's frontend: it reads no data, the core refuses the shape.
    "an fp16 scalar's shape before its data": (
        "FP16",
        [("IN", "FP16", [], [1.0])],
        "[request id: <id_unknown>] unexpected shape for input 'IN' for model 'id_FP16'. Expected [-1,-1], got []. ",
    ),
    "a scalar's shape before its values": (
        "INT32",
        [("IN", "INT32", [], ["a"])],
        "[request id: <id_unknown>] unexpected shape for input 'IN' for model 'id_INT32'. Expected [-1,-1], got []. ",
    ),
    # Past int64 and within uint64 Triton wraps around; refused here in this server's words (docs/migration.md).
    "2**63 for uint16": (
        "UINT16",
        [("IN", "UINT16", [1, 2], [2**63, 0])],
        "unable to parse 'data' of input 'IN' as UINT16: values outside the range of uint16",
    ),
}


@pytest.mark.parametrize("case", sorted(_FRONTEND_FIRST))
def test_json_data_is_refused_as_tritons_frontend_refuses_it_before_the_models_checks(
    server: Triton, case: str
) -> None:
    model_datatype, inputs, error = _FRONTEND_FIRST[case]
    document = {"inputs": [{"name": n, "datatype": d, "shape": s, "data": v} for n, d, s, v in inputs]}
    status, answer = _post(server, model_datatype, json.dumps(document).encode())
    assert (status, json.loads(answer)) == (400, {"error": error})


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT32", [1]), ("INT32", ["x"]), ("INT32", 5), ("INT32", [[1, 2]]), ("FP16", [1.0]), ("BYTES", [1])],
)
def test_json_data_of_a_shape_of_no_elements_is_not_read(server: Triton, datatype: str, data: Any) -> None:
    """tritonserver 2.51 reads no data for a tensor of no elements, whatever `data` holds, and runs the model."""
    document = {
        "inputs": [{"name": "IN", "datatype": datatype, "shape": [0, 2], "data": data}],
        "parameters": {"binary_data_output": True},
    }
    status, answer = _post(server, datatype, json.dumps(document).encode())
    assert status == 200, answer
    output = json.loads(answer)["outputs"][0]
    assert (output["datatype"], output["shape"], output["parameters"]) == (datatype, [0, 2], {"binary_data_size": 0})


@pytest.mark.parametrize("shape", [[0, 10**14], [0, 2**63], [2**64 - 1, 0]])
def test_a_shape_of_no_elements_past_the_limits_is_refused_for_its_dimensions(server: Triton, shape: List[int]) -> None:
    """Its data unread, as Triton reads none, the shape is still refused for a dimension past this server's limit."""
    document = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": shape, "data": []}]}
    status, answer = _post(server, "INT32", json.dumps(document).encode())
    assert status == 400
    assert "elements (or dimension) a tensor may have on this server" in json.loads(answer)["error"]


_I32, _F32 = bytes.fromhex("0100000002000000"), bytes.fromhex("0000803f00000040")


def _a(**fields: Any) -> Dict[str, Any]:
    return {"name": "A", "datatype": "INT32", "shape": [1, 2], **fields}


def _b(**fields: Any) -> Dict[str, Any]:
    return {"name": "B", "datatype": "FP32", "shape": [1, 2], **fields}


_TWO_SOURCES = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
    "'shared_memory_region' in 'parameters'. But "
)
# (request document, binary data after it, tritonserver 2.51's answer: its status here, its words).
_FAULTS_IN_TRITONS_ORDER: Dict[str, Tuple[Dict[str, Any], bytes, str]] = {
    "body short of a binary input before its datatype": (
        {"inputs": [_a(datatype="FP32", parameters={"binary_data_size": 16}), _b(data=[1, 2])]},
        _I32,
        "unexpected size for input 'A', expecting 8 additional bytes for model 'two'",
    ),
    "bytes after the last input before a datatype": (
        {"inputs": [_a(datatype="FP32", parameters={"binary_data_size": 4}), _b(data=[1, 2])]},
        _I32,
        "unexpected additional input data for model 'two'",
    ),
    "two sources before the datatype": (
        {"inputs": [_a(datatype="FP32", data=[1, 2], parameters={"binary_data_size": 8}), _b(data=[1, 2])]},
        _I32,
        _TWO_SOURCES + "set 'data' 'binary_data_size'",
    ),
    "no source before the datatype": (
        {"inputs": [_a(datatype="FP32"), _b(data=[1, 2])]},
        b"",
        _TWO_SOURCES + "no field is set",
    ),
    "an output's binary_data before an input's datatype": (
        {
            "inputs": [_a(datatype="FP32", data=[1, 2]), _b(data=[1, 2])],
            "outputs": [{"name": "A_OUT", "parameters": {"binary_data": "yes"}}],
        },
        b"",
        "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
    ),
    "an unknown output before an input's datatype": (
        {"inputs": [_a(datatype="FP32", data=[1, 2]), _b(data=[1, 2])], "outputs": [{"name": "NOPE"}]},
        b"",
        "unexpected inference output 'NOPE' for model 'two'",
    ),
    "an unknown output before a missing input": (
        {"inputs": [_a(data=[1, 2])], "outputs": [{"name": "NOPE"}]},
        b"",
        "unexpected inference output 'NOPE' for model 'two'",
    ),
    "data before an unknown output": (
        {"inputs": [_a(data=["x", 2]), _b(data=[1, 2])], "outputs": [{"name": "NOPE"}]},
        b"",
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    "the id before the data": (
        {"id": 5, "inputs": [_a(data=["x", 2]), _b(data=[1, 2])]},
        b"",
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    "the id before the parameters": (
        {"id": 5, "parameters": 5, "inputs": []},
        b"",
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    "the id before the inputs": ({"id": 5}, b"", "Unable to parse 'id': attempt to access JSON non-string as string"),
    "a name given twice after a refused input": (
        {"inputs": [_a(datatype="FP32", data=[1, 2]), _a(data=[1, 2])]},
        b"",
        "[request id: <id_unknown>] input 'A' already exists in request",
    ),
    "a name given twice after another refused input": (
        {"inputs": [_b(datatype="INT32", data=[1, 2]), _a(data=[1, 2]), _a(data=[1, 2])]},
        b"",
        "[request id: <id_unknown>] input 'A' already exists in request",
    ),
    "a later input's datatype before an earlier one's byte size": (
        {"inputs": [_a(parameters={"binary_data_size": 4}), _b(datatype="INT32", data=[1, 2])]},
        _I32[:4],
        "[request id: <id_unknown>] inference input 'B' data-type is 'INT32', but model 'two' expects 'FP32'",
    ),
    "a later input's byte size before an earlier one's datatype": (
        {"inputs": [_a(datatype="FP32", data=[1.0, 2.0]), _b(parameters={"binary_data_size": 4})]},
        _F32[:4],
        "[request id: <id_unknown>] input byte size mismatch for input 'B' for model 'two'. Expected 8, got 4",
    ),
}


@pytest.mark.parametrize("case", sorted(_FAULTS_IN_TRITONS_ORDER))
@pytest.mark.parametrize("again", [False, True], ids=["first", "header_seen_before"])
def test_of_several_faults_the_one_triton_finds_first(server: Triton, case: str, again: bool) -> None:
    document, binary, error = _FAULTS_IN_TRITONS_ORDER[case]
    header = json.dumps(document).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    answers = []
    for _ in range(3 if again else 1):  # a header seen twice is kept (its plan): the third is decoded by it
        status, _, answer = request(server.http_port, "POST", "/v2/models/two/infer", header + binary, headers)
        answers.append((status, json.loads(answer)))
    assert answers[-1] == (400, {"error": error})


@pytest.mark.parametrize(
    ("shapes", "raw", "error"),
    [
        (
            [("A", "INT32"), ("B", "INT32")],
            [bytes(4), bytes(8)],
            "inference input 'B' data-type is 'INT32', but model 'two' expects 'FP32'",
        ),
        (
            [("A", "FP32"), ("B", "FP32")],
            [bytes(8), bytes(4)],
            "input byte size mismatch for input 'B' for model 'two'. Expected 8, got 4",
        ),
        (
            [("A", "FP32"), ("A", "INT32")],
            [bytes(8), bytes(8)],
            "input 'A' already exists in request",
        ),
        (
            [("B", "INT32"), ("A", "INT32"), ("A", "INT32")],
            [bytes(8)] * 3,
            "input 'A' already exists in request",
        ),
    ],
    ids=["later_datatype_before_byte_size", "later_byte_size_before_datatype", "twice_after_a_refusal", "twice_later"],
)
def test_grpc_inputs_are_checked_the_last_first_with_their_byte_sizes(
    stub: Any, shapes: List[Tuple[str, str]], raw: List[bytes], error: str
) -> None:
    message = service_pb2.ModelInferRequest(model_name="two")
    for name, datatype in shapes:
        message.inputs.add(name=name, datatype=datatype, shape=[1, 2])
    message.raw_input_contents.extend(raw)
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(message)
    assert (raised.value.code(), raised.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"[request id: <id_unknown>] {error}",
    )
