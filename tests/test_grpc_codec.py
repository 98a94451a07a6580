"""Unit tests of the gRPC codec, the zero-copy wire (de)serializers and the RPC table."""

from __future__ import annotations

import inspect
from typing import Any, List, Tuple

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceResponse, OutputTensor
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.protocol import grpc_codec
from pytriton.transport.grpc import handlers, wire
from pytriton.transport.grpc.servicer import InferenceServicer

SPEC = ModelSpec(
    name="m",
    version=3,
    inputs=(TensorDef("A", "FP32", (-1,)), TensorDef("B", "BYTES", (-1,))),
    outputs=(TensorDef("X", "FP32", (-1,)), TensorDef("Y", "BYTES", (-1,))),
    max_batch_size=0,
    batcher=None,
    decoupled=False,
    response_cache=False,
    instance_count=1,
    strict=False,
)
BIG = wire.SCAN_THRESHOLD_BYTES  # elements: 4x the threshold in bytes


def _request(count: int) -> Any:
    request = service_pb2.ModelInferRequest(model_name="m", model_version="3", id="req")
    request.inputs.add(name="A", datatype="FP32", shape=[count])
    request.inputs.add(name="B", datatype="BYTES", shape=[2])
    request.outputs.add(name="Y")
    request.parameters["user"].string_param = "u"
    request.raw_input_contents.append(np.arange(count, dtype=np.float32).tobytes())
    request.raw_input_contents.append(b"\x02\x00\x00\x00a\x00\x00\x00\x00\x00")
    return request


def _response() -> InferenceResponse:
    strings = np.array([b"x\x00", b""], dtype=np.object_)
    return InferenceResponse(
        [OutputTensor("X", "FP32", np.arange(BIG, dtype=np.float32)), OutputTensor("Y", "BYTES", strings)]
    )


@pytest.mark.parametrize("count", [4, BIG])
def test_parse_infer_request_matches_protobuf(count: int) -> None:
    request = _request(count)
    data = request.SerializeToString()
    frame = wire.parse_infer_request(data)
    if count == BIG:
        assert frame.raw_inputs is not None and len(frame.raw_inputs) == 2
        assert len(frame.message.raw_input_contents) == 0
        assert [bytes(raw) for raw in frame.raw_inputs] == list(request.raw_input_contents)
        rebuilt = service_pb2.ModelInferRequest()
        rebuilt.CopyFrom(frame.message)
        rebuilt.raw_input_contents.extend(bytes(raw) for raw in frame.raw_inputs)
        assert rebuilt == request
    else:
        assert frame.raw_inputs is None
        assert frame.message == request


def test_large_raw_inputs_are_not_copied() -> None:
    # The server reads a large message into a writable buffer of its own, and its inputs are views of it; a
    # read-only one (protobuf's bytes) is copied, as callables get their inputs writable.
    data = bytearray(_request(BIG).SerializeToString())
    frame = wire.parse_infer_request(data)
    decoded = grpc_codec.decode_infer_request(SPEC, frame.message, frame.raw_inputs)
    array = decoded.request.inputs["A"]
    assert np.shares_memory(array, np.frombuffer(data, dtype=np.uint8)) and array.flags.writeable
    read_only = bytes(data)
    frame = wire.parse_infer_request(read_only)
    copied = grpc_codec.decode_infer_request(SPEC, frame.message, frame.raw_inputs).request.inputs["A"]
    assert copied.flags.writeable and not np.shares_memory(copied, np.frombuffer(read_only, dtype=np.uint8))
    np.testing.assert_array_equal(array, np.arange(BIG, dtype=np.float32))
    assert decoded.request.inputs["B"].tolist() == [b"a\x00", b""]
    assert decoded.request.parameters == {"user": "u"}
    assert decoded.request.requested_outputs == ["Y"]
    assert decoded.request.id == "req"


def test_unknown_fields_survive_the_scan() -> None:
    data = _request(BIG).SerializeToString() + b"\xf8\x07\x05"  # field 127, varint 5: unknown to the schema
    frame = wire.parse_infer_request(data)
    assert frame.message.model_name == "m"
    assert frame.message.SerializeToString().endswith(b"\xf8\x07\x05")


@pytest.mark.parametrize("cut", [1, 9])
def test_truncated_large_request_is_a_decode_error(cut: int) -> None:
    data = _request(BIG).SerializeToString()
    with pytest.raises(DecodeError):
        wire.parse_infer_request(data[:-cut])


def test_a_group_is_answered_as_protobuf_answers_it_whatever_the_size() -> None:
    for data in (_request(4).SerializeToString(), _request(BIG).SerializeToString()):
        grouped = data + b"\xfb\x07\x08\x01\xfc\x07"  # unknown field 127 as a group holding a varint
        assert wire.parse_infer_request(grouped).message == service_pb2.ModelInferRequest.FromString(grouped)
    with pytest.raises(DecodeError):
        wire.parse_infer_request(b"\x0b" + b"\x00" * wire.SCAN_THRESHOLD_BYTES)  # a group never ended


def test_field_number_zero_and_overlong_varints_are_decode_errors_at_once() -> None:
    # Zeros read as two-byte fields numbered 0: a view each made a 16 MiB message take 1.6 GiB before protobuf
    # refused it.
    with pytest.raises(DecodeError, match="field number 0"):
        wire.parse_infer_request(bytes(16 * 2**20))
    with pytest.raises(DecodeError, match="varint"):
        wire.parse_infer_request(b"\x80" * wire.SCAN_THRESHOLD_BYTES)


def test_fields_between_raw_inputs_go_to_protobuf_as_one_slice() -> None:
    request = _request(BIG)
    request.ClearField("id")
    data = request.SerializeToString() + b"\x1a\x00" * 100_000  # 100,000 empty ids (field 3) after the inputs
    frame = wire.parse_infer_request(data)
    assert frame.raw_inputs is None  # more fields than a scan is worth: protobuf parses the whole message
    assert frame.message.id == "" and len(frame.message.raw_input_contents) == 2
    few = request.SerializeToString() + b"\x1a\x01x" * 1000
    frame = wire.parse_infer_request(few)
    assert frame.raw_inputs is not None and len(frame.raw_inputs) == 2 and frame.message.id == "x"


def test_raw_contents_past_the_inputs_are_ignored_and_missing_ones_refused() -> None:
    request = _request(4)
    request.raw_input_contents.extend([b"extra"] * 1000)  # as Triton: ignored
    decoded = grpc_codec.decode_infer_request(SPEC, request)
    assert decoded.request.inputs["A"].tolist() == [0.0, 1.0, 2.0, 3.0]
    del request.raw_input_contents[1:]
    with pytest.raises(InferenceError, match=r"unable to find data for input tensor 'B' for model 'm' in request\."):
        grpc_codec.decode_infer_request(SPEC, request)


def _joined(parts: Tuple[List[Any], int]) -> bytes:
    pieces, size = parts
    data = b"".join(pieces)
    assert len(data) == size
    return data


def test_serialized_response_is_the_protobuf_message() -> None:
    encoded = grpc_codec.encode_infer_response(SPEC, "req", _response())
    assert isinstance(encoded.raw_outputs[0], memoryview)  # the output array itself, not a copy
    parsed = service_pb2.ModelInferResponse.FromString(_joined(wire.infer_response_parts(encoded)))
    assert parsed == encoded.to_message()
    assert (parsed.model_name, parsed.model_version, parsed.id) == ("m", "3", "req")
    assert [(o.name, o.datatype, list(o.shape)) for o in parsed.outputs] == [("X", "FP32", [BIG]), ("Y", "BYTES", [2])]
    np.testing.assert_array_equal(np.frombuffer(parsed.raw_output_contents[0], np.float32), np.arange(BIG))
    assert parsed.raw_output_contents[1] == b"\x02\x00\x00\x00x\x00\x00\x00\x00\x00"
    assert "triton_final_response" not in parsed.parameters


def test_serialized_stream_responses() -> None:
    encoded = grpc_codec.encode_infer_response(SPEC, "req", _response(), final=False)
    parsed = service_pb2.ModelStreamInferResponse.FromString(_joined(wire.stream_response_parts(encoded)))
    assert parsed.error_message == ""
    assert parsed.infer_response == encoded.to_message()
    assert parsed.infer_response.parameters["triton_final_response"].bool_param is False
    final = service_pb2.ModelStreamInferResponse.FromString(
        _joined(wire.stream_response_parts(grpc_codec.empty_final_response(SPEC, "req")))
    )
    assert final.infer_response.parameters["triton_final_response"].bool_param is True
    assert len(final.infer_response.outputs) == 0
    error = grpc_codec.stream_error("req", "it broke", SPEC)
    assert service_pb2.ModelStreamInferResponse.FromString(_joined(wire.stream_response_parts(error))) == error


def test_zero_size_output_is_an_empty_raw_content() -> None:
    empty = InferenceResponse([OutputTensor("X", "FP32", np.zeros(0, np.float32))])
    encoded = grpc_codec.encode_infer_response(SPEC, "", empty)
    parsed = service_pb2.ModelInferResponse.FromString(_joined(wire.infer_response_parts(encoded)))
    assert list(parsed.raw_output_contents) == [b""]
    assert list(parsed.outputs[0].shape) == [0]


@pytest.mark.parametrize(
    ("parameter", "expected"),
    [
        (service_pb2.InferParameter(bool_param=True), True),
        (service_pb2.InferParameter(int64_param=-3), -3),
        (service_pb2.InferParameter(uint64_param=2**64 - 1), 2**64 - 1),
        (service_pb2.InferParameter(double_param=0.5), 0.5),
        (service_pb2.InferParameter(string_param="s"), "s"),
    ],
)
def test_parameter_values(parameter: Any, expected: Any) -> None:
    request = service_pb2.ModelInferRequest()
    request.parameters["key"].CopyFrom(parameter)
    assert grpc_codec.parameters_from_message(request.parameters) == {"key": expected}


def test_parameter_without_value_is_refused() -> None:
    request = service_pb2.ModelInferRequest()
    request.parameters["key"].SetInParent()
    with pytest.raises(InferenceError, match="parameter 'key' has no value"):
        grpc_codec.parameters_from_message(request.parameters)


_R, _S, _O = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"


@pytest.mark.parametrize(
    "values",
    [
        {_R: ("string_param", "r"), _S: ("int64_param", 16)},
        {_R: ("string_param", "r"), _S: ("uint64_param", 16), _O: ("int64_param", 32)},
        {_R: ("string_param", "r"), _S: ("int64_param", 16), _O: ("uint64_param", 2**64 - 1)},
        {_R: ("string_param", "r"), _S: ("int64_param", -1)},
        {_R: ("string_param", "r"), _S: ("int64_param", 16), _O: ("int64_param", -8)},
        {_R: ("string_param", "r"), _S: ("string_param", "16")},
        {_R: ("string_param", "r"), _S: ("bool_param", True)},
        {_R: ("string_param", ""), _S: ("int64_param", 16)},
        {_R: ("int64_param", 3), _S: ("int64_param", 16)},
        {_R: ("string_param", "r"), _S: ("int64_param", 16), "other": ("bool_param", True)},
        {_R: ("string_param", "r"), _S: ("int64_param", 16), _O: None},
        {_R: ("string_param", "r"), _S: None},
        {_R: ("string_param", "r")},
        {_S: ("int64_param", 16), _O: ("int64_param", 0)},
    ],
)
def test_a_tensors_region_read_straight_from_its_parameters_is_what_the_plain_values_say(values: Any) -> None:
    """The shortcut for what clients send (_plain_region) answers as the generic reading of the values does."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x")
    for key, value in values.items():
        if value is None:
            tensor.parameters[key].SetInParent()  # a parameter without a value
        else:
            setattr(tensor.parameters[key], value[0], value[1])

    def outcome(read: Any) -> Any:
        try:
            region = read()
        except InferenceError as error:
            return error.status, str(error)
        return None if region is None else (region.region, region.offset, region.byte_size)

    generic = outcome(lambda: grpc_codec.generic_region(tensor.parameters, "input", "x"))
    assert outcome(lambda: grpc_codec._region(tensor.parameters, "input", tensor)) == generic


def test_every_rpc_of_the_service_has_a_handler() -> None:
    servicer = InferenceServicer(engine=None, server_version="0")  # type: ignore[arg-type]
    table = handlers.method_table(servicer)
    prefix = "/inference.GRPCInferenceService/"
    assert set(table) == {f"{prefix}{method.name}".encode() for method in handlers.SERVICE.methods} | {
        b"/grpc.health.v1.Health/Check"
    }
    assert len(table) == 21
    assert [method.name for method in table.values() if method.streaming] == ["ModelStreamInfer"]
    infer = table[f"{prefix}ModelInfer".encode()]
    assert inspect.unwrap(infer.deserialize) is wire.parse_infer_request
    assert infer.serialize is wire.infer_response_parts
