"""Property-based fuzzing of gRPC ModelInfer and ModelStreamInfer with generated ModelInferRequest messages.

Hypothesis builds each message field by field; a random generator it also draws derives byte-level
mutants of the serialized message (flipped, inserted, dropped and cut bytes), sent as they are. All
calls share one channel. Every call ends with OK or a client-error code (never INTERNAL or UNKNOWN),
the stream answers each request and stays open, and the server serves correctly afterwards. The tests
send more than 10,000 messages together.
"""

from __future__ import annotations

import random
from typing import Any, Iterator, List

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.fuzz_models import DATATYPES, FUZZ_SETTINGS, bind_fuzz_models, examples, mutate_bytes

# Generated messages per test; each is sent with its mutants (3, 4 and 6 messages): 10,100 in all.
MESSAGE_EXAMPLES = examples(1700)
LARGE_EXAMPLES = examples(200)
STREAM_EXAMPLES = examples(700)
CLIENT_ERRORS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
}
UNPARSED = (grpc.StatusCode.INTERNAL, "Unable to parse request")
METHOD = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(bind_fuzz_models, allow_http=False, allow_metrics=False) as triton:
        yield triton


@pytest.fixture(scope="module")
def channel(server: Triton) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield channel


def still_serving(channel: grpc.Channel) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    message = service_pb2.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, 3])
    message.raw_input_contents.append(np.array([1, 2, 3], np.float32).tobytes())
    response = stub.ModelInfer(message, timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0, 3.0]
    assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready


# ---------------------------------------------------------------- strategies

texts = st.text(max_size=6)
names = st.sampled_from(["INPUT_1", "a", "b", "c", "OUTPUT_1", "a_out", ""]) | texts
int64s = st.one_of(
    st.integers(-2, 4), st.sampled_from([0, 2**31, 2**62, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1)
)
parameter_keys = (
    st.sampled_from(
        [
            "priority",
            "timeout",
            "binary_data_output",
            "sequence_id",
            "triton_enable_empty_final_response",
            "triton_x",
            "headers",
            "classification",
            "shared_memory_region",
            "shared_memory_byte_size",
            "x",
        ]
    )
    | texts
)


@st.composite
def fill_parameters(draw: st.DrawFn, target: Any) -> None:
    """Fill a map<string, InferParameter> with any keys and any of the oneof values (or none)."""
    for key in draw(st.lists(parameter_keys, max_size=3)):
        parameter = target[key]
        choice = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "none"]))
        if choice == "bool":
            parameter.bool_param = draw(st.booleans())
        elif choice == "int64":
            parameter.int64_param = draw(int64s)
        elif choice == "string":
            parameter.string_param = draw(texts)
        elif choice == "double":
            parameter.double_param = draw(st.floats())
        elif choice == "uint64":
            parameter.uint64_param = draw(st.integers(0, 2**64 - 1))


@st.composite
def fill_contents(draw: st.DrawFn, contents: Any) -> None:
    """Typed contents: any of the repeated fields, with any values."""
    field = draw(
        st.sampled_from(
            [
                "bool_contents",
                "int_contents",
                "int64_contents",
                "uint_contents",
                "uint64_contents",
                "fp32_contents",
                "fp64_contents",
                "bytes_contents",
            ]
        )
    )
    values = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(2**31), 2**31 - 1),
        "int64_contents": st.integers(-(2**63), 2**63 - 1),
        "uint_contents": st.integers(0, 2**32 - 1),
        "uint64_contents": st.integers(0, 2**64 - 1),
        "fp32_contents": st.floats(width=32),
        "fp64_contents": st.floats(),
        "bytes_contents": st.binary(max_size=6),
    }[field]
    getattr(contents, field).extend(draw(st.lists(values, max_size=5)))


@st.composite
def infer_requests(draw: st.DrawFn, models: Any = None) -> Any:
    """A ModelInferRequest with every field drawn, valid or not."""
    if models is None:
        models = st.sampled_from(["identity", "mixed", "identity", "mixed", "stream", "missing", ""])
    message = service_pb2.ModelInferRequest(
        model_name=draw(models),
        model_version=draw(st.sampled_from(["", "", "1", "2", "x", "-1"])),
        id=draw(texts),
    )
    draw(fill_parameters(message.parameters))
    use_raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(
            name=draw(names),
            datatype=draw(st.sampled_from(["FP32", "INT32", "BYTES", "BOOL", *DATATYPES, "FP128", ""])),
            shape=draw(st.lists(int64s, max_size=4)),
        )
        draw(fill_parameters(tensor.parameters))
        if not use_raw or draw(st.integers(0, 4)) == 0:
            draw(fill_contents(tensor.contents))
        if use_raw:
            message.raw_input_contents.append(draw(st.binary(max_size=24)))
    if use_raw and draw(st.integers(0, 4)) == 0:
        message.raw_input_contents.append(draw(st.binary(max_size=8)))  # one more than there are inputs
    for _ in range(draw(st.integers(0, 2))):
        output = message.outputs.add(name=draw(names))
        draw(fill_parameters(output.parameters))
    return message


@st.composite
def near_valid_requests(draw: st.DrawFn) -> Any:
    """A valid request for `identity` (raw or typed contents), possibly with one field redrawn."""
    rows = draw(st.integers(0, 4))
    values = np.array(draw(st.lists(st.floats(width=32), min_size=rows, max_size=rows)), np.float32)
    message = service_pb2.ModelInferRequest(model_name="identity")
    tensor = message.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, rows])
    if draw(st.booleans()):
        message.raw_input_contents.append(values.tobytes())
    else:
        tensor.contents.fp32_contents.extend(values.tolist())
    change = draw(st.sampled_from(["none", "shape", "datatype", "name", "parameters", "outputs"]))
    if change == "shape":
        tensor.shape[:] = draw(st.lists(int64s, max_size=3))
    elif change == "datatype":
        tensor.datatype = draw(st.sampled_from(DATATYPES))
    elif change == "name":
        tensor.name = draw(names)
    elif change == "parameters":
        draw(fill_parameters(message.parameters))
    elif change == "outputs":
        message.outputs.add(name=draw(names))
    return message


def check_call(call: Any, payload: bytes) -> None:
    """Send serialized bytes as a ModelInfer call: OK or a client error, never INTERNAL or UNKNOWN.

    But for bytes protobuf cannot parse: those are INTERNAL "Unable to parse request", as tritonserver's.
    """
    try:
        call(payload, timeout=30)
    except grpc.RpcError as error:
        answer = (error.code(), error.details())
        assert error.code() in CLIENT_ERRORS or answer == UNPARSED, (*answer, payload[:200])


# ---------------------------------------------------------------- tests


def test_fuzz_model_infer_messages(server: Triton, channel: grpc.Channel) -> None:
    call = channel.unary_unary(METHOD)  # bytes in, bytes out: mutants reach the server as they are
    sent = 0

    @settings(FUZZ_SETTINGS, max_examples=MESSAGE_EXAMPLES)
    @given(message=infer_requests() | near_valid_requests(), rng=st.randoms())
    def run(message: Any, rng: random.Random) -> None:
        nonlocal sent
        payload = message.SerializeToString()
        for variant in (payload, *(mutate_bytes(rng, payload) for _ in range(2))):
            check_call(call, variant)
            sent += 1

    run()
    assert sent >= MESSAGE_EXAMPLES * 3
    still_serving(channel)


def test_fuzz_large_messages_take_the_zero_copy_parser(server: Triton, channel: grpc.Channel) -> None:
    call = channel.unary_unary(METHOD)
    sent = 0

    @settings(FUZZ_SETTINGS, max_examples=LARGE_EXAMPLES)
    @given(message=infer_requests(st.sampled_from(["identity", "mixed"])), rng=st.randoms())
    def run(message: Any, rng: random.Random) -> None:
        nonlocal sent
        message.raw_input_contents.append(bytes(70_000))  # over the size where raw inputs are split off
        payload = message.SerializeToString()
        for variant in (payload, *(mutate_bytes(rng, payload) for _ in range(3))):
            check_call(call, variant)
            sent += 1

    run()
    assert sent >= LARGE_EXAMPLES * 4
    still_serving(channel)


def test_fuzz_model_stream_infer(server: Triton, channel: grpc.Channel) -> None:
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    sent = 0

    @settings(FUZZ_SETTINGS, max_examples=STREAM_EXAMPLES)
    @given(messages=st.lists(infer_requests() | near_valid_requests(), min_size=1, max_size=3), rng=st.randoms())
    def run(messages: List[Any], rng: random.Random) -> None:
        nonlocal sent
        payloads = [message.SerializeToString() for message in messages]
        payloads += [mutate_bytes(rng, rng.choice(payloads)) for _ in range(6 - len(payloads))]
        responses = list(stream(iter(payloads), timeout=30))  # the stream ends OK once every request ended
        sent += len(payloads)
        assert len(responses) >= len(payloads)  # an answer (or an error message) for every request
        for raw in responses:
            response = service_pb2.ModelStreamInferResponse.FromString(raw)
            assert not response.error_message.startswith("internal server error"), response.error_message

    run()
    assert sent >= STREAM_EXAMPLES * 6
    still_serving(channel)
