"""Answers that must be Triton's, each checked with a real client against what nvidia-pytriton 0.7.0 answered.

Every expectation here was measured on this machine against nvidia-pytriton 0.7.0 (its tritonserver 2.51)
serving the same models; the comments quote its answers.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.http_helpers import request

CALLS: List[Dict[str, Any]] = []  # what the `add` callable saw


def _add(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    for item in requests:
        CALLS.append({"names": item.requested_output_names, "inputs": list(item.keys())})
    if (requests[0].parameters or {}).get("fail"):
        raise ValueError("the model says no")
    return [{"sum": item["a"] + item["b"], "diff": item["a"] - item["b"]} for item in requests]


def _stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"y": item["x"]} for item in requests]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": item["x"]} for item in requests]


def _bind(triton: Triton) -> None:
    vector = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in ("a", "b", "sum", "diff")]
    batcher = DynamicBatcher(max_queue_delay_microseconds=20000, preferred_batch_size=[2, 4])
    triton.bind(
        "add", _add, inputs=vector[:2], outputs=vector[2:], config=ModelConfig(max_batch_size=8, batcher=batcher)
    )
    x, y = (Tensor(name=name, dtype=np.float32, shape=(-1, 3)) for name in ("x", "y"))
    triton.bind("stream", _stream, inputs=[x], outputs=[y], config=ModelConfig(max_batch_size=4, decoupled=True))
    triton.bind("nobatch", _identity, inputs=[x], outputs=[y], config=ModelConfig(batching=False))
    triton.bind("pair", _add, inputs=vector[:2], outputs=vector[2:], config=ModelConfig(batching=False))
    kab = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in ("k", "a", "b")]
    triton.bind("triple", _identity, inputs=kab, outputs=[y], config=ModelConfig(batching=False))
    policy = DynamicBatcher(
        max_queue_delay_microseconds=100,
        priority_levels=3,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(
            timeout_action=TimeoutAction.DELAY,
            default_timeout_microseconds=5000,
            allow_timeout_override=True,
            max_queue_size=7,
        ),
        priority_queue_policy={1: QueuePolicy(max_queue_size=2)},
    )
    text = [Tensor(name="x", dtype=bytes, shape=(1,), optional=True), Tensor(name="y", dtype=bytes, shape=(1,))]
    triton.bind(
        "policy",
        [_identity, _identity],
        inputs=text[:1],
        outputs=text[1:],
        config=ModelConfig(max_batch_size=16, response_cache=True, batcher=policy),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, cache_config=["local,size=1048576"]) as server:
        yield server


def _floats(*values: float) -> np.ndarray:
    return np.array([values], dtype=np.float32)


def _http_infer(triton: Triton, outputs: Any = None, parameters: Any = None) -> Any:
    client = httpclient.InferenceServerClient(http_url(triton))
    inputs = [httpclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(_floats(1, 2))
    try:
        return client.infer("add", inputs, outputs=outputs, parameters=parameters)
    finally:
        client.close()


# GET /v2/models/<m>/config, as nvidia-pytriton 0.7.0 printed it for the same models ("parameters" held its
# workspace path, which this server has none of).
_OPTIMIZATION = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}


def _config(name: str, max_batch_size: int, tensors: List[Dict[str, Any]], count: int = 1) -> Dict[str, Any]:
    inputs, outputs = tensors
    return {
        "name": name,
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": [
            {
                "name": inputs["name"],
                "data_type": inputs["type"],
                "format": "FORMAT_NONE",
                "dims": inputs["dims"],
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": inputs.get("optional", False),
                "is_non_linear_format_io": False,
            }
        ],
        "output": [
            {
                "name": outputs["name"],
                "data_type": outputs["type"],
                "dims": outputs["dims"],
                "label_filename": "",
                "is_shape_tensor": False,
                "is_non_linear_format_io": False,
            }
        ],
        "batch_input": [],
        "batch_output": [],
        "optimization": _OPTIMIZATION,
        "instance_group": [
            {
                "name": f"{name}_0",
                "kind": "KIND_CPU",
                "count": count,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "model.py",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
    }


def _ordered(document: Dict[str, Any], before: str, key: str, value: Any) -> Dict[str, Any]:
    """`document` with `key` inserted before `before` (Triton prints dynamic_batching before instance_group)."""
    result: Dict[str, Any] = {}
    for name, item in document.items():
        if name == before:
            result[key] = value
        result[name] = item
    return result


def test_model_config_prints_every_field_with_numbers(triton: Triton) -> None:
    floats = {"type": "TYPE_FP32", "dims": [-1, 3]}
    strings = {"type": "TYPE_STRING", "dims": [1]}
    nobatch = _config("nobatch", 0, [{"name": "x", **floats}, {"name": "y", **floats}])
    stream = _ordered(
        _config("stream", 4, [{"name": "x", **floats}, {"name": "y", **floats}]),
        "instance_group",
        "dynamic_batching",
        {
            "preferred_batch_size": [4],
            "max_queue_delay_microseconds": 0,
            "preserve_ordering": False,
            "priority_levels": 0,
            "default_priority_level": 0,
            "priority_queue_policy": {},
        },
    )
    stream["model_transaction_policy"] = {"decoupled": True}
    policy = _ordered(
        _config("policy", 16, [{"name": "x", "optional": True, **strings}, {"name": "y", **strings}], count=2),
        "instance_group",
        "dynamic_batching",
        {
            "preferred_batch_size": [16],
            "max_queue_delay_microseconds": 100,
            "preserve_ordering": False,
            "priority_levels": 3,
            "default_priority_level": 2,
            "default_queue_policy": {
                "timeout_action": "DELAY",
                "default_timeout_microseconds": 5000,
                "allow_timeout_override": True,
                "max_queue_size": 7,
            },
            "priority_queue_policy": {
                "1": {
                    "timeout_action": "REJECT",
                    "default_timeout_microseconds": 0,
                    "allow_timeout_override": False,
                    "max_queue_size": 2,
                }
            },
        },
    )
    policy["response_cache"] = {"enable": True}
    for name, expected in (("nobatch", nobatch), ("stream", stream), ("policy", policy)):
        status, _, body = request(triton.http_port, "GET", f"/v2/models/{name}/config")
        assert status == 200
        assert json.loads(body) == expected, name
        assert list(json.loads(body)) == list(expected), name  # Triton's order of fields, too
    add = httpclient.InferenceServerClient(http_url(triton)).get_model_config("add")
    assert add["input"][0]["dims"] == [-1]  # 0.7: "dims":[-1], not ["-1"]
    assert add["dynamic_batching"]["max_queue_delay_microseconds"] == 20000  # 0.7: a JSON number
    assert add["dynamic_batching"]["preferred_batch_size"] == [2, 4]


def test_grpc_model_config_is_the_same_message(triton: Triton) -> None:
    # 0.7 over gRPC (as_json): "dims": ["1"], "max_queue_delay_microseconds": "100" (protobuf's JSON for int64),
    # "instance_group": [{"name": "policy_0", "count": 2, "kind": "KIND_CPU"}], "default_model_filename": "model.py"
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    config = client.get_model_config("policy", as_json=True)["config"]
    client.close()
    assert config["input"] == [{"name": "x", "data_type": "TYPE_STRING", "dims": ["1"], "optional": True}]
    assert config["instance_group"] == [{"name": "policy_0", "count": 2, "kind": "KIND_CPU"}]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "100"
    assert config["dynamic_batching"]["priority_queue_policy"] == {"1": {"max_queue_size": 2}}
    assert config["default_model_filename"] == "model.py" and config["response_cache"] == {"enable": True}


def test_inference_count_counts_successful_inferences_only(triton: Triton) -> None:
    # 0.7 after two good requests and one the callable failed: "inference_count":2, "execution_count":3,
    # success count 2, fail count 1; nv_inference_count 2, nv_inference_exec_count 3.
    client = httpclient.InferenceServerClient(http_url(triton))
    before = client.get_inference_statistics("add", headers=HTTP_AUTH)["model_stats"][0]
    _http_infer(triton)
    _http_infer(triton)
    with pytest.raises(InferenceServerException):
        _http_infer(triton, parameters={"fail": True})
    after = client.get_inference_statistics("add", headers=HTTP_AUTH)["model_stats"][0]
    client.close()
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert after["response_stats"] == {} and after["memory_usage"] == []  # 0.7 prints both, empty
    metrics = request(triton.metrics_port or 0, "GET", "/metrics")[2].decode()
    sample = next(line for line in metrics.splitlines() if line.startswith('nv_inference_count{model="add"'))
    assert float(sample.rsplit(" ", 1)[1]) == after["inference_count"]


def test_statistics_of_an_unknown_model(triton: Triton) -> None:
    # 0.7: 400 {"error":"requested model 'nope' is not available"}, and for an unknown version
    # 400 {"error":"requested model version is not available for model 'add'"}; gRPC: INVALID_ARGUMENT, same text.
    status, _, body = request(triton.http_port, "GET", "/v2/models/nope/stats", headers=HTTP_AUTH)
    assert (status, json.loads(body)) == (400, {"error": "requested model 'nope' is not available"})
    status, _, body = request(triton.http_port, "GET", "/v2/models/add/versions/7/stats", headers=HTTP_AUTH)
    assert (status, json.loads(body)) == (400, {"error": "requested model version is not available for model 'add'"})
    client = httpclient.InferenceServerClient(http_url(triton))
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available"):
        client.get_inference_statistics("nope", headers=HTTP_AUTH)
    client.close()
    grpc = grpcclient.InferenceServerClient(grpc_url(triton))
    for args, message in (
        (("nope",), "requested model 'nope' is not available"),
        (("add", "7"), "requested model version is not available for model 'add'"),
    ):
        with pytest.raises(InferenceServerException) as raised:
            grpc.get_inference_statistics(*args, headers=GRPC_AUTH)
        assert (raised.value.status(), raised.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    grpc.close()


def test_infer_on_a_decoupled_model(triton: Triton) -> None:
    # 0.7 HTTP: 501 {"error":"HTTP end point doesn't support models with decoupled transaction policy"};
    # gRPC ModelInfer: UNIMPLEMENTED "ModelInfer RPC doesn't support models with decoupled transaction policy".
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    status, _, answer = request(triton.http_port, "POST", "/v2/models/stream/infer", body)
    assert (status, json.loads(answer)) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )
    http = httpclient.InferenceServerClient(http_url(triton))
    http_inputs = [httpclient.InferInput("x", [1, 3], "FP32")]
    http_inputs[0].set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        http.infer("stream", http_inputs)  # tritonclient.http sends the binary extension, unlike the JSON above
    http.close()
    assert (raised.value.status(), raised.value.message()) == (
        "501",
        "HTTP end point doesn't support models with decoupled transaction policy",
    )
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput("x", [1, 3], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("stream", inputs)
    client.close()
    assert (raised.value.status(), raised.value.message()) == (
        "StatusCode.UNIMPLEMENTED",
        "ModelInfer RPC doesn't support models with decoupled transaction policy",
    )


def test_callable_exception_names_its_type(triton: Triton) -> None:
    # 0.7 answered 500 with the callable's traceback ending "ValueError: the model says no"; gRPC: INTERNAL.
    with pytest.raises(InferenceServerException) as raised:
        _http_infer(triton, parameters={"fail": True})
    assert raised.value.status() == "500" and raised.value.message() == "ValueError: the model says no"
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(_floats(1, 2))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("add", inputs, parameters={"fail": True})
    client.close()
    assert (raised.value.status(), raised.value.message()) == ("StatusCode.INTERNAL", "ValueError: the model says no")


def test_requested_output_names_list_every_output_when_none_is_named(triton: Triton) -> None:
    # 0.7's callable saw requested_output_names ['sum', 'diff'] for a request naming no outputs, ['diff'] for
    # one naming only diff.
    CALLS.clear()
    _http_infer(triton)
    result = _http_infer(triton, outputs=[httpclient.InferRequestedOutput("diff")])
    assert [output["name"] for output in result.get_response()["outputs"]] == ["diff"]
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(_floats(1, 2))
    client.infer("add", inputs)
    client.close()
    assert CALLS == [
        {"names": ["sum", "diff"], "inputs": ["a", "b"]},
        {"names": ["diff"], "inputs": ["a", "b"]},
        {"names": ["sum", "diff"], "inputs": ["a", "b"]},
    ]


def _reversed_outputs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"diff": item["a"] - item["b"], "sum": item["a"] + item["b"]} for item in requests]


def _numbers_for_text(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    numbers = {"i": np.array([[7], [8]], np.int32), "f": np.array([[0.1, 7.5]], np.float32), "b": np.array([[True]])}
    return [dict(numbers) for _ in requests]


def _bind_odd_outputs(triton: Triton) -> None:
    vector = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in ("a", "b", "sum", "diff")]
    batching = ModelConfig(max_batch_size=4)
    triton.bind("rev", _reversed_outputs, inputs=vector[:2], outputs=vector[2:], config=batching)
    triton.bind(
        "rev_process", ProcessInstances(_reversed_outputs), inputs=vector[:2], outputs=vector[2:], config=batching
    )
    texts = [Tensor(name=name, dtype=bytes, shape=(-1,)) for name in ("i", "f", "b")]
    triton.bind("text", _numbers_for_text, inputs=vector[:1], outputs=texts, config=ModelConfig(max_batch_size=4))
    half = [Tensor(name="h", dtype=np.float16, shape=(-1,))]
    triton.bind("half", lambda requests: requests, inputs=half, outputs=half, config=ModelConfig(max_batch_size=4))
    for name, dtype in (("to_fp16", np.float16), ("to_bf16", "bfloat16")):
        narrowed = [Tensor(name="n", dtype=dtype, shape=(-1,))]
        triton.bind(name, _narrowed, inputs=vector[:1], outputs=narrowed, config=ModelConfig(max_batch_size=4))


def _narrowed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"n": request["a"]} for request in requests]  # a float32 array, served as the declared FP16 or BF16


@pytest.mark.parametrize(("model", "frontends"), [("rev", None), ("rev", 2), ("rev_process", None)])
def test_outputs_come_in_the_callables_order_and_empty_outputs_means_all(
    start_triton: Any, model: str, frontends: Any
) -> None:
    # nvidia-pytriton 0.7.0, its callable returning `diff` before `sum` (declared `sum` first): every request below
    # got [diff, sum], over HTTP and gRPC, `"outputs": []` included (this server answered [] to it, and the
    # request's order to the others).
    triton = start_triton(_bind_odd_outputs, frontends=frontends)
    ab = [{"name": name, "datatype": "FP32", "shape": [1, 2], "data": [1, 2]} for name in ("a", "b")]
    for outputs in (None, [], ["sum", "diff"], ["diff", "sum"], ["sum", "diff", "sum"]):
        body: Dict[str, Any] = {"inputs": ab}
        if outputs is not None:
            body["outputs"] = [{"name": name} for name in outputs]
        status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
        assert status == 200, raw
        assert [output["name"] for output in json.loads(raw)["outputs"]] == ["diff", "sum"], outputs
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        inputs = [grpcclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
        for infer_input in inputs:
            infer_input.set_data_from_numpy(_floats(1, 2))
        requested = None if outputs is None else [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = client.infer(model, inputs, outputs=requested)
        client.close()
        assert [output.name for output in result.get_response().outputs] == ["diff", "sum"], outputs


def test_numbers_returned_for_a_bytes_output_go_out_as_their_text(start_triton: Any) -> None:
    # nvidia-pytriton 0.7.0 (not strict) casts them `astype` the declared dtype and answered
    # {"name":"i","datatype":"BYTES","shape":[2,1],"data":["7","8"]},
    # {"name":"f","datatype":"BYTES","shape":[1,2],"data":["0.10000000149011612","7.5"]},
    # {"name":"b","datatype":"BYTES","shape":[1,1],"data":["True"]}; this server sent INT32, FP32 and BOOL.
    triton = start_triton(_bind_odd_outputs)
    body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/text/infer", json.dumps(body).encode())
    assert status == 200, raw
    assert json.loads(raw)["outputs"] == [
        {"name": "i", "datatype": "BYTES", "shape": [2, 1], "data": ["7", "8"]},
        {"name": "f", "datatype": "BYTES", "shape": [1, 2], "data": ["0.10000000149011612", "7.5"]},
        {"name": "b", "datatype": "BYTES", "shape": [1, 1], "data": ["True"]},
    ]


def test_fp16_in_typed_grpc_contents_is_refused_in_tritons_words(start_triton: Any) -> None:
    triton = start_triton(_bind_odd_outputs)
    request_message = service_pb2.ModelInferRequest(model_name="half")
    tensor = request_message.inputs.add(name="h", datatype="FP16", shape=[1, 1])
    tensor.contents.fp32_contents.append(1.5)
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_message)
    # nvidia-pytriton 0.7.0's answer, word for word
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected explicit tensor data for input tensor 'h' for model 'half' of type 'FP32', expected datatype "
        "'FP16'",
    )


def test_fp16_in_json_is_refused_in_tritons_words(start_triton: Any) -> None:
    triton = start_triton(_bind_odd_outputs)
    body = {"inputs": [{"name": "h", "datatype": "FP16", "shape": [1, 1], "data": [1.5]}]}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/half/infer", json.dumps(body).encode())
    # nvidia-pytriton 0.7.0's answer, word for word
    message = "receiving FP16 data via JSON is not supported. Please use the binary data format for input h"
    assert (status, json.loads(raw)) == (400, {"error": message})


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp16_and_bf16_outputs_asked_for_as_json_are_refused_in_tritons_words(start_triton: Any, datatype: str) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7) answered 400 with this message to /infer and /generate alike; a client
    # that asks for no binary outputs (kserve's InferenceRESTClient, curl) meets it, as it would there.
    triton = start_triton(_bind_odd_outputs)
    model = f"/v2/models/to_{datatype.lower()}"
    message = f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
    body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 2]}]}
    for outputs in (None, [{"name": "n"}], [{"name": "n", "parameters": {"binary_data": False}}]):
        if outputs is not None:
            body["outputs"] = outputs
        status, _, raw = request(triton.http_port, "POST", f"{model}/infer", json.dumps(body).encode())
        assert (status, json.loads(raw)) == (400, {"error": message}), outputs
    status, _, raw = request(triton.http_port, "POST", f"{model}/generate", b'{"a": [0.5, 2]}')
    assert (status, json.loads(raw)) == (400, {"error": message})
    body["outputs"] = [{"name": "n", "parameters": {"binary_data": True}}]
    status, headers, raw = request(triton.http_port, "POST", f"{model}/infer", json.dumps(body).encode())
    assert status == 200 and len(raw) - int(headers["inference-header-content-length"]) == 4  # two 2-byte values


def _input(name: str, datatype: str, shape: List[int], data: Any) -> Dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


# What nvidia-pytriton 0.7.0 answered these requests to `add`, word for word.
_HTTP_ERRORS = {
    "batch sizes differ": (
        {"inputs": [_input("a", "FP32", [1, 2], [1, 2]), _input("b", "FP32", [2, 2], [3, 4, 5, 6])]},
        "[request id: <id_unknown>] input 'a' batch size does not match other inputs for 'add'",
    ),
    "unknown datatype": (
        {"inputs": [_input("a", "FOO", [1, 2], [1, 2]), _input("b", "FP32", [1, 2], [3, 4])]},
        "invalid datatype for input a",
    ),
    "parameter of no JSON type taken": (
        {
            "inputs": [_input("a", "FP32", [1, 2], [1, 2]), _input("b", "FP32", [1, 2], [3, 4])],
            "parameters": {"x": [1]},
        },
        "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    # a `triton_` key is refused before its value's type is read (this server named the type)
    "reserved key of no JSON type": (
        {
            "inputs": [_input("a", "FP32", [1, 2], [1, 2]), _input("b", "FP32", [1, 2], [3, 4])],
            "parameters": {"triton_enable_empty_final_response": [1]},
        },
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
    ),
}


@pytest.mark.parametrize("case", sorted(_HTTP_ERRORS))
def test_http_refusals_in_tritons_words(triton: Triton, case: str) -> None:
    body, message = _HTTP_ERRORS[case]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", json.dumps(body).encode())
    assert (status, json.loads(raw)) == (400, {"error": message})


def test_grpc_refusals_in_tritons_words(triton: Triton) -> None:
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(_floats(1, 2))
    request_message = service_pb2.ModelInferRequest(model_name="add")
    for infer_input in inputs:
        request_message.inputs.append(infer_input._get_tensor())
        request_message.raw_input_contents.append(infer_input._get_content())
    stub = service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
    answers = {}
    for case, value in (("zero", 0), ("string", "2")):
        asked = service_pb2.ModelInferRequest()
        asked.CopyFrom(request_message)
        output = asked.outputs.add(name="sum")
        if isinstance(value, str):
            output.parameters["classification"].string_param = value
        else:
            output.parameters["classification"].int64_param = value
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(asked, metadata=list(GRPC_AUTH.items()))
        answers[case] = (refused.value.code(), refused.value.details())
    unknown_type = service_pb2.ModelInferRequest()
    unknown_type.CopyFrom(request_message)
    unknown_type.inputs[0].datatype = "FOO"
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(unknown_type)
    answers["datatype"] = (refused.value.code(), refused.value.details())
    for version in ("abc", "-1"):
        statistics = service_pb2.ModelStatisticsRequest(name="add", version=version)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelStatistics(statistics, metadata=list(GRPC_AUTH.items()))
        answers[f"statistics {version}"] = (refused.value.code(), refused.value.details())
    index = service_pb2.RepositoryIndexRequest(repository_name="x")
    with pytest.raises(grpc.RpcError) as refused:
        stub.RepositoryIndex(index, metadata=list(GRPC_AUTH.items()))
    answers["repository"] = (refused.value.code(), refused.value.details())
    logging = service_pb2.LogSettingsRequest()
    logging.settings["log_format"].string_param = "xml"
    with pytest.raises(grpc.RpcError) as refused:
        stub.LogSettings(logging, metadata=list(GRPC_AUTH.items()))
    answers["log format"] = (refused.value.code(), refused.value.details())
    client.close()
    assert answers == {
        "zero": (grpc.StatusCode.INVALID_ARGUMENT, "invalid value for 'classification' parameter, expected >= 0"),
        "string": (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid value type for 'classification' parameter, expected int64_param",
        ),
        "datatype": (
            grpc.StatusCode.INVALID_ARGUMENT,
            "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'add' expects 'FP32'",
        ),
        "statistics abc": (
            grpc.StatusCode.INVALID_ARGUMENT,
            "failed to get model version from specified version string 'abc' (details: stol), version should be an "
            "integral value > 0",
        ),
        "statistics -1": (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
        "repository": (grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported"),
        "log format": (grpc.StatusCode.INVALID_ARGUMENT, "invalid argument for log_format, got: xml"),
    }


def test_server_metadata_lists_the_extensions_in_tritons_order(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: classification, sequence, model_repository, model_repository(unload_dependents),
    # schedule_policy, model_configuration, system_shared_memory, cuda_shared_memory, binary_tensor_data, parameters,
    # statistics, trace, logging. This server leaves cuda_shared_memory out (as before) and lists generate.
    status, _, raw = request(triton.http_port, "GET", "/v2")
    assert status == 200
    assert json.loads(raw)["extensions"] == [
        "classification",
        "sequence",
        "model_repository",
        "model_repository(unload_dependents)",
        "schedule_policy",
        "model_configuration",
        "system_shared_memory",
        "binary_tensor_data",
        "parameters",
        "statistics",
        "generate",
        "trace",
        "logging",
    ]


def test_an_output_named_twice_takes_its_first_namings_parameters(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: `sum` named with binary_data, then without, came binary; the other way round, as JSON
    # (this server took the last naming's).
    ab = [_input(name, "FP32", [1, 2], [1, 2]) for name in ("a", "b")]
    answers = []
    for first, second in (({"binary_data": True}, {}), ({}, {"binary_data": True})):
        outputs = [{"name": "sum", "parameters": first}, {"name": "sum", "parameters": second}]
        body = json.dumps({"inputs": ab, "outputs": outputs}).encode()
        status, headers, raw = request(triton.http_port, "POST", "/v2/models/add/infer", body)
        assert status == 200, raw
        answers.append("inference-header-content-length" in headers)
    assert answers == [True, False]


@pytest.mark.parametrize(
    ("length", "message"),
    [
        ("-1", "inference header size should be in range (0, 11), got: -1"),
        ("99999", "inference header size should be in range (0, 11), got: 99999"),
        (
            "0",
            "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs "
            "in 'add' model configuration",
        ),
    ],
)
def test_a_bad_inference_header_length_is_refused_in_tritons_words(triton: Triton, length: str, message: str) -> None:
    # nvidia-pytriton 0.7.0's answers, word for word
    headers = {"Inference-Header-Content-Length": length}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", b'{"x": "yz"}', headers)
    assert (status, json.loads(raw)) == (400, {"error": message})


def test_a_raw_body_is_one_string_of_a_bytes_input(triton: Triton) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0, a BYTES [1] model of max_batch_size 2) takes the whole body as the
    # one string of shape [1, 1] and answers it binary; this server refused it ("cannot carry BYTES data").
    body = b'{"not": "a header"}\x00\xff'
    headers = {"Inference-Header-Content-Length": "0"}
    status, answer_headers, raw = request(triton.http_port, "POST", "/v2/models/policy/infer", body, headers)
    assert status == 200, raw
    length = int(answer_headers["inference-header-content-length"])
    document = json.loads(raw[:length])
    assert document["outputs"] == [
        {"name": "y", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 4 + len(body)}}
    ]
    assert raw[length:] == len(body).to_bytes(4, "little") + body


def test_a_raw_body_of_the_wrong_size_is_refused_in_tritons_words(triton: Triton) -> None:
    # tritonserver 2.51 deduces the -1 dimension from the body's size, rounded down, then checks the byte size
    # (182 bytes to an FP32 [-1] model: "Expected 180, got 182"); this server said the body "does not fit".
    headers = {"Inference-Header-Content-Length": "0"}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/nobatch/infer", bytes(14), headers)
    message = "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'nobatch'. "
    assert (status, json.loads(raw)) == (400, {"error": message + "Expected 12, got 14"})


_BATCH_SIZES_DIFFER = "[request id: <id_unknown>] input 'a' batch size does not match other inputs for 'add'"


@pytest.mark.parametrize(
    ("inputs", "binary", "message"),
    [
        (
            [
                {"name": "a", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
                _input("b", "INT32", [2, 2], [1, 2, 3, 4]),
            ],
            bytes(8),
            _BATCH_SIZES_DIFFER,
        ),
        (
            [_input("a", "INT32", [], [1]), _input("b", "FP32", [1, 2], [1, 2])],
            b"",
            "[request id: <id_unknown>] input 'a' has no shape but model requires batch dimension for 'add'",
        ),
    ],
    ids=["batch sizes before a datatype", "no shape before a datatype"],
)
def test_batch_dimensions_are_checked_before_other_refusals_as_in_triton(
    triton: Triton, inputs: List[Dict[str, Any]], binary: bytes, message: str
) -> None:
    # tritonserver 2.51's core reads every input's batch dimension (the last input first) before any input's
    # datatype, shape or byte size (measured with nvidia-pytriton 0.7.0); this server named b's datatype, a's.
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", header + binary, headers)
    assert (status, json.loads(raw)) == (400, {"error": message})


def test_grpc_batch_sizes_are_checked_before_byte_sizes_as_in_triton(triton: Triton) -> None:
    # tritonserver 2.51: the batch sizes differ; this server named a's byte size (7 bytes for [1, 2] FP32).
    message = service_pb2.ModelInferRequest(model_name="add")
    message.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    message.inputs.add(name="b", datatype="FP32", shape=[2, 2])
    message.raw_input_contents.extend([bytes(7), bytes(16)])
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, _BATCH_SIZES_DIFFER)


@pytest.mark.parametrize(
    ("datatype", "message"),
    [
        (
            "FP8",
            "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'add' expects 'FP32'",
        ),
        ("", "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'add' expects 'FP32'"),
        (5, "Unable to parse 'datatype': attempt to access JSON non-string as string"),  # Triton's 500
    ],
    ids=["unknown", "empty", "no string"],
)
def test_an_unknown_datatype_of_binary_data_is_the_cores_refusal(triton: Triton, datatype: Any, message: str) -> None:
    # tritonserver 2.51's frontend reads binary data without its datatype, and its core refuses the datatype (as
    # "<invalid>", measured with nvidia-pytriton 0.7.0); JSON data of it is the frontend's "invalid datatype for
    # input a". This server answered "invalid datatype" to both.
    inputs = [
        {"name": "a", "datatype": datatype, "shape": [1, 2], "parameters": {"binary_data_size": 8}},
        _input("b", "FP32", [1, 2], [1, 2]),
    ]
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", header + bytes(8), headers)
    assert (status, json.loads(raw)) == (400, {"error": message})


def test_an_unknown_input_is_named_before_another_inputs_refusal_as_in_triton(triton: Triton) -> None:
    # tritonserver 2.51 looks every input up before it checks any input's datatype or shape (nvidia-pytriton 0.7.0,
    # a model without batching, either order of the two); this server named b's datatype (gRPC) when the unknown
    # input came first.
    inputs = [_input("nope", "FP32", [2], [1, 2]), _input("b", "INT32", [2], [1, 2])]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/pair/infer", json.dumps({"inputs": inputs}))
    message = service_pb2.ModelInferRequest(model_name="pair")
    message.inputs.add(name="nope", datatype="FP32", shape=[2])
    message.inputs.add(name="b", datatype="INT32", shape=[2])
    message.raw_input_contents.extend([bytes(8), bytes(8)])
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    refusal = "unexpected inference input 'nope' for model 'pair'"
    assert (status, json.loads(raw)) == (400, {"error": refusal})
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


_SOURCES = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
    "'shared_memory_region' in 'parameters'. But "
)


@pytest.mark.parametrize(
    ("tensor", "given"),
    [
        (
            {"name": 5, "datatype": "FP32", "shape": [1, 2], "data": [1, 2], "parameters": {"binary_data_size": 8}},
            "set 'data' 'binary_data_size'",
        ),
        ({"datatype": "FP32", "shape": [1, 2]}, "no field is set"),
        (
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [1, -2],
                "parameters": {"binary_data_size": None, "shared_memory_region": "x"},
            },
            "set 'binary_data_size' 'shared_memory_region'",
        ),
    ],
    ids=["before the name's type", "before a missing name", "before the shape"],
)
def test_an_inputs_sources_of_data_are_checked_first_as_in_triton(
    triton: Triton, tensor: Dict[str, Any], given: str
) -> None:
    # tritonserver 2.51's frontend checks that an input has one source of data before it reads the input's name,
    # datatype and shape (nvidia-pytriton 0.7.0); this server refused the name or the shape first.
    inputs = [tensor, _input("b", "FP32", [1, 2], [1, 2])]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", json.dumps({"inputs": inputs}))
    assert (status, json.loads(raw)) == (400, {"error": _SOURCES + given})


def test_inputs_are_listed_in_the_order_of_tritons_hash_map(triton: Triton) -> None:
    # tritonserver 2.51 lists (and checks) a request's inputs in its std::unordered_map's order, which follows
    # the names' hashes: k, a, b come as a, b, k (14 sets of 3 to 7 names matched nvidia-pytriton 0.7.0's
    # answers); this server listed them last first (b, a, k).
    inputs = [_input(name, "FP32", [1, 2], [1, 2]) for name in ("k", "a", "b")]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", json.dumps({"inputs": inputs}))
    message = (
        "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add'. Got input(s) ['a','b','k'], "
        "but missing required input(s) ]. Please provide all required input(s)."
    )
    assert (status, json.loads(raw)) == (400, {"error": message})


@pytest.mark.parametrize(("order", "named"), [("kab", "a"), ("bak", "a"), ("akb", "b")])
def test_of_several_bad_inputs_the_one_tritons_hash_map_visits_first_is_named(
    triton: Triton, order: str, named: str
) -> None:
    # Every input's datatype is wrong; tritonserver 2.51 names the first its hash map visits (all 6 orders of k, a, b
    # matched nvidia-pytriton 0.7.0 over HTTP and gRPC); this server named the last (b, k and b here).
    inputs = [_input(name, "INT32", [2], [1, 2]) for name in order]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/triple/infer", json.dumps({"inputs": inputs}))
    message = service_pb2.ModelInferRequest(model_name="triple")
    for name in order:
        message.inputs.add(name=name, datatype="INT32", shape=[2])
        message.raw_input_contents.append(bytes(8))
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    refusal = (
        f"[request id: <id_unknown>] inference input '{named}' data-type is 'INT32', but model 'triple' expects 'FP32'"
    )
    assert (status, json.loads(raw)) == (400, {"error": refusal})
    assert raised.value.details() == refusal


def test_a_generate_request_short_of_inputs_is_refused_in_tritons_words(triton: Triton) -> None:
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/generate", json.dumps({"a": [1.0]}))
    # nvidia-pytriton 0.7.0's answer, word for word
    message = (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add'. Got input(s) ['a'], but "
        "missing required input(s) ['b']. Please provide all required input(s)."
    )
    assert (status, json.loads(raw)) == (400, {"error": message})


def test_of_several_bad_inputs_the_last_is_named_as_triton_names_it(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0, both inputs of `add` sent without a batch dimension, over HTTP and gRPC alike:
    # "[request id: <id_unknown>] unexpected shape for input 'b' for model 'add'. Expected [-1,-1], got [2]. ..."
    # (Triton checks them in its hash map's order, which visits b first; this server named `a`.)
    ab = [_input(name, "FP32", [2], [1, 2]) for name in ("a", "b")]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", json.dumps({"inputs": ab}))
    answers = [(status, json.loads(raw)["error"].split(".")[0])]
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput(name, [2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(np.array([1, 2], np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("add", inputs)
    client.close()
    answers.append((400, str(refused.value.message()).split(".")[0]))
    expected = "[request id: <id_unknown>] unexpected shape for input 'b' for model 'add'"
    assert answers == [(400, expected)] * 2


def test_an_output_named_twice_with_class_counts(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: over gRPC `sum` named with classification 1 then 2 came as 1 class, named plain then
    # with classification 1 as 1 class (this server took the last count); over HTTP a bad count in the second naming
    # failed the request ({"error":"Unable to set 'classification': attempt to access JSON non-unsigned-integer as
    # unsigned-integer"}, a 500 this server answers 400) where this server skipped it.
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    inputs = [grpcclient.InferInput(name, [1, 2], "FP32") for name in ("a", "b")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(_floats(1, 2))
    shapes = []
    for counts in ((1, 2), (0, 1)):
        outputs = [grpcclient.InferRequestedOutput("sum", class_count=count) for count in counts]
        shapes.append(client.infer("add", inputs, outputs=outputs).as_numpy("sum").shape)
    client.close()
    assert shapes == [(1, 1), (1, 1)]
    ab = [_input(name, "FP32", [1, 2], [1, 2]) for name in ("a", "b")]
    outputs = [{"name": "sum"}, {"name": "sum", "parameters": {"classification": -1}}]
    status, _, raw = request(
        triton.http_port, "POST", "/v2/models/add/infer", json.dumps({"inputs": ab, "outputs": outputs})
    )
    assert (status, json.loads(raw)) == (
        400,
        {"error": "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"},
    )


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("trace_rate", "4294967295", "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: "),
        ("log_frequency", "99999999999999", "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ]"),
        ("trace_count", "2147483648", "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: "),
        ("trace_count", "-2", "Unable to parse 'trace_count'. Expecting value >= -1, got:"),
    ],
)
def test_trace_settings_beyond_tritons_integers_are_refused(
    triton: Triton, setting: str, value: str, message: str
) -> None:
    # nvidia-pytriton 0.7.0 (tritonserver 2.51), over HTTP, per model too, and gRPC (INVALID_ARGUMENT):
    # {"error":"Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 4294967295"}
    # (this server took any size and reported it back); below -1 over HTTP "... Expecting value >= -1, got:-2", no
    # space, and over gRPC "... got: -2", with one (this server left it out over gRPC too)
    expected = f"{message}{value}" if message.endswith("got:") else f"{message.split(', got')[0]}, got: {value}"
    grpc_expected = f"{message} {value}" if message.endswith("got:") else expected
    for path in ("/v2/trace/setting", "/v2/models/add/trace/setting"):
        status, _, raw = request(triton.http_port, "POST", path, json.dumps({setting: value}), HTTP_AUTH)
        assert (status, json.loads(raw)) == (400, {"error": expected})
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    asked = service_pb2.TraceSettingRequest()
    asked.settings[setting].value.append(value)
    with pytest.raises(grpc.RpcError) as refused:
        stub.TraceSetting(asked, metadata=list(GRPC_AUTH.items()), timeout=10)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, grpc_expected)
    status, _, raw = request(triton.http_port, "GET", "/v2/trace/setting", headers=HTTP_AUTH)
    assert json.loads(raw)[setting] != value


def test_a_repository_name_is_answered_as_triton_answers_it(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: POST /v2/repository/x/index answered 200 with the index (the name ignored); a load or
    # unload under /v2/repository/x/models/... 501 {"error":"'repository_name' specification is not supported"};
    # gRPC RepositoryModelLoad and RepositoryModelUnload with a repository_name UNIMPLEMENTED, the same words
    # (this server answered 404 over HTTP and loaded or unloaded the model over gRPC).
    unsupported = "'repository_name' specification is not supported"
    status, _, raw = request(triton.http_port, "POST", "/v2/repository/x/index", "{}", HTTP_AUTH)
    assert status == 200
    assert {"name": "add", "version": "1", "state": "READY"} in json.loads(raw)
    for action in ("load", "unload"):
        status, _, raw = request(triton.http_port, "POST", f"/v2/repository/x/models/add/{action}", "{}", HTTP_AUTH)
        assert (status, json.loads(raw)) == (501, {"error": unsupported})
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    metadata = list(GRPC_AUTH.items())
    for rpc, message in (
        (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name="add", repository_name="x")),
        (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name="add", repository_name="x")),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            rpc(message, metadata=metadata, timeout=10)
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, unsupported)
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add"), metadata=metadata, timeout=10).ready


def test_grpc_load_parameters_are_checked_as_tritons_grpc_frontend_checks_them(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: RepositoryModelLoad with a parameter `foo` (of any type, for a model known or not)
    # answered INVALID_ARGUMENT "unrecognized load parameter 'foo'."; with an int64 `config` INVALID_ARGUMENT
    # "invalid value type for load parameter 'config', expected string_param." (this server: INTERNAL, "failed to
    # load ..."). An unload's parameters it ignored.
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    metadata = list(GRPC_AUTH.items())
    unknown = service_pb2.RepositoryModelLoadRequest(model_name="nosuch")
    unknown.parameters["foo"].bool_param = True
    config = service_pb2.RepositoryModelLoadRequest(model_name="add")
    config.parameters["config"].int64_param = 1
    # tritonserver 2.51, measured: a file override sent as a string_param is refused so, not polled (INTERNAL).
    file = service_pb2.RepositoryModelLoadRequest(model_name="add")
    file.parameters["file:1/model.py"].string_param = "x"
    answers = []
    for message in (unknown, config, file):
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryModelLoad(message, metadata=metadata, timeout=10)
        answers.append((refused.value.code(), refused.value.details()))
    assert answers == [
        (grpc.StatusCode.INVALID_ARGUMENT, "unrecognized load parameter 'foo'."),
        (grpc.StatusCode.INVALID_ARGUMENT, "invalid value type for load parameter 'config', expected string_param."),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid value type for load parameter 'file:1/model.py', expected bytes_param.",
        ),
    ]


def test_the_http_repository_index_reads_its_body(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: {"ready": true} lists the ready models only (this server ignored the body and listed
    # every model); an unreadable body 500 {"error":"failed to parse the request JSON buffer: ..."}; a "ready" that
    # is no boolean 500 {"error":"attempt to access JSON non-boolean as boolean"}; a body of `[]` 200. This server
    # answers the two bad bodies 400, as every bad body (PROTOCOL.md: invalid argument 400), in Triton's words.
    index = "/v2/repository/index"
    status, _, raw = request(triton.http_port, "POST", "/v2/repository/models/nobatch/unload", "", HTTP_AUTH)
    assert status == 200, raw
    try:
        deadline = time.monotonic() + 10  # the unload answers at once, as Triton's: UNLOADING until it has ended
        while '"UNLOADING"' in request(triton.http_port, "POST", index, "", HTTP_AUTH)[2].decode():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        listed = {}
        for body in ("", "[]", '{"ready": false}', '{"ready": true}'):
            status, _, raw = request(triton.http_port, "POST", index, body, HTTP_AUTH)
            assert status == 200, raw
            listed[body] = {entry["name"]: entry["state"] for entry in json.loads(raw)}
        assert (
            listed[""]["nobatch"] == listed["[]"]["nobatch"] == listed['{"ready": false}']["nobatch"] == "UNAVAILABLE"
        )
        assert "nobatch" not in listed['{"ready": true}'] and listed['{"ready": true}']["add"] == "READY"
        status, _, raw = request(triton.http_port, "POST", index, "{", HTTP_AUTH)
        assert status == 400 and json.loads(raw)["error"].startswith("failed to parse the request JSON buffer: ")
        status, _, raw = request(triton.http_port, "POST", index, '{"ready": "yes"}', HTTP_AUTH)
        assert (status, json.loads(raw)) == (400, {"error": "attempt to access JSON non-boolean as boolean"})
    finally:
        status, _, raw = request(triton.http_port, "POST", "/v2/repository/models/nobatch/load", "", HTTP_AUTH)
        assert status == 200, raw


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [
        ("gzip;q=0", None),
        ("gzip;q=0, deflate", "deflate"),
        ("deflate, gzip", "deflate"),
        ("deflate;q=0.5, gzip;q=0.9", "gzip"),
        ("gzip;q=0.001", "gzip"),
        ("identity", None),
        ("*", None),
        ("identity, gzip", None),
        ("gzip, identity", "gzip"),
        ("deflate;q=0.3, identity;q=0.4", None),
        ("identity;q=0, gzip;q=0", None),
    ],
)
def test_the_response_encoding_follows_accept_encodings_weights(triton: Triton, accept: str, encoding: Any) -> None:
    # nvidia-pytriton 0.7.0, each case measured: a weight of 0 refuses, the highest weight wins, the first listed
    # of equal weights (this server chose gzip whenever it was named, even at q=0), `identity` weighed as the
    # others are (this server passed it over: `identity, gzip` was answered gzip)
    ab = [_input(name, "FP32", [1, 2], [1, 2]) for name in ("a", "b")]
    body = json.dumps({"inputs": ab})
    status, headers, _ = request(triton.http_port, "POST", "/v2/models/add/infer", body, {"Accept-Encoding": accept})
    assert (status, headers.get("content-encoding")) == (200, encoding)


def test_an_http_1_0_keep_alive_is_answered_with_keep_alive(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0 answered `GET /v2/health/live HTTP/1.0` with `Connection: keep-alive` when asked for it
    # and kept the connection; this server kept it without saying so, and an HTTP/1.0 client (ab -k) closes then.
    with socket.create_connection(("127.0.0.1", triton.http_port), timeout=10) as connection:
        heads = []
        for _ in range(2):
            connection.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(4096)
                assert chunk, head
                head += chunk
            heads.append(head.lower())
    assert all(b" 200 ok\r\n" in head and b"\r\nconnection: keep-alive\r\n" in head for head in heads), heads


def test_a_trace_level_without_a_trace_file_is_refused_in_tritons_words(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0 (trace mode triton, no trace file): a trace_level other than OFF, for the server or one
    # model, over HTTP 400 and gRPC INVALID_ARGUMENT {"error":"Attempting to set invalid trace setting :trace file
    # name is not given"}, the settings left as they were (this server took it and traced nothing, silently).
    refusal = "Attempting to set invalid trace setting :trace file name is not given"
    for path in ("/v2/trace/setting", "/v2/models/add/trace/setting"):
        for level in (["TIMESTAMPS"], ["TENSORS"]):
            body = json.dumps({"trace_level": level, "trace_rate": "3"})
            status, _, raw = request(triton.http_port, "POST", path, body, HTTP_AUTH)
            assert (status, json.loads(raw)) == (400, {"error": refusal})
        status, _, raw = request(triton.http_port, "GET", path, headers=HTTP_AUTH)
        assert (json.loads(raw)["trace_level"], json.loads(raw)["trace_rate"]) == (["OFF"], "1000")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    asked = service_pb2.TraceSettingRequest(model_name="add")
    asked.settings["trace_level"].value.append("TIMESTAMPS")
    with pytest.raises(grpc.RpcError) as refused:
        stub.TraceSetting(asked, metadata=list(GRPC_AUTH.items()), timeout=10)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)
    status, _, raw = request(triton.http_port, "POST", "/v2/trace/setting", '{"trace_level": ["OFF"]}', HTTP_AUTH)
    assert status == 200, raw


def test_a_trace_level_with_a_trace_file_is_taken(start_triton: Any, caplog: pytest.LogCaptureFixture) -> None:
    # With a trace file Triton takes the level and writes its traces there (tests/test_trace_files.py), as here.
    triton = start_triton(lambda server: None, trace_config=["triton,file=/nonexistent/trace.json"])
    body = json.dumps({"trace_level": ["TIMESTAMPS"]})
    status, _, raw = request(triton.http_port, "POST", "/v2/trace/setting", body, HTTP_AUTH)
    assert (status, json.loads(raw)["trace_level"]) == (200, ["TIMESTAMPS"])
    assert "trace" not in caplog.text.lower()


def test_a_models_trace_setting_has_no_versioned_route(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: GET /v2/models/add/versions/1/trace/setting 404 {"error":"Not Found"} (this server
    # answered the model's settings)
    status, _, raw = request(triton.http_port, "GET", "/v2/models/add/versions/1/trace/setting", headers=HTTP_AUTH)
    assert (status, json.loads(raw)) == (404, {"error": "Not Found"})
    status, _, raw = request(triton.http_port, "GET", "/v2/models/add/trace/setting", headers=HTTP_AUTH)
    assert status == 200, raw


def _refusal(call: Any) -> Any:
    """(code, details) of the gRPC error `call()` raises."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code(), refused.value.details()


def test_a_trace_level_with_a_rate_of_0_is_refused_for_its_rate_first(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0 (trace mode triton, no trace file), with trace_rate 0 then trace_level TIMESTAMPS, over
    # gRPC and HTTP: INVALID_ARGUMENT / 400 "Attempting to set invalid trace setting :sample rate must be non-zero"
    # (Triton checks the rate before the trace file; this server named the missing file)
    refusal = "Attempting to set invalid trace setting :sample rate must be non-zero"
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    metadata = list(GRPC_AUTH.items())
    zero = service_pb2.TraceSettingRequest()
    zero.settings["trace_rate"].value.append("0")
    assert stub.TraceSetting(zero, metadata=metadata, timeout=10).settings["trace_rate"].value == ["0"]
    try:
        level = service_pb2.TraceSettingRequest(model_name="add")
        level.settings["trace_level"].value.append("TIMESTAMPS")
        refused = _refusal(lambda: stub.TraceSetting(level, metadata=metadata, timeout=10))
        assert refused == (grpc.StatusCode.INVALID_ARGUMENT, refusal)
        body = json.dumps({"trace_level": ["TIMESTAMPS"], "trace_rate": "5"})  # a rate of its own: the file is missing
        status, _, raw = request(triton.http_port, "POST", "/v2/models/add/trace/setting", body, HTTP_AUTH)
        assert (status, json.loads(raw)) == (
            400,
            {"error": "Attempting to set invalid trace setting :trace file name is not given"},
        )
        status, _, raw = request(
            triton.http_port, "POST", "/v2/trace/setting", '{"trace_level": ["TENSORS"]}', HTTP_AUTH
        )
        assert (status, json.loads(raw)) == (400, {"error": refusal})
    finally:
        zero.settings["trace_rate"].ClearField("value")  # no value: back to the server's startup rate
        assert stub.TraceSetting(zero, metadata=metadata, timeout=10).settings["trace_rate"].value == ["1000"]


def test_a_trace_rate_of_0_under_a_trace_level_is_refused(start_triton: Any) -> None:
    # Triton refuses any change that leaves a level on with a rate of 0, whichever setting the change names
    triton = start_triton(lambda server: None, trace_config=["triton,file=/nonexistent/trace.json"])
    status, _, raw = request(
        triton.http_port, "POST", "/v2/trace/setting", '{"trace_level": ["TIMESTAMPS"]}', HTTP_AUTH
    )
    assert status == 200, raw
    status, _, raw = request(triton.http_port, "POST", "/v2/trace/setting", '{"trace_rate": "0"}', HTTP_AUTH)
    assert (status, json.loads(raw)) == (
        400,
        {"error": "Attempting to set invalid trace setting :sample rate must be non-zero"},
    )
    status, _, raw = request(
        triton.http_port, "POST", "/v2/trace/setting", '{"trace_level": ["OFF"], "trace_rate": "0"}', HTTP_AUTH
    )
    assert (status, json.loads(raw)["trace_rate"]) == (200, "0")  # tracing off: any rate


def test_a_log_setting_with_no_value_is_refused_as_a_value_of_the_wrong_type(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: LogSettings with a `log_info` entry whose value is unset: INVALID_ARGUMENT "expect
    # boolean for 'log_info'" (this server took it as no change and answered the settings)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    metadata = list(GRPC_AUTH.items())
    answers = []
    for key in ("log_info", "log_verbose_level", "log_format"):
        asked = service_pb2.LogSettingsRequest()
        asked.settings[key].SetInParent()  # an entry with no value
        answers.append(_refusal(lambda asked=asked: stub.LogSettings(asked, metadata=metadata, timeout=10)))
    assert answers == [
        (grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_info'"),
        (grpc.StatusCode.INVALID_ARGUMENT, "expect int32 for 'log_verbose_level'"),
        (grpc.StatusCode.INVALID_ARGUMENT, "expect string for 'log_format'"),
    ]


def test_an_unload_dependents_that_is_no_bool_is_refused(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0: RepositoryModelUnload with unload_dependents as a string_param: INVALID_ARGUMENT "invalid
    # value type for 'unload_dependents' parameter, expected bool_param." and the model stays (this server unloaded it)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(triton)))
    metadata = list(GRPC_AUTH.items())
    asked = service_pb2.RepositoryModelUnloadRequest(model_name="nobatch")
    asked.parameters["unload_dependents"].string_param = "yes"
    assert _refusal(lambda: stub.RepositoryModelUnload(asked, metadata=metadata, timeout=10)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'unload_dependents' parameter, expected bool_param.",
    )
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="nobatch"), metadata=metadata, timeout=10).ready


def _head_lines(port: int, raw: bytes) -> List[bytes]:
    """The header lines of the response to one raw request, as sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(raw)
        head, _ = _read_head(connection)
    return head.split(b"\r\n")[1:]


def _read_head(connection: socket.socket) -> Tuple[bytes, bytes]:
    """A response's head, read whole from the connection, and what was read after it."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65536)
        assert chunk, received
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


def test_response_headers_are_named_as_tritonserver_writes_them(triton: Triton) -> None:
    # nvidia-pytriton 0.7.0's tritonserver writes `Content-Type`, `Inference-Header-Content-Length`, ...: names are
    # case-insensitive, but a script that greps Triton's bytes looks for these (this server wrote them lower-case).
    body = json.dumps(
        {
            "inputs": [{"name": name, "shape": [1, 1], "datatype": "FP32", "data": [1]} for name in ("a", "b")],
            "outputs": [{"name": "sum", "parameters": {"binary_data": True}}],
        }
    ).encode()
    infer = b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
    lines = _head_lines(triton.http_port, infer % len(body) + body)
    assert {line.split(b": ")[0] for line in lines} >= {
        b"Content-Type",
        b"Inference-Header-Content-Length",
        b"Content-Length",
    }
    ready = _head_lines(triton.http_port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"Connection: close" in ready and b"Content-Type: text/plain" in ready
    refused = _head_lines(triton.http_port, b"GET /v2/health/ready HTTP/1.1\r\nContent-Length: x\r\n\r\n")
    assert b"Content-Type: application/json" in refused and b"Connection: close" in refused
    coded = b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}"
    assert b"Accept-Encoding: gzip, deflate" in _head_lines(triton.http_port, coded)  # with Triton's 501


def _answer(connection: socket.socket, raw: bytes) -> bytes:
    """Send one raw request on an open connection; its whole response (a Content-Length one)."""
    connection.sendall(raw)
    head, body = _read_head(connection)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
    while len(body) < length:
        chunk = connection.recv(65536)
        assert chunk, head + body
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_method_the_parser_does_not_know_is_answered_as_tritonserver_answers_it(triton: Triton) -> None:
    # A method is any token (RFC 9110 9.1). tritonserver 2.51 answers one it does not serve 405 on its routes and 404
    # elsewhere, and keeps the connection; this server answered 400 and closed (llhttp knows a list of methods).
    with socket.create_connection(("127.0.0.1", triton.http_port), timeout=10) as connection:
        refused = _answer(connection, b"FOO /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert refused.startswith(b"HTTP/1.1 405 ") and refused.endswith(b'{"error":"Method Not Allowed"}')
        unknown = _answer(connection, b"BREW /v2/nope HTTP/1.1\r\nHost: x\r\n\r\n")
        assert unknown.startswith(b"HTTP/1.1 404 ")
        lower = _answer(connection, b"get /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")  # methods are case-sensitive
        assert lower.startswith(b"HTTP/1.1 405 ")
        ready = _answer(connection, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection
        assert ready.startswith(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize(
    ("outputs", "named"), [(["zeta", "alpha"], "alpha"), (["nope", ""], ""), (["sum", "b", "B", "a"], "B")]
)
def test_of_several_unknown_outputs_the_first_in_byte_order_is_named_as_in_triton(
    triton: Triton, outputs: List[str], named: str
) -> None:
    # tritonserver 2.51 keeps the requested outputs' names in an std::set and names the first it does not find
    # (nvidia-pytriton 0.7.0, HTTP and gRPC); this server named the first in the request's order.
    inputs = [_input(name, "FP32", [1, 2], [1, 2]) for name in ("a", "b")]
    body = json.dumps({"inputs": inputs, "outputs": [{"name": name} for name in outputs]})
    status, _, raw = request(triton.http_port, "POST", "/v2/models/add/infer", body)
    refusal = f"unexpected inference output '{named}' for model 'add'"
    assert (status, json.loads(raw)) == (400, {"error": refusal})
    message = service_pb2.ModelInferRequest(model_name="add")
    for name in ("a", "b"):
        message.inputs.add(name=name, datatype="FP32", shape=[1, 2])
        message.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    for name in outputs:
        message.outputs.add(name=name)
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


@pytest.mark.parametrize(
    ("model", "shape", "refusal"),
    [
        ("nobatch", [-1], "unexpected shape for input 'x' for model 'nobatch'. Expected [-1,3], got [-1]. "),
        ("nobatch", [2, -3], "unexpected shape for input 'x' for model 'nobatch'. Expected [-1,3], got [2,-3]. "),
        ("policy", [-1], "unexpected shape for input 'x' for model 'policy'. Expected [-1,1], got [-1]. NOTE: "),
        ("triple", [-5, 2], "unexpected shape for input 'a' for model 'triple'. Expected [-1], got [-5,2]. "),
    ],
)
def test_a_negative_dimension_in_a_shape_that_does_not_fit_gets_the_shape_refusal_as_in_triton(
    triton: Triton, model: str, shape: List[int], refusal: str
) -> None:
    # tritonserver 2.51's core checks a shape's rank and fixed dims before it reads a negative dimension (gRPC, which
    # takes any int64; nvidia-pytriton 0.7.0, seven shapes); this server refused `dims must be >= 0` first.
    message = service_pb2.ModelInferRequest(model_name=model)
    if model == "triple":
        for name in ("k", "a", "b"):
            message.inputs.add(name=name, datatype="FP32", shape=shape if name == "a" else [2])
            message.raw_input_contents.append(bytes(8))
    else:
        message.inputs.add(name="x", datatype="BYTES" if model == "policy" else "FP32", shape=shape)
        message.raw_input_contents.append(bytes(8))
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("[request id: <id_unknown>] " + refusal)


@pytest.mark.parametrize(
    ("shape", "data", "refusal"),
    [
        (
            [],
            [-96, 28],
            "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'pair' expects 'FP32'",
        ),
        (
            [0, 2],
            5,
            "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'pair' expects 'FP32'",
        ),
        ([2], [1, 2], "invalid datatype for input a"),
        ([2], 5, "Unable to parse 'data': attempt to access JSON non-array as array"),
    ],
)
def test_json_data_of_an_unknown_datatype_is_refused_as_in_triton(
    triton: Triton, shape: List[int], data: Any, refusal: str
) -> None:
    # nvidia-pytriton 0.7.0: tritonserver 2.51's frontend reads no data of a shape of no elements (a shape [] has
    # none to it), whatever its datatype, and its core then refuses the datatype; the data of other shapes must be
    # an array before the frontend finds it cannot read the datatype. This server refused `invalid datatype` first.
    inputs = [{"name": "a", "shape": shape, "datatype": "FP8", "data": data}, _input("b", "FP32", [2], [1, 2])]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/pair/infer", json.dumps({"inputs": inputs}))
    assert (status, json.loads(raw)) == (400, {"error": refusal})


def test_an_unknown_datatype_of_no_elements_after_a_refused_input_is_named_in_hash_map_order(triton: Triton) -> None:
    # b is refused first in the request's order; the core visits a, b, k and names a's datatype (see above).
    inputs = [
        _input("k", "FP32", [2], [1, 2]),
        _input("b", "INT32", [2], [1, 2]),
        {"name": "a", "shape": [], "datatype": "FP8", "data": 5},
    ]
    status, _, raw = request(triton.http_port, "POST", "/v2/models/triple/infer", json.dumps({"inputs": inputs}))
    refusal = (
        "[request id: <id_unknown>] inference input 'a' data-type is '<invalid>', but model 'triple' expects 'FP32'"
    )
    assert (status, json.loads(raw)) == (400, {"error": refusal})


_TRIPLE_RANGE = [_input("k", "FP32", [1], [1]), _input("a", "FP32", [2], [1e39, 1])]


@pytest.mark.parametrize(
    ("inputs", "model", "refusal"),
    [
        (
            [*_TRIPLE_RANGE, _input("b", "INT32", [2], [1, 2])],
            "triple",
            "[request id: <id_unknown>] inference input 'b' data-type is 'INT32', but model 'triple' expects 'FP32'",
        ),
        (
            [*_TRIPLE_RANGE, _input("b", "FP32", [2, 1], [1, 2])],
            "triple",
            "[request id: <id_unknown>] unexpected shape for input 'b' for model 'triple'. Expected [-1], got [2,1]. ",
        ),
        (
            [_input("k", "FP32", [4], [1e39, [1, 2]]), _input("a", "FP32", [1], [1]), _input("b", "FP32", [1], [1])],
            "triple",
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            [_input("a", "FP32", [1, 2], [1e39, 1]), _input("b", "FP32", [2, 2], [1, 2, 3, 4])],
            "add",
            "[request id: <id_unknown>] input 'a' batch size does not match other inputs for 'add'",
        ),
    ],
    ids=["a later input's datatype", "a later input's shape", "values too few", "batch sizes"],
)
def test_values_out_of_their_range_are_refused_after_any_refusal_triton_makes(
    triton: Triton, inputs: List[Dict[str, Any]], model: str, refusal: str
) -> None:
    # tritonserver 2.51 wraps integers around and makes floats infinite (1e39 as FP32): it refuses none of them, and
    # answers the request's other fault (nvidia-pytriton 0.7.0; its count refusal a 500). This server refused the
    # values first, where it reads them (`values outside the range of float32`).
    status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))
    assert (status, json.loads(raw)) == (400, {"error": refusal})
