"""gRPC messages tritonclient never sends: typed contents, malformed requests, raw stub calls."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, grpc_url, running_triton

# datatype -> (Tensor dtype, InferTensorContents field, values)
TYPED: Dict[str, Any] = {
    "BOOL": (np.bool_, "bool_contents", [True, False]),
    "INT8": (np.int8, "int_contents", [-128, 127]),
    "INT16": (np.int16, "int_contents", [-32768, 32767]),
    "INT32": (np.int32, "int_contents", [-(2**31), 2**31 - 1]),
    "INT64": (np.int64, "int64_contents", [-(2**63), 2**63 - 1]),
    "UINT8": (np.uint8, "uint_contents", [0, 255]),
    "UINT16": (np.uint16, "uint_contents", [0, 65535]),
    "UINT32": (np.uint32, "uint_contents", [0, 2**32 - 1]),
    "UINT64": (np.uint64, "uint64_contents", [0, 2**64 - 1]),
    "FP32": (np.float32, "fp32_contents", [-1.5, 2.25]),
    "FP64": (np.float64, "fp64_contents", [-1.0e300, 0.1]),
    "BYTES": (bytes, "bytes_contents", [b"x\x00", b"\x00\x00"]),
}
UNTYPED = {"FP16": np.float16, "BF16": "bfloat16"}


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"]} for request in requests]


def bind_models(triton: Triton) -> None:
    for datatype, dtype in [*((name, spec[0]) for name, spec in TYPED.items()), *UNTYPED.items()]:
        triton.bind(
            f"identity_{datatype}",
            _identity,
            inputs=[Tensor(name="IN", dtype=dtype, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=dtype, shape=(-1,))],
            config=ModelConfig(batching=False),
        )


@pytest.fixture(scope="module")
def stub() -> Iterator[Any]:
    with running_triton(bind_models) as triton, grpc.insecure_channel(grpc_url(triton)) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request(datatype: str, count: int = 2) -> Any:
    request = service_pb2.ModelInferRequest(model_name=f"identity_{datatype}", id="typed")
    request.inputs.add(name="IN", datatype=datatype, shape=[count])
    return request


def _output(response: Any, datatype: str) -> List[Any]:
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        items, offset = [], 0
        while offset < len(raw):
            size = int.from_bytes(raw[offset : offset + 4], "little")
            items.append(raw[offset + 4 : offset + 4 + size])
            offset += 4 + size
        return items
    return np.frombuffer(raw, dtype=TYPED[datatype][0]).tolist()


def _invalid(stub: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return str(raised.value.details())


@pytest.mark.parametrize("datatype", list(TYPED))
def test_typed_contents_are_answered_with_raw_outputs(stub: Any, datatype: str) -> None:
    _, field, values = TYPED[datatype]
    request = _request(datatype)
    getattr(request.inputs[0].contents, field).extend(values)
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    assert [(output.name, output.datatype, list(output.shape)) for output in response.outputs] == [
        ("OUT", datatype, [2])
    ]
    assert not response.outputs[0].HasField("contents")
    assert _output(response, datatype) == values


@pytest.mark.parametrize("datatype", list(UNTYPED))
def test_typed_contents_cannot_carry_fp16_or_bf16(stub: Any, datatype: str) -> None:
    request = _request(datatype)
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    # Triton's words (nvidia-pytriton 0.7): no contents field is FP16's or BF16's, so the one set is the wrong one
    assert _invalid(stub, request) == (
        f"unexpected explicit tensor data for input tensor 'IN' for model 'identity_{datatype}' of type 'FP32', "
        f"expected datatype '{datatype}'"
    )


def test_raw_and_typed_contents_together_are_refused(stub: Any) -> None:
    request = _request("INT32")
    request.inputs[0].contents.int_contents.extend([1, 2])
    request.raw_input_contents.append(np.array([1, 2], np.int32).tobytes())
    assert "contents field must not be specified when using raw_input_contents" in _invalid(stub, request)


def test_typed_contents_of_the_wrong_size_are_refused(stub: Any) -> None:
    request = _request("INT32", count=3)
    request.inputs[0].contents.int_contents.extend([1, 2])
    assert _invalid(stub, request) == (
        "[request id: typed] input byte size mismatch for input 'IN' for model 'identity_INT32'. Expected 12, got 8"
    )


@pytest.mark.parametrize(
    ("datatype", "field", "named"), [("FP32", "int_contents", "INT32"), ("INT8", "fp64_contents", "FP64")]
)
def test_typed_contents_in_another_datatypes_field_are_refused_in_tritons_words(
    stub: Any, datatype: str, field: str, named: str
) -> None:
    request = _request(datatype)
    getattr(request.inputs[0].contents, field).extend([1, 2])
    assert _invalid(stub, request) == (  # as nvidia-pytriton 0.7 answers (it was a byte size mismatch here)
        f"unexpected explicit tensor data for input tensor 'IN' for model 'identity_{datatype}' of type '{named}', "
        f"expected datatype '{datatype}'"
    )


def test_raw_contents_of_the_wrong_size_are_refused(stub: Any) -> None:
    request = _request("INT32")
    request.raw_input_contents.append(b"\x00" * 7)
    assert _invalid(stub, request) == (
        "[request id: typed] input byte size mismatch for input 'IN' for model 'identity_INT32'. Expected 8, got 7"
    )


def test_raw_contents_past_the_inputs_are_ignored(stub: Any) -> None:
    request = _request("INT32")
    request.raw_input_contents.extend([b"\x00" * 8, b"\x00" * 8])
    response = stub.ModelInfer(request)  # as Triton: the contents past the inputs' are ignored
    assert _output(response, "INT32") == [0, 0]


def test_input_without_data_is_refused(stub: Any) -> None:
    expected = "unable to find data for input tensor 'IN' for model 'identity_INT32' in request."
    assert _invalid(stub, _request("INT32")) == expected


def test_unknown_datatype_is_refused(stub: Any) -> None:
    request = _request("INT32")
    request.inputs[0].datatype = "COMPLEX64"
    request.raw_input_contents.append(b"\x00" * 8)
    # Triton's words (nvidia-pytriton 0.7): a datatype it does not know is '<invalid>', which no input has
    assert _invalid(stub, request) == (
        "[request id: typed] inference input 'IN' data-type is '<invalid>', but model 'identity_INT32' expects 'INT32'"
    )


@pytest.mark.parametrize("valued", [True, False], ids=["with a value", "without a value"])
def test_reserved_parameter_prefix_is_refused(stub: Any, valued: bool) -> None:
    # Without a value: refused for its name, as tritonserver 2.51 does (probed), not as a parameter with no value.
    request = _request("INT32")
    request.raw_input_contents.append(b"\x00" * 8)
    parameter = request.parameters["triton_secret"]
    if valued:
        parameter.bool_param = True
    assert _invalid(stub, request) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
        "with 'triton_' are allowed: triton_enable_empty_final_response"
    )


_TYPE_REFUSALS = {
    "sequence_id": "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
    "sequence_start": "invalid value type for 'sequence_start' parameter, expected bool_param.",
    "sequence_end": "invalid value type for 'sequence_end' parameter, expected bool_param.",
    "priority": "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    "timeout": "invalid value type for 'timeout' parameter, expected int64_param.",
}


@pytest.mark.parametrize(
    ("key", "kind", "value", "refusal"),
    [
        ("sequence_id", "bool_param", True, _TYPE_REFUSALS["sequence_id"]),
        ("sequence_id", "uint64_param", 7, _TYPE_REFUSALS["sequence_id"]),
        ("sequence_start", "int64_param", 1, _TYPE_REFUSALS["sequence_start"]),
        ("sequence_end", "string_param", "x", _TYPE_REFUSALS["sequence_end"]),
        ("priority", "string_param", "x", _TYPE_REFUSALS["priority"]),
        ("priority", "double_param", 1.0, _TYPE_REFUSALS["priority"]),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        ("timeout", "uint64_param", 5_000_000, _TYPE_REFUSALS["timeout"]),
        ("timeout", "string_param", "x", _TYPE_REFUSALS["timeout"]),
        ("priority", "uint64_param", 3, None),
        ("timeout", "int64_param", -5, None),  # taken as unsigned by Triton: no timeout to speak of
        ("sequence_id", "string_param", "abc", None),
        ("binary_data_output", "int64_param", 1, None),  # an HTTP parameter: nothing reserved over gRPC
    ],
)
def test_reserved_parameters_of_the_wrong_kind_are_refused_in_tritons_words(
    stub: Any, key: str, kind: str, value: Any, refusal: Any
) -> None:
    request = _request("INT32")
    request.raw_input_contents.append(np.array([5, 6], np.int32).tobytes())
    setattr(request.parameters[key], kind, value)
    if refusal is None:
        assert _output(stub.ModelInfer(request), "INT32") == [5, 6]
    else:
        assert _invalid(stub, request) == refusal  # as nvidia-pytriton 0.7 answers


def test_shared_memory_inputs_are_refused(stub: Any) -> None:
    request = _request("INT32")
    request.inputs[0].parameters["shared_memory_region"].string_param = "region"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 8
    with pytest.raises(grpc.RpcError) as raised:  # no region of that name is registered
        stub.ModelInfer(request)
    assert (raised.value.code(), raised.value.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Unable to find shared memory region: 'region'",
    )


def test_duplicate_inputs_are_refused(stub: Any) -> None:
    request = _request("INT32")
    request.inputs.add(name="IN", datatype="INT32", shape=[2])
    request.raw_input_contents.extend([b"\x00" * 8, b"\x00" * 8])
    assert _invalid(stub, request) == "[request id: typed] input 'IN' already exists in request"


def test_raw_stub_health_and_index(stub: Any) -> None:
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live is True
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="identity_INT8")).ready is True
    index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), metadata=tuple(GRPC_AUTH.items()))
    assert len(index.models) == len(TYPED) + len(UNTYPED)


def test_a_version_that_is_no_number_is_invalid_as_in_triton(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="identity_INT32", version="x"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == (
        "failed to get model version from specified version string 'x' (details: stol), version should be an "
        "integral value > 0"
    )


_NO_NUMBER = (
    "failed to get model version from specified version string 'x' (details: stol), version should be an "
    "integral value > 0"
)


@pytest.mark.parametrize(
    ("method", "message", "refusal"),
    [
        ("ModelReady", service_pb2.ModelReadyRequest(name="identity_INT32", version="x"), _NO_NUMBER),
        ("ModelReady", service_pb2.ModelReadyRequest(name="nope", version="x"), _NO_NUMBER),  # the version first
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="nope", version="x"), _NO_NUMBER),
        (
            "ModelReady",
            service_pb2.ModelReadyRequest(name="identity_INT32", version="-1"),
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
    ],
    ids=["ready", "ready of an unknown model", "metadata of an unknown model", "negative"],
)
def test_a_version_is_parsed_before_the_model_is_looked_up_as_in_triton(
    stub: Any, method: str, message: Any, refusal: str
) -> None:
    # ModelReady answered ready: false for these (nvidia-pytriton 0.7: INVALID_ARGUMENT).
    with pytest.raises(grpc.RpcError) as raised:
        getattr(stub, method)(message)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


@pytest.mark.parametrize(
    ("version", "refusal"),
    [("x", _NO_NUMBER), ("-1", "invalid model version specified '-1' , version should be an integral value > 0")],
    ids=["no number", "negative"],
)
def test_statistics_of_every_model_parse_the_version_as_in_triton(stub: Any, version: str, refusal: str) -> None:
    # Without a name, the statistics of every model were answered whatever the version (tritonserver 2.51, probed
    # through nvidia-pytriton 0.7: INVALID_ARGUMENT; a version that is a number is ignored there, as here).
    auth = tuple(GRPC_AUTH.items())
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(version=version), metadata=auth)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)
    every = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(version="7"), metadata=auth)
    assert len(every.model_stats) == len(TYPED) + len(UNTYPED)


def test_an_unknown_model_or_version_is_not_ready(stub: Any) -> None:
    assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="nope")).ready
    assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="identity_INT32", version="7")).ready
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="identity_INT32", version="1")).ready


@pytest.mark.parametrize("version", ["1.0", "1abc", "1_0", " 1", "+01", "\t1 "])
def test_a_version_is_read_as_stol_reads_it_as_in_triton(stub: Any, version: str) -> None:
    # std::stol reads a leading number and ignores the rest: tritonserver 2.51 serves version 1 for "1.0" and
    # "1abc" (probed); this server refused them, and read "1_0" as 10 (Python's int).
    request = service_pb2.ModelMetadataRequest(name="identity_INT32", version=version)
    assert stub.ModelMetadata(request).versions == ["1"]


@pytest.mark.parametrize(
    ("version", "refusal"),
    [
        ("0x1", "Request for unknown model: 'identity_INT32' version 0 is not found"),
        ("-0", "Request for unknown model: 'identity_INT32' version 0 is not found"),
        ("\u0661", _NO_NUMBER.replace("'x'", "'\u0661'")),  # an Arabic-Indic one: a digit to Python, not to stol
    ],
    ids=["hexadecimal", "minus zero", "a digit not ASCII"],
)
def test_a_version_stol_reads_differently_from_python_is_refused_as_in_triton(
    stub: Any, version: str, refusal: str
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelConfig(service_pb2.ModelConfigRequest(name="identity_INT32", version=version))
    assert raised.value.details() == refusal


def test_an_output_requested_twice_comes_once(stub: Any) -> None:
    request = _request("INT32")
    request.raw_input_contents.append(np.array([1, 2], np.int32).tobytes())
    request.outputs.add(name="OUT")
    request.outputs.add(name="OUT")
    response = stub.ModelInfer(request)
    assert [output.name for output in response.outputs] == ["OUT"] and _output(response, "INT32") == [1, 2]


def test_classification_of_a_model_without_batching_covers_the_whole_tensor(stub: Any) -> None:
    request = _request("INT32", count=4)
    request.raw_input_contents.append(np.array([5, -1, 9, 5], np.int32).tobytes())
    output = request.outputs.add(name="OUT")
    output.parameters["classification"].int64_param = 3
    response = stub.ModelInfer(request)
    assert response.outputs[0].datatype == "BYTES" and list(response.outputs[0].shape) == [3]
    assert _output(response, "BYTES") == [b"9:2", b"5:0", b"5:3"]  # ties by position


def test_a_message_of_headers_alone_is_parsed_once_for_all_requests_of_its_bytes() -> None:
    """A shared-memory request's message (no tensor data in it) comes again and again: once the codec kept a plan
    of it, the same bytes get the same parsed message. One carrying data, raw or typed, is parsed each time."""
    from pytriton.core.errors import InferenceError
    from pytriton.core.spec import ModelSpec, TensorDef
    from pytriton.protocol import grpc_codec
    from pytriton.transport.grpc.wire import parse_infer_request

    spec = ModelSpec(
        name="m",
        version=1,
        inputs=(TensorDef("IN", "INT32", (-1,)),),
        outputs=(TensorDef("OUT", "INT32", (-1,)),),
        max_batch_size=0,
        batcher=None,
        decoupled=False,
        response_cache=False,
        instance_count=1,
        strict=False,
    )

    def decode(frame: Any) -> None:
        try:  # no registry of regions here: refused, after the plan of the message was kept
            grpc_codec.decode_infer_request(spec, frame.message, frame.raw_inputs, None, None, frame.data)
        except InferenceError:
            pass

    headers_alone = service_pb2.ModelInferRequest(model_name="m", id="headers-alone")
    tensor = headers_alone.inputs.add(name="IN", datatype="INT32", shape=[16])
    tensor.parameters["shared_memory_region"].string_param = "in"
    tensor.parameters["shared_memory_byte_size"].int64_param = 64
    data = headers_alone.SerializeToString()
    first = parse_infer_request(data)
    decode(first)
    again = parse_infer_request(bytes(bytearray(data)))  # the same bytes, another object, as a new request's
    assert again.message is first.message and again.data == data
    assert again.message == headers_alone

    with_raw = service_pb2.ModelInferRequest(model_name="m", id="raw", raw_input_contents=[b"\0" * 64])
    with_raw.inputs.add(name="IN", datatype="INT32", shape=[16])
    with_typed = service_pb2.ModelInferRequest(model_name="m", id="typed")
    with_typed.inputs.add(name="IN", datatype="INT32", shape=[1]).contents.int_contents.append(7)
    for message in (with_raw, with_typed):
        data = message.SerializeToString()
        first = parse_infer_request(data)
        decode(first)
        again = parse_infer_request(data)
        assert again.message is not first.message and again.message == message
