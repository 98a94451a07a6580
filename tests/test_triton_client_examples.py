"""The flows of Triton's Python client examples (triton-inference-server/client, src/python/examples) not
re-created elsewhere, against stand-ins of the example models bound with the API, in one process and behind
frontend processes.

Each test names the example it stands for and asserts what the example checks before it prints its success
line. The sequence, model-control, image-client and system shared-memory examples have theirs in
test_sequence_batching.py, test_model_control.py, test_classification_labels.py / test_ensembles.py and
test_system_shared_memory.py.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Dict, Iterator, List

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url, running_triton

ROW = (16,)


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> Dict[str, np.ndarray]:
    """Triton's `simple` and `simple_int8`: the sum and the difference."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def _as_ints(strings: np.ndarray) -> np.ndarray:
    return np.array([int(item) for item in strings.reshape(-1)], dtype=np.int64).reshape(strings.shape)


def _as_strings(numbers: np.ndarray) -> np.ndarray:
    return np.array([str(item).encode() for item in numbers.reshape(-1)], dtype=object).reshape(numbers.shape)


@batch
def add_sub_strings(INPUT0: np.ndarray, INPUT1: np.ndarray) -> Dict[str, np.ndarray]:
    """Triton's `simple_string`: `simple` over BYTES tensors that hold decimal numbers."""
    first, second = _as_ints(INPUT0), _as_ints(INPUT1)
    return {"OUTPUT0": _as_strings(first + second), "OUTPUT1": _as_strings(first - second)}


@batch
def identity(INPUT0: np.ndarray) -> Dict[str, np.ndarray]:
    """Triton's `simple_identity` (BYTES)."""
    return {"OUTPUT0": INPUT0}


def repeat(requests: List[Request]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Triton's decoupled `repeat_int32`: one response per value of IN, the i-th after DELAY[i] milliseconds."""
    (request,) = requests
    for index, value in enumerate(request["IN"]):
        time.sleep(int(request["DELAY"][index]) / 1000)
        yield [{"OUT": np.array([value], np.int32), "IDX": np.array([index], np.uint32)}]


def _bind(triton: Triton) -> None:
    def pair(prefix: str, dtype: Any) -> List[Tensor]:
        return [Tensor(name=f"{prefix}{index}", dtype=dtype, shape=ROW) for index in range(2)]

    batching = ModelConfig(max_batch_size=8)
    triton.bind("simple", add_sub, inputs=pair("INPUT", np.int32), outputs=pair("OUTPUT", np.int32), config=batching)
    triton.bind("simple_int8", add_sub, inputs=pair("INPUT", np.int8), outputs=pair("OUTPUT", np.int8), config=batching)
    triton.bind(
        "simple_string", add_sub_strings, inputs=pair("INPUT", bytes), outputs=pair("OUTPUT", bytes), config=batching
    )
    triton.bind(
        "simple_identity",
        identity,
        inputs=[Tensor(name="INPUT0", dtype=bytes, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT0", dtype=bytes, shape=(-1,))],
        config=batching,
    )
    triton.bind(
        "repeat_int32",
        repeat,
        inputs=[
            Tensor(name="IN", dtype=np.int32, shape=(-1,)),
            Tensor(name="DELAY", dtype=np.uint32, shape=(-1,)),
            Tensor(name="WAIT", dtype=np.uint32, shape=(1,)),
        ],
        outputs=[Tensor(name="OUT", dtype=np.int32, shape=(1,)), Tensor(name="IDX", dtype=np.uint32, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends"])
def triton(request: Any) -> Iterator[Triton]:
    with running_triton(_bind, frontends=request.param) as served:
        yield served


def _numbers() -> np.ndarray:
    return np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_as_simple_string_infer_clients_decimal_strings_add_and_subtract(triton: Triton, lib: Any) -> None:
    # simple_http_string_infer_client.py / simple_grpc_string_infer_client.py, first part.
    url = http_url(triton) if lib is httpclient else grpc_url(triton)
    client = lib.InferenceServerClient(url)
    tensors = []
    for name, values in (("INPUT0", _numbers()), ("INPUT1", np.ones((1, 16), np.int32))):
        tensor = lib.InferInput(name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(_as_strings(values))
        tensors.append(tensor)
    result = client.infer("simple_string", tensors)
    assert [int(item) for item in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
    assert [int(item) for item in result.as_numpy("OUTPUT1")[0]] == list(range(-1, 15))


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_as_string_infer_clients_bytes_with_zeros_come_back_from_the_identity(triton: Triton, lib: Any) -> None:
    # The same examples, second part: `simple_identity` over strings that hold NUL bytes and non-ASCII text.
    url = http_url(triton) if lib is httpclient else grpc_url(triton)
    client = lib.InferenceServerClient(url)
    values = np.array([[b"\x00leading", b"trailing\x00\x00", "\u00e9t\u00e9".encode(), b""]], dtype=object)
    tensor = lib.InferInput("INPUT0", [1, 4], "BYTES")
    tensor.set_data_from_numpy(values)
    assert client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0").tolist() == values.tolist()


def _explicit_request(model: str, datatype: str, field: str, first: List[Any], second: List[Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id="my request id")
    for name, values in (("INPUT0", first), ("INPUT1", second)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field).extend(values)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    return request


@pytest.mark.parametrize(
    ("model", "datatype", "dtype"), [("simple", "INT32", np.int32), ("simple_int8", "INT8", np.int8)]
)
def test_as_grpc_explicit_int_content_clients_typed_contents_answer_raw(
    triton: Triton, model: str, datatype: str, dtype: Any
) -> None:
    # grpc_explicit_int_content_client.py / grpc_explicit_int8_content_client.py: inputs in int_contents, the
    # answer in raw_output_contents, then a version string that is no number.
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = _explicit_request(model, datatype, "int_contents", list(range(16)), [1] * 16)
        response = stub.ModelInfer(request)
        assert response.id == "my request id"
        assert [output.name for output in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert all(list(output.shape) == [1, 16] for output in response.outputs)
        total, difference = (np.frombuffer(raw, dtype=dtype) for raw in response.raw_output_contents)
        assert total.tolist() == list(range(1, 17)) and difference.tolist() == list(range(-1, 15))
        request.model_version = "wrong_specification"
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "failed to get model version from specified version string 'wrong_specification'" in str(
            raised.value.details()
        )


def test_as_grpc_explicit_byte_content_client_bytes_contents_answer_raw(triton: Triton) -> None:
    # grpc_explicit_byte_content_client.py: decimal strings in bytes_contents, the answer serialized BYTES.
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        numbers = [str(index).encode() for index in range(16)]
        response = stub.ModelInfer(_explicit_request("simple_string", "BYTES", "bytes_contents", numbers, [b"1"] * 16))
        total, difference = (deserialize_bytes_tensor(raw) for raw in response.raw_output_contents)
        assert [int(item) for item in total] == list(range(1, 17))
        assert [int(item) for item in difference] == list(range(-1, 15))


def test_as_simple_grpc_custom_repeat_one_request_streams_its_values_in_order(triton: Triton) -> None:
    # simple_grpc_custom_repeat.py: one request to the decoupled repeat_int32 on a stream, ten responses.
    answers: queue.Queue[Any] = queue.Queue()
    inputs = [
        grpcclient.InferInput("IN", [10], "INT32"),
        grpcclient.InferInput("DELAY", [10], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.arange(100, 110, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.ones(10, np.uint32))
    inputs[2].set_data_from_numpy(np.ones(1, np.uint32))
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer("repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        received = [answers.get(timeout=30) for _ in range(10)]
        client.stop_stream()
    assert not [answer for answer in received if isinstance(answer, InferenceServerException)]
    assert [answer.as_numpy("OUT").tolist() for answer in received] == [[value] for value in range(100, 110)]
    assert all(answer.as_numpy("IDX") is None for answer in received)  # only the output asked for


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_as_memory_growth_test_a_new_client_for_every_request(triton: Triton, lib: Any) -> None:
    # memory_growth_test.py: a client made, used once and dropped, many times over (here 20).
    url = http_url(triton) if lib is httpclient else grpc_url(triton)
    for _ in range(20):
        client = lib.InferenceServerClient(url)
        tensors = [lib.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(_numbers())
        result = client.infer("simple", tensors, outputs=[lib.InferRequestedOutput("OUTPUT0")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), _numbers() * 2)
        assert result.as_numpy("OUTPUT1") is None
        client.close()
