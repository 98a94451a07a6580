"""What KServe's own Python SDK clients send, byte for byte, and the answers they need.

The requests below were captured from kserve 0.21.0 (httpx 0.29.0, grpcio 1.85): `kserve.InferenceRESTClient`
with `RESTConfig(protocol="v2")` (its httpx transport recorded each request's headers and body) and
`kserve.InferenceGRPCClient` (the `ModelInferRequest` it sends, from `InferRequest.to_grpc()`, serialized). The
suite cannot install kserve everywhere it runs, so the bytes are replayed here to a real server, in one process
and behind frontend processes. Every answer checked was compared with tritonserver 2.51's (nvidia-pytriton 0.7)
to the same client call.

What the SDK does differently from tritonclient: its REST client asks for no binary outputs unless told
(`RequestedOutput(name, {"binary_data": True})` or the `binary_data_output` request parameter), sends a
generated `id` with every request, and tags binary inputs with `binary_data_size` over gRPC too.
"""

from __future__ import annotations

import gzip
import json
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

# The headers httpx 0.29 adds to every request of InferenceRESTClient (host and content-length left to http.client).
_HTTPX = {
    "accept": "*/*",
    "accept-encoding": "gzip, deflate",
    "connection": "keep-alive",
    "user-agent": "python-httpx/0.29.0",
}
_BINARY = {**_HTTPX, "content-type": "application/octet-stream"}  # and the JSON part's length, per request
_JSON = {**_HTTPX, "content-type": "application/json"}
_BATCH = ModelConfig(max_batch_size=8)


def _echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": r["in"]} for r in requests]


def _sum_and_diff(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"sum": r["a"] + r["b"], "diff": r["a"] - r["b"]} for r in requests]


def _parameters(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Answers with the request's parameters, as sorted JSON."""
    return [
        {"out": np.array([json.dumps(dict(r.parameters or {}), sort_keys=True).encode()], object)} for r in requests
    ]


@batch
def _double(x: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x * 2}


def _bind(triton: Triton) -> None:
    def one(dtype: Any) -> List[Tensor]:
        return [Tensor(name="in", dtype=dtype, shape=(-1,))]

    triton.bind("strings", _echo, one(bytes), [Tensor(name="out", dtype=bytes, shape=(-1,))], config=_BATCH)
    triton.bind("fp16", _echo, one(np.float16), [Tensor(name="out", dtype=np.float16, shape=(-1,))], config=_BATCH)
    triton.bind("boolm", _echo, one(np.bool_), [Tensor(name="out", dtype=np.bool_, shape=(-1,))], config=_BATCH)
    pair = [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))]
    results = [Tensor(name="sum", dtype=np.float32, shape=(-1,)), Tensor(name="diff", dtype=np.float32, shape=(-1,))]
    triton.bind("two", _sum_and_diff, pair, results, config=_BATCH)
    triton.bind("params", _parameters, one(np.float32), [Tensor(name="out", dtype=bytes, shape=(1,))], config=_BATCH)
    triton.bind(
        "int_batch",
        _double,
        [Tensor(name="x", dtype=np.int64, shape=(-1,))],
        [Tensor(name="y", dtype=np.int64, shape=(-1,))],
        config=ModelConfig(max_batch_size=16),
    )


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends=3"])
def server(request: pytest.FixtureRequest) -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False, frontends=request.param) as triton:
        yield triton


def _post(server: Triton, model: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
    """POST as InferenceRESTClient does; the answer's body decompressed (httpx asked for gzip or deflate)."""
    status, answer_headers, answer = request(_http_port(server), "POST", f"/v2/models/{model}/infer", body, headers)
    if answer_headers.get("content-encoding") == "gzip":
        answer = gzip.decompress(answer)
    return status, answer_headers, answer


def _http_port(server: Triton) -> int:
    port = server.http_port
    assert port is not None
    return port


def _binary(json_part: bytes) -> Dict[str, str]:
    return {**_BINARY, "inference-header-content-length": str(len(json_part))}


def _split(headers: Dict[str, str], body: bytes) -> Tuple[Any, bytes]:
    """The answer's JSON document and the binary data after it."""
    length = int(headers.get("inference-header-content-length", len(body)))
    return json.loads(body[:length]), body[length:]


F32_A = b"\x00\x00\xc0?\x00\x00\x00\xc0\x00\x00P@"  # [1.5, -2.0, 3.25]
F32_B = b"\x00\x00@@\x00\x00\x80\xc0\x00\x00\xd0@"  # [3.0, -4.0, 6.5]
FP16_IN = b"\x008\x00>\x00\xc0"  # [0.5, 1.5, -2.0]
STRINGS = b"\x05\x00\x00\x00hello\x06\x00\x00\x00w\xc3\xb6rld\x00\x00\x00\x00"  # [b"hello", "wörld", b""]


def test_rest_binary_inputs_get_json_outputs_when_none_are_asked_for_as_binary(server: Triton) -> None:
    # InferInput.set_data_from_numpy(a, binary_data=True) for both inputs; no outputs named
    head = (
        b'{"id":"kserve-1","model_name":"two","inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","parameters":'
        b'{"binary_data_size":12}},{"name":"b","shape":[1,3],"datatype":"FP32","parameters":{"binary_data_size":12}}]}'
    )
    status, headers, body = _post(server, "two", head + F32_A + F32_B, _binary(head))
    assert (status, headers["content-type"], headers.get("content-encoding")) == (200, "application/json", "gzip")
    assert "inference-header-content-length" not in headers  # the SDK then reads the whole body as JSON
    assert json.loads(body) == {
        "id": "kserve-1",
        "model_name": "two",
        "model_version": "1",
        "outputs": [
            {"name": "sum", "datatype": "FP32", "shape": [1, 3], "data": [4.5, -6.0, 9.75]},
            {"name": "diff", "datatype": "FP32", "shape": [1, 3], "data": [-1.5, 2.0, -3.25]},
        ],
    }


def test_rest_binary_bytes_input_comes_back_as_json_strings(server: Triton) -> None:
    head = (
        b'{"id":"kserve-2","model_name":"strings","inputs":[{"name":"in","shape":[1,3],"datatype":"BYTES",'
        b'"parameters":{"binary_data_size":23}}]}'
    )
    status, _, body = _post(server, "strings", head + STRINGS, _binary(head))
    assert status == 200
    assert json.loads(body)["outputs"] == [
        {"name": "out", "datatype": "BYTES", "shape": [1, 3], "data": ["hello", "wörld", ""]}
    ]


def test_rest_fp16_output_not_asked_for_as_binary_is_refused_in_tritons_words(server: Triton) -> None:
    # tritonserver 2.51 answers this 400 (FP16 has no JSON form): the SDK user must ask for binary outputs
    head = (
        b'{"id":"kserve-3","model_name":"fp16","inputs":[{"name":"in","shape":[1,3],"datatype":"FP16","parameters":'
        b'{"binary_data_size":6}}]}'
    )
    status, _, body = _post(server, "fp16", head + FP16_IN, _binary(head))
    message = "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    assert (status, json.loads(body)) == (400, {"error": message})


def test_rest_fp16_output_asked_for_as_binary(server: Triton) -> None:
    # RequestedOutput("out", {"binary_data": True})
    head = (
        b'{"id":"kserve-4","model_name":"fp16","inputs":[{"name":"in","shape":[1,3],"datatype":"FP16","parameters":'
        b'{"binary_data_size":6}}],"outputs":[{"name":"out","parameters":{"binary_data":true}}]}'
    )
    status, headers, body = _post(server, "fp16", head + FP16_IN, _binary(head))
    assert (status, headers["content-type"]) == (200, "application/octet-stream")
    document, tail = _split(headers, body)
    assert document["outputs"] == [
        {"name": "out", "datatype": "FP16", "shape": [1, 3], "parameters": {"binary_data_size": 6}}
    ]
    assert tail == FP16_IN


def test_rest_request_parameters_and_id_reach_the_model(server: Triton) -> None:
    # InferRequest(..., request_id="kserve-5", parameters={"s": "str", "i": 7, "flag": True}), binary_data=False
    body = (
        b'{"id":"kserve-5","model_name":"params","inputs":[{"name":"in","shape":[1,3],"datatype":"FP32","data":'
        b'[1.5,-2.0,3.25]}],"parameters":{"s":"str","i":7,"flag":true}}'
    )
    status, _, answer = _post(server, "params", body, _JSON)
    document = json.loads(answer)
    assert (status, document["id"]) == (200, "kserve-5")
    assert json.loads(document["outputs"][0]["data"][0]) == {"flag": True, "i": 7, "s": "str"}


def test_rest_outputs_asked_for_one_binary_one_json(server: Triton) -> None:
    # request_outputs=[RequestedOutput("diff", {"binary_data": True}), RequestedOutput("sum", {"binary_data": False})]
    body = (
        b'{"id":"kserve-6","model_name":"two","inputs":[{"name":"a","shape":[1,3],"datatype":"FP32","data":'
        b'[1.5,-2.0,3.25]},{"name":"b","shape":[1,3],"datatype":"FP32","data":[3.0,-4.0,6.5]}],"outputs":[{"name":'
        b'"diff","parameters":{"binary_data":true}},{"name":"sum","parameters":{"binary_data":false}}]}'
    )
    status, headers, answer = _post(server, "two", body, _JSON)
    document, tail = _split(headers, answer)
    assert status == 200
    assert document["outputs"] == [  # in the model's order, as Triton answers
        {"name": "sum", "datatype": "FP32", "shape": [1, 3], "data": [4.5, -6.0, 9.75]},
        {"name": "diff", "datatype": "FP32", "shape": [1, 3], "parameters": {"binary_data_size": 12}},
    ]
    assert np.frombuffer(tail, np.float32).tolist() == [-1.5, 2.0, -3.25]


def test_rest_binary_data_output_parameter(server: Triton) -> None:
    # InferRequest(..., parameters={"binary_data_output": True})
    head = (
        b'{"id":"kserve-7","model_name":"int_batch","inputs":[{"name":"x","shape":[3,2],"datatype":"INT64",'
        b'"parameters":{"binary_data_size":48}}],"parameters":{"binary_data_output":true}}'
    )
    x = np.array([[1, 2], [3, 4], [5, -6]], np.int64)
    status, headers, answer = _post(server, "int_batch", head + x.tobytes(), _binary(head))
    document, tail = _split(headers, answer)
    assert (status, document["id"]) == (200, "kserve-7")
    assert document["outputs"] == [
        {"name": "y", "datatype": "INT64", "shape": [3, 2], "parameters": {"binary_data_size": 48}}
    ]
    assert np.frombuffer(tail, np.int64).reshape(3, 2).tolist() == (x * 2).tolist()


def test_rest_json_input_with_its_own_parameters(server: Triton) -> None:
    # InferInput("in", [1, 3], "BOOL", data=[True, False, True], parameters={"foo": "bar"})
    body = (
        b'{"id":"kserve-8","model_name":"boolm","inputs":[{"name":"in","shape":[1,3],"datatype":"BOOL","parameters":'
        b'{"foo":"bar"},"data":[true,false,true]}]}'
    )
    status, _, answer = _post(server, "boolm", body, _JSON)
    assert status == 200
    assert json.loads(answer)["outputs"] == [
        {"name": "out", "datatype": "BOOL", "shape": [1, 3], "data": [True, False, True]}
    ]


def _model_infer(server: Triton, message: bytes) -> service_pb2.ModelInferResponse:
    """Send serialized ModelInferRequest bytes as InferenceGRPCClient does (service inference.GRPCInferenceService)."""
    with grpc.insecure_channel(grpc_url(server)) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,  # the bytes go as they are
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        response: service_pb2.ModelInferResponse = call(message, timeout=60)
        return response


def _raw_outputs(response: service_pb2.ModelInferResponse) -> Dict[str, Tuple[str, List[int], bytes]]:
    return {
        output.name: (output.datatype, list(output.shape), raw)
        for output, raw in zip(response.outputs, response.raw_output_contents)
    }


def test_grpc_binary_inputs_tagged_with_binary_data_size(server: Triton) -> None:
    # KServe's to_grpc() keeps the binary_data_size parameter set_data_from_numpy put on each input
    message = (
        b'\n\x03two*%\n\x01a\x12\x04FP32\x1a\x02\x01\x03"\x16\n\x10binary_data_size\x12\x02\x10\x0c*%\n\x01b\x12\x04'
        b'FP32\x1a\x02\x01\x03"\x16\n\x10binary_data_size\x12\x02\x10\x0c:\x0c' + F32_A + b":\x0c" + F32_B
    )
    response = _model_infer(server, message)
    assert (response.model_name, response.model_version, response.id) == ("two", "1", "")
    outputs = _raw_outputs(response)
    assert list(outputs) == ["sum", "diff"]
    assert np.frombuffer(outputs["sum"][2], np.float32).tolist() == [4.5, -6.0, 9.75]
    assert outputs["diff"][:2] == ("FP32", [1, 3])


def test_grpc_binary_bytes_and_fp16_inputs(server: Triton) -> None:
    strings = b"\n\x07strings\x1a\tkserve-g2*'\n\x02in\x12\x05BYTES\x1a\x02\x01\x03\"\x16\n\x10binary_data_size\x12\x02"
    strings += b"\x10\x17:\x17" + STRINGS
    response = _model_infer(server, strings)
    assert response.id == "kserve-g2" and _raw_outputs(response) == {"out": ("BYTES", [1, 3], STRINGS)}
    half = b'\n\x04fp16*&\n\x02in\x12\x04FP16\x1a\x02\x01\x03"\x16\n\x10binary_data_size\x12\x02\x10\x06:\x06' + FP16_IN
    assert _raw_outputs(_model_infer(server, half)) == {"out": ("FP16", [1, 3], FP16_IN)}


def test_grpc_typed_contents_with_parameters_and_a_requested_output(server: Triton) -> None:
    # binary_data=False: int64_contents, request parameters {"s": "str", "i": 7, "flag": True}, id "kserve-g4"
    contents = (
        b'\n\tint_batch\x1a\tkserve-g4"\n\n\x04flag\x12\x02\x08\x01"\x07\n\x01i\x12\x02\x10\x07"\n\n\x01s\x12\x05\x1a\x03'
        b"str*!\n\x01x\x12\x05INT64\x1a\x02\x03\x02*\x11\x1a\x0f\x01\x02\x03\x04\x05\xfa\xff\xff\xff\xff\xff\xff\xff\xff\x01"
    )
    response = _model_infer(server, contents)
    datatype, shape, raw = _raw_outputs(response)["y"]
    assert (response.id, datatype, shape) == ("kserve-g4", "INT64", [3, 2])
    assert np.frombuffer(raw, np.int64).tolist() == [2, 4, 6, 8, 10, -12]
    # bool_contents and request_outputs=[RequestedOutput("out")]
    flags = b"\n\x05boolm*\x15\n\x02in\x12\x04BOOL\x1a\x02\x01\x03*\x05\n\x03\x01\x00\x012\x05\n\x03out"
    assert _raw_outputs(_model_infer(server, flags)) == {"out": ("BOOL", [1, 3], b"\x01\x00\x01")}


def test_what_the_sdk_reads_of_health_and_readiness(server: Triton) -> None:
    """is_model_ready reads the status alone (an unknown model: 400, False); is_server_live/ready read JSON
    from Triton's empty 200 and fail against tritonserver 2.51 as here: its gRPC calls are the ones to use."""
    assert request(_http_port(server), "GET", "/v2/models/two/ready", headers=_HTTPX)[::2] == (200, b"")
    assert request(_http_port(server), "GET", "/v2/models/nope/ready", headers=_HTTPX)[0] == 400
    assert request(_http_port(server), "GET", "/v2/health/live", headers=_HTTPX)[::2] == (200, b"")
    with grpc.insecure_channel(grpc_url(server)) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelReady",
            request_serializer=None,
            response_deserializer=service_pb2.ModelReadyResponse.FromString,
        )
        assert ready(b"\n\x04nope", timeout=60).ready is False  # ModelReadyRequest(name="nope"): no error
        assert ready(b"\n\x03two", timeout=60).ready is True
