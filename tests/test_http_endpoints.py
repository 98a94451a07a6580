"""Health, metadata, config, readiness, repository and routing over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton
from tests.conftest import HTTP_AUTH
from tests.http_helpers import get_json, post_json, request


def _identity(requests):
    return [{"OUTPUT_1": r["INPUT_1"]} for r in requests]


def _bind_models(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        inputs=[Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "text",
        lambda requests: [{"out": r["in"]} for r in requests],
        inputs=[Tensor(name="in", dtype=bytes, shape=(1,), optional=False)],
        outputs=[Tensor(name="out", dtype=np.bytes_, shape=(1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "versioned",
        _identity,
        inputs=[Tensor(dtype=np.int32, shape=(2, 3))],
        outputs=[Tensor(dtype=np.int32, shape=(2, 3))],
        model_version=2,
        config=ModelConfig(
            max_batch_size=16,
            batcher=DynamicBatcher(
                max_queue_delay_microseconds=100,
                preferred_batch_size=[4, 8],
                priority_levels=2,
                default_priority_level=2,
                default_queue_policy=QueuePolicy(max_queue_size=10),
                priority_queue_policy={
                    1: QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_microseconds=5)
                },
            ),
        ),
    )


@pytest.fixture(scope="module")
def server():
    from tests.conftest import running_triton

    with running_triton(_bind_models, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


def test_health_endpoints(server):
    assert request(server.http_port, "GET", "/v2/health/live")[::2] == (200, b"")
    assert request(server.http_port, "GET", "/v2/health/ready")[::2] == (200, b"")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    assert client.is_server_live() and client.is_server_ready()


def test_server_metadata(server):
    status, document = get_json(server.http_port, "/v2")
    assert status == 200
    assert document["name"] == "triton"
    assert {"binary_tensor_data", "parameters", "statistics", "model_configuration"} <= set(document["extensions"])


def test_model_metadata_shapes_and_types(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    metadata = client.get_model_metadata("identity")
    assert metadata["name"] == "identity" and metadata["versions"] == ["1"] and metadata["platform"] == "python"
    assert metadata["inputs"] == [{"name": "INPUT_1", "datatype": "FP32", "shape": [-1, -1]}]
    assert metadata["outputs"] == [{"name": "OUTPUT_1", "datatype": "FP32", "shape": [-1, -1]}]
    text = client.get_model_metadata("text")
    assert text["inputs"] == [{"name": "in", "datatype": "BYTES", "shape": [1]}]
    assert client.get_model_metadata("versioned", "2")["versions"] == ["2"]


def test_model_config_document(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    config = client.get_model_config("versioned")
    assert config["name"] == "versioned" and config["backend"] == "python" and config["max_batch_size"] == 16
    assert config["input"][0]["data_type"] == "TYPE_INT32" and config["input"][0]["dims"] == [2, 3]
    batching = config["dynamic_batching"]
    assert batching["preferred_batch_size"] == [4, 8]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 2
    assert batching["default_queue_policy"]["max_queue_size"] == 10
    assert batching["priority_queue_policy"]["1"]["timeout_action"] == "DELAY"
    assert "model_transaction_policy" not in config  # Triton prints it for decoupled models only
    assert config["instance_group"][0]["count"] == 1 and config["instance_group"][0]["kind"] == "KIND_CPU"
    text = client.get_model_config("text")
    assert text["max_batch_size"] == 0 and "dynamic_batching" not in text
    assert text["input"][0]["data_type"] == "TYPE_STRING"
    assert client.get_model_config("identity")["dynamic_batching"]["preferred_batch_size"] == [8]


def test_model_readiness(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    assert client.is_model_ready("identity")
    assert client.is_model_ready("versioned", "2")
    assert not client.is_model_ready("versioned", "1")
    assert not client.is_model_ready("missing")
    status, document = get_json(server.http_port, "/v2/models/missing/ready")
    assert status == 400 and document == {"error": "Model version not ready"}


def test_unknown_model_and_version(server):
    status, document = get_json(server.http_port, "/v2/models/missing")
    assert status == 404 and "missing" in document["error"]
    status, document = get_json(server.http_port, "/v2/models/identity/versions/7/config")
    assert status == 404 and "version 7" in document["error"]
    status, document = post_json(server.http_port, "/v2/models/missing/infer", {"inputs": []})
    assert status == 404 and "unknown model" in document["error"]


def test_unknown_route_and_wrong_method(server):
    status, _, body = request(server.http_port, "GET", "/v2/nothing/here")
    assert status == 404 and b"error" in body
    status, _, body = request(server.http_port, "GET", "/health")
    assert status == 404
    status, _, body = request(server.http_port, "GET", "/v2/models/identity/infer")
    assert status == 405 and b"error" in body
    status, _, body = request(server.http_port, "POST", "/v2/health/live")
    assert status == 405


def test_repository_index_unload_load(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    index = {entry["name"]: entry for entry in client.get_model_repository_index(headers=HTTP_AUTH)}
    assert index["identity"]["state"] == "READY" and index["versioned"]["version"] == "2"
    client.unload_model("text", headers=HTTP_AUTH)
    assert not client.is_model_ready("text")
    assert {e["name"]: e["state"] for e in client.get_model_repository_index(headers=HTTP_AUTH)}[
        "text"
    ] == "UNAVAILABLE"
    inputs = [httpclient.InferInput("in", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([b"x"], dtype=object))
    with pytest.raises(httpclient.InferenceServerException):
        client.infer("text", inputs)
    client.load_model("text", headers=HTTP_AUTH)
    assert client.is_model_ready("text")
    assert client.infer("text", inputs).as_numpy("out").tolist() == [b"x"]
    with pytest.raises(httpclient.InferenceServerException):
        client.load_model("never-bound", headers=HTTP_AUTH)


def test_statistics_endpoints(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inputs = [httpclient.InferInput("INPUT_1", [2, 3], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((2, 3), np.float32))
    client.infer("identity", inputs)
    stats = client.get_inference_statistics("identity", headers=HTTP_AUTH)["model_stats"]
    assert len(stats) == 1
    entry = stats[0]
    assert entry["name"] == "identity" and entry["version"] == "1"
    assert entry["inference_count"] >= 2 and entry["execution_count"] >= 1
    assert set(entry["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert entry["inference_stats"]["success"]["count"] >= 1
    assert entry["batch_stats"][0]["batch_size"] == 2
    everything = client.get_inference_statistics(headers=HTTP_AUTH)["model_stats"]
    assert {e["name"] for e in everything} == {"identity", "text", "versioned"}
