"""gRPC unary RPCs through tritonclient.grpc, sync and aio, against a real server."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Union

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, grpc_url, http_url, running_triton


def _bf16_array(values: List[List[float]]) -> np.ndarray:
    """BF16 data as this tritonclient wants it: float32 up to r26.05, ml_dtypes.bfloat16 since r26.06."""
    probe = grpcclient.InferInput("probe", [1], "BF16")
    try:
        probe.set_data_from_numpy(np.zeros(1, np.float32))
    except InferenceServerException:
        import ml_dtypes

        return np.array(values, dtype=ml_dtypes.bfloat16)
    return np.array(values, dtype=np.float32)


# protocol datatype -> (Tensor dtype, the data sent and expected back)
DATATYPES: Dict[str, Any] = {
    "BOOL": (np.bool_, np.array([[True, False, True]])),
    "INT8": (np.int8, np.array([[-128, 0, 127]], dtype=np.int8)),
    "INT16": (np.int16, np.array([[-32768, 1, 32767]], dtype=np.int16)),
    "INT32": (np.int32, np.array([[-(2**31), 2, 2**31 - 1]], dtype=np.int32)),
    "INT64": (np.int64, np.array([[-(2**63), 3, 2**63 - 1]], dtype=np.int64)),
    "UINT8": (np.uint8, np.array([[0, 1, 255]], dtype=np.uint8)),
    "UINT16": (np.uint16, np.array([[0, 1, 65535]], dtype=np.uint16)),
    "UINT32": (np.uint32, np.array([[0, 1, 2**32 - 1]], dtype=np.uint32)),
    "UINT64": (np.uint64, np.array([[0, 1, 2**64 - 1]], dtype=np.uint64)),
    "FP16": (np.float16, np.array([[-1.5, 0.0, 65504.0]], dtype=np.float16)),
    "FP32": (np.float32, np.array([[-1.25, 0.5, 3.0e38]], dtype=np.float32)),
    "FP64": (np.float64, np.array([[-1.0e300, 0.1, 2.5]], dtype=np.float64)),
    "BF16": ("bfloat16", _bf16_array([[-2.0, 0.15625, 3.0e38]])),  # values exact in bfloat16
    "BYTES": (bytes, np.array([[b"a\x00", b"", b"\x00\xff\x00\x00"]], dtype=np.object_)),
}


def _echo_all(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{f"OUT_{name}": request[f"IN_{name}"] for name in DATATYPES} for request in requests]


def _parameters(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [
        {"PARAMS": np.array([[json.dumps(request.parameters, sort_keys=True).encode()]], dtype=np.object_)}
        for request in requests
    ]


def _fail(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise RuntimeError("the model broke")


def _decoupled(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"OUT": request["IN"]} for request in requests]


def _doubled_in_place(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    for request in requests:
        request["IN"] *= 2  # nvidia-pytriton 0.7's inputs are writable: callables do this
    return [{"OUT": request["IN"]} for request in requests]


def bind_models(triton: Triton) -> None:
    triton.bind(
        "in_place",
        _doubled_in_place,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "echo_all",
        _echo_all,
        inputs=[Tensor(name=f"IN_{name}", dtype=dtype, shape=(-1,)) for name, (dtype, _) in DATATYPES.items()],
        outputs=[Tensor(name=f"OUT_{name}", dtype=dtype, shape=(-1,)) for name, (dtype, _) in DATATYPES.items()],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "parameters",
        _parameters,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="PARAMS", dtype=bytes, shape=(1,))],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "fail",
        _fail,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "decoupled",
        _decoupled,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(bind_models, grpc_header_forward_pattern="^x-fwd-") as server:
        yield server


Call = Callable[[Callable[[Any], Union[Any, Awaitable[Any]]]], Any]


@pytest.fixture(params=["sync", "aio"])
def call(request: pytest.FixtureRequest, triton: Triton) -> Call:
    """Run `fn(client)` with a sync or an aio tritonclient.grpc client (awaiting it for aio)."""
    url = grpc_url(triton)
    if request.param == "sync":

        def run_sync(fn: Callable[[Any], Any]) -> Any:
            with grpcclient.InferenceServerClient(url) as client:
                return fn(client)

        return run_sync

    def run_aio(fn: Callable[[Any], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            client = aioclient.InferenceServerClient(url)
            try:
                return await fn(client)
            finally:
                await client.close()

        return asyncio.run(main())

    return run_aio


def _inputs(module: Any, arrays: Dict[str, np.ndarray], datatypes: Dict[str, str]) -> List[Any]:
    inputs = []
    for name, array in arrays.items():
        infer_input = module.InferInput(name, list(array.shape), datatypes[name])
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def _all_types_inputs() -> List[Any]:
    arrays = {f"IN_{name}": data for name, (_, data) in DATATYPES.items()}
    return _inputs(grpcclient, arrays, {f"IN_{name}": name for name in DATATYPES})


def _status(error: InferenceServerException) -> str:
    return str(error.status())


def test_health_rpcs(call: Call) -> None:
    assert call(lambda client: client.is_server_live()) is True
    assert call(lambda client: client.is_server_ready()) is True
    assert call(lambda client: client.is_model_ready("echo_all")) is True
    assert call(lambda client: client.is_model_ready("echo_all", "1")) is True
    assert call(lambda client: client.is_model_ready("echo_all", "2")) is False
    assert call(lambda client: client.is_model_ready("no_such_model")) is False


def test_server_metadata(call: Call) -> None:
    metadata = call(lambda client: client.get_server_metadata(as_json=True))
    assert metadata["name"] == "triton"
    assert metadata["version"]
    assert "statistics" in metadata["extensions"]


def test_model_metadata(call: Call) -> None:
    metadata = call(lambda client: client.get_model_metadata("echo_all", as_json=True))
    assert metadata["name"] == "echo_all"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "python"
    bf16 = next(tensor for tensor in metadata["inputs"] if tensor["name"] == "IN_BF16")
    assert bf16 == {"name": "IN_BF16", "datatype": "BF16", "shape": ["-1", "-1"]}
    assert [tensor["datatype"] for tensor in metadata["outputs"]] == list(DATATYPES)


def test_model_config_matches_http(call: Call, triton: Triton) -> None:
    response = call(lambda client: client.get_model_config("decoupled"))
    config = response.config
    assert isinstance(config, model_config_pb2.ModelConfig)
    assert config.name == "decoupled"
    assert config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled is True
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    with httpclient.InferenceServerClient(http_url(triton)) as http:
        from_http = json_format.ParseDict(
            http.get_model_config("decoupled"), model_config_pb2.ModelConfig(), ignore_unknown_fields=True
        )
    assert config == from_http


def test_model_config_of_batching_model(call: Call) -> None:
    config = call(lambda client: client.get_model_config("echo_all", as_json=True))["config"]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert {tensor["name"]: tensor["data_type"] for tensor in config["input"]}["IN_BYTES"] == "TYPE_STRING"


def test_every_datatype_round_trips(call: Call) -> None:
    result = call(lambda client: client.infer("echo_all", _all_types_inputs(), request_id="all-types"))
    response = result.get_response()
    assert response.id == "all-types"
    assert response.model_name == "echo_all"
    assert response.model_version == "1"
    assert len(response.raw_output_contents) == len(DATATYPES)
    for name, (_, sent) in DATATYPES.items():
        received = result.as_numpy(f"OUT_{name}")
        assert result.get_output(f"OUT_{name}").datatype == name
        assert received.shape == sent.shape, name
        if name == "BYTES":
            assert received.tolist() == sent.tolist()
        else:
            np.testing.assert_array_equal(received, sent, err_msg=name)


def test_requested_outputs_subset_in_the_callables_order(call: Call) -> None:
    # NVIDIA's PyTriton 0.7 answers the outputs in the order its callable returned them, not the request's.
    outputs = [grpcclient.InferRequestedOutput("OUT_FP64"), grpcclient.InferRequestedOutput("OUT_INT8")]
    result = call(lambda client: client.infer("echo_all", _all_types_inputs(), outputs=outputs))
    assert [output.name for output in result.get_response().outputs] == ["OUT_INT8", "OUT_FP64"]
    np.testing.assert_array_equal(result.as_numpy("OUT_INT8"), DATATYPES["INT8"][1])


def test_parameters_and_forwarded_headers_reach_the_callable(call: Call) -> None:
    inputs = _inputs(grpcclient, {"IN": np.zeros((1, 1), np.float32)}, {"IN": "FP32"})
    parameters = {"text": "hello", "count": 7, "flag": True, "ratio": 0.25}
    headers = {"x-fwd-tenant": "acme", "x-other": "hidden"}
    result = call(lambda client: client.infer("parameters", inputs, parameters=parameters, headers=headers))
    seen = json.loads(result.as_numpy("PARAMS")[0, 0])
    assert seen == {"count": 7, "flag": True, "ratio": 0.25, "text": "hello", "x-fwd-tenant": "acme"}


def test_a_headers_parameter_reaches_the_callable_as_tritonserver_hands_it_to_the_model(triton: Triton) -> None:
    # Triton's docs reserve "headers"; tritonserver 2.51 hands it to the model (tritonclient refuses to send it).
    request = service_pb2.ModelInferRequest(model_name="parameters")
    tensor = request.inputs.add(name="IN", datatype="FP32", shape=[1, 1])
    assert tensor is not None
    request.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    request.parameters["headers"].string_param = "h"
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert response.raw_output_contents[0][4:] == b'{"headers": "h"}'


@pytest.mark.parametrize("size", [4, 100_000])  # a message in one frame (protobuf's bytes), and one of many
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_inputs_reach_the_callable_writable(call: Call, size: int, compression: Any) -> None:
    data = np.arange(size, dtype=np.float32)
    inputs = _inputs(grpcclient, {"IN": data}, {"IN": "FP32"})
    result = call(lambda client: client.infer("in_place", inputs, compression_algorithm=compression))
    np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)


def test_priority_and_timeout_are_not_handed_to_the_callable(call: Call) -> None:
    inputs = _inputs(grpcclient, {"IN": np.zeros((1, 1), np.float32)}, {"IN": "FP32"})
    result = call(lambda client: client.infer("parameters", inputs, priority=1, timeout=10_000_000))
    assert json.loads(result.as_numpy("PARAMS")[0, 0]) == {}


def test_sequence_parameters_are_taken_and_ignored_as_triton_does_without_sequence_batching(call: Call) -> None:
    # nvidia-pytriton 0.7 answers them (its models have no sequence batching); they used to be refused here.
    inputs = _inputs(grpcclient, {"IN": np.zeros((1, 1), np.float32)}, {"IN": "FP32"})
    result = call(
        lambda client: client.infer("parameters", inputs, sequence_id=7, sequence_start=True, sequence_end=True)
    )
    assert json.loads(result.as_numpy("PARAMS")[0, 0]) == {}


def test_statistics(call: Call) -> None:
    inputs = _inputs(grpcclient, {"IN": np.zeros((1, 1), np.float32)}, {"IN": "FP32"})
    call(lambda client: client.infer("parameters", inputs))
    stats = call(lambda client: client.get_inference_statistics("parameters", headers=GRPC_AUTH, as_json=True))
    (entry,) = stats["model_stats"]
    assert entry["name"] == "parameters"
    assert entry["version"] == "1"
    assert int(entry["inference_stats"]["success"]["count"]) >= 1
    assert int(entry["execution_count"]) >= 1
    everything = call(lambda client: client.get_inference_statistics(headers=GRPC_AUTH, as_json=True))
    assert {"echo_all", "parameters", "fail", "decoupled"} <= {item["name"] for item in everything["model_stats"]}
    versioned = call(lambda client: client.get_inference_statistics("parameters", "1", headers=GRPC_AUTH, as_json=True))
    assert [item["version"] for item in versioned["model_stats"]] == ["1"]


def test_repository_index(call: Call) -> None:
    index = call(lambda client: client.get_model_repository_index(headers=GRPC_AUTH, as_json=True))
    entries = {entry["name"]: entry for entry in index["models"]}
    assert entries["echo_all"] == {"name": "echo_all", "version": "1", "state": "READY"}
    assert set(entries) == {"echo_all", "parameters", "fail", "decoupled", "in_place"}


def test_unload_then_load(call: Call, triton: Triton) -> None:
    inputs = _inputs(grpcclient, {"IN": np.zeros((1, 1), np.float32)}, {"IN": "FP32"})
    call(lambda client: client.unload_model("parameters", headers=GRPC_AUTH))
    try:
        assert call(lambda client: client.is_model_ready("parameters")) is False
        with pytest.raises(InferenceServerException) as raised:
            call(lambda client: client.infer("parameters", inputs))
        assert _status(raised.value) == "StatusCode.NOT_FOUND"  # Triton: no version of it is available
        assert "Request for unknown model: 'parameters' has no available versions" in str(raised.value)
        index = call(lambda client: client.get_model_repository_index(headers=GRPC_AUTH, as_json=True))
        assert {entry["name"]: entry["state"] for entry in index["models"]}["parameters"] == "UNAVAILABLE"
        with grpc.insecure_channel(grpc_url(triton)) as channel:
            ready_only = service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
                service_pb2.RepositoryIndexRequest(ready=True), metadata=tuple(GRPC_AUTH.items())
            )
        assert "parameters" not in {entry.name for entry in ready_only.models}
        assert "echo_all" in {entry.name for entry in ready_only.models}
    finally:
        call(lambda client: client.load_model("parameters", headers=GRPC_AUTH))
    assert call(lambda client: client.is_model_ready("parameters")) is True
    assert call(lambda client: client.infer("parameters", inputs)).as_numpy("PARAMS").shape == (1, 1)


def test_load_unknown_model_fails_as_in_triton(call: Call) -> None:
    with pytest.raises(InferenceServerException) as raised:
        call(lambda client: client.load_model("no_such_model", headers=GRPC_AUTH))
    assert _status(raised.value) == "StatusCode.INTERNAL"
    assert "failed to load 'no_such_model', failed to poll from model repository" in str(raised.value)


@pytest.mark.parametrize(
    ("fn", "code", "message"),
    [
        (lambda client: client.get_model_metadata("no_such_model"), "NOT_FOUND", "unknown model"),
        (lambda client: client.get_model_config("no_such_model"), "NOT_FOUND", "unknown model"),
        (lambda client: client.get_model_metadata("echo_all", "7"), "NOT_FOUND", "version 7"),
        (
            lambda client: client.get_inference_statistics("no_such_model", headers=GRPC_AUTH),
            "INVALID_ARGUMENT",
            "requested model 'no_such_model' is not available",
        ),
        (
            lambda client: client.infer("no_such_model", _all_types_inputs()),
            "NOT_FOUND",
            "unknown model",
        ),
        (
            lambda client: client.infer("fail", _inputs(grpcclient, {"IN": np.ones(1, np.float32)}, {"IN": "FP32"})),
            "INTERNAL",
            "the model broke",
        ),
        (
            lambda client: client.infer(
                "decoupled", _inputs(grpcclient, {"IN": np.ones(1, np.float32)}, {"IN": "FP32"})
            ),
            "UNIMPLEMENTED",
            "ModelInfer RPC doesn't support models with decoupled transaction policy",
        ),
        (
            lambda client: client.infer("fail", _inputs(grpcclient, {"IN": np.ones(2, np.float32)}, {"IN": "FP32"})),
            "INVALID_ARGUMENT",
            "unexpected shape for input 'IN' for model 'fail'. Expected [1], got [2]",
        ),
        (
            lambda client: client.infer("fail", _inputs(grpcclient, {"IN": np.ones(1, np.int32)}, {"IN": "INT32"})),
            "INVALID_ARGUMENT",
            "data-type is 'INT32'",
        ),
        (
            lambda client: client.infer(
                "echo_all",
                _all_types_inputs(),
                outputs=[grpcclient.InferRequestedOutput("NOPE")],
            ),
            "INVALID_ARGUMENT",
            "unexpected inference output 'NOPE'",
        ),
        (
            lambda client: client.get_system_shared_memory_status("r", headers=GRPC_AUTH),
            "NOT_FOUND",
            "Unable to find system shared memory region: 'r'",
        ),
        (
            lambda client: client.get_cuda_shared_memory_status("r", headers=GRPC_AUTH),
            "NOT_FOUND",
            "cuda shared memory region: 'r'",
        ),
        (
            lambda client: client.update_log_settings({"log_file": "x.log"}, headers=GRPC_AUTH),
            "UNIMPLEMENTED",
            "log file location",
        ),
        (
            lambda client: client.update_trace_settings(settings={"trace_file": "x.json"}, headers=GRPC_AUTH),
            "UNIMPLEMENTED",
            "trace file location",
        ),
    ],
    ids=[
        "metadata-unknown",
        "config-unknown",
        "metadata-unknown-version",
        "stats-unknown",
        "infer-unknown",
        "model-raised",
        "decoupled-unary",
        "bad-shape",
        "bad-datatype",
        "unknown-output",
        "system-shm",
        "cuda-shm",
        "log-settings",
        "trace-settings",
    ],
)
def test_error_codes(call: Call, fn: Callable[[Any], Any], code: str, message: str) -> None:
    with pytest.raises(InferenceServerException) as raised:
        call(fn)
    assert _status(raised.value) == f"StatusCode.{code}"
    assert message in raised.value.message()


def test_missing_input_is_invalid_argument(call: Call) -> None:
    inputs = _all_types_inputs()[1:]
    with pytest.raises(InferenceServerException) as raised:
        call(lambda client: client.infer("echo_all", inputs))
    assert _status(raised.value) == "StatusCode.INVALID_ARGUMENT"
    assert "missing required input(s) ['IN_BOOL']" in raised.value.message()


def test_an_input_too_many_is_counted_before_it_is_looked_up(call: Call) -> None:
    # Triton 2.51 checks the number of inputs first, and prints an empty list of the missing as "]".
    inputs = _all_types_inputs()
    extra = grpcclient.InferInput("EXTRA", [1], "FP32")
    extra.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException) as raised:
        call(lambda client: client.infer("echo_all", [*inputs, extra]))
    assert _status(raised.value) == "StatusCode.INVALID_ARGUMENT"
    message = raised.value.message()
    assert f"expected {len(inputs)} inputs but got {len(inputs) + 1} inputs for model 'echo_all'" in message
    assert "Got input(s) ['EXTRA','" in message and "but missing required input(s) ]." in message


def test_large_tensor_over_default_message_limit(call: Call) -> None:
    # 12 MiB each way, over grpcio's 4 MiB default; tritonclient's channels allow 2 GiB, the server must too.
    big = np.arange(3 * 2**20, dtype=np.float32).reshape(1, -1)
    arrays = {f"IN_{name}": data for name, (_, data) in DATATYPES.items()}
    arrays["IN_FP32"] = big
    inputs = _inputs(grpcclient, arrays, {f"IN_{name}": name for name in DATATYPES})
    outputs = [grpcclient.InferRequestedOutput("OUT_FP32")]
    result = call(lambda client: client.infer("echo_all", inputs, outputs=outputs))
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), big)


def test_classification_answers_the_top_classes_of_each_batch_row(call: Call) -> None:
    # tritonclient's class_count: Triton's classification extension, "value:index" strings, best first.
    outputs = [
        grpcclient.InferRequestedOutput("OUT_FP32", class_count=2),
        grpcclient.InferRequestedOutput("OUT_INT8", class_count=5),  # more than there are: all of them
        grpcclient.InferRequestedOutput("OUT_FP64"),
    ]
    result = call(lambda client: client.infer("echo_all", _all_types_inputs(), outputs=outputs))
    top = result.as_numpy("OUT_FP32")
    assert top.shape == (1, 2) and top[0, 1] == b"0.500000:1"
    assert top[0, 0] == f"{float(np.float32(3.0e38)):f}:2".encode()
    assert result.as_numpy("OUT_INT8").tolist() == [[b"127:2", b"0:1", b"-128:0"]]
    np.testing.assert_array_equal(result.as_numpy("OUT_FP64"), DATATYPES["FP64"][1])


@pytest.mark.parametrize("name", ["BOOL", "BYTES", "FP16"])
def test_classification_of_an_output_without_order_is_invalid(call: Call, name: str) -> None:
    # Triton's words (classification.cc orders integers, FP32 and FP64); for BYTES, tritonserver 2.51 crashes.
    outputs = [grpcclient.InferRequestedOutput(f"OUT_{name}", class_count=1)]
    with pytest.raises(InferenceServerException) as raised:
        call(lambda client: client.infer("echo_all", _all_types_inputs(), outputs=outputs))
    assert _status(raised.value) == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message() == f"class result not available for output due to unsupported type '{name}'"
