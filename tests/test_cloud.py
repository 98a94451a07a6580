"""The SageMaker and Vertex AI frontends: their routes answer on their own ports with the v2 engine behind."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest

from pytriton.model_config import Tensor
from pytriton.runtime.options import resolve_options
from pytriton.transport.cloud.sagemaker import BINARY_MIME as SAGEMAKER_MIME
from pytriton.transport.cloud.vertex import BINARY_MIME as VERTEX_MIME
from pytriton.triton import Triton, TritonConfig
from tests.conftest import HTTP_AUTH
from tests.http_helpers import request

INFER = {"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"]} for request in requests]


def _doubled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"] * 2} for request in requests]


def _binder(*names: str) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        for name in names:
            triton.bind(
                name,
                _doubled if name == "doubled" else _identity,
                inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            )

    return bind


def _post(port: int, path: str, document: Any, headers: Optional[Dict[str, str]] = None) -> Any:
    status, _, body = request(port, "POST", path, json.dumps(document), headers)
    return status, json.loads(body) if body else None


def _binary_request(mime: str) -> tuple:
    header = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
            "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.array([3, 4], np.float32).tobytes()
    return body, {"Content-Type": f"{mime}{len(header)}"}


@pytest.fixture
def no_cloud_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("AIP_MODE", "AIP_HTTP_PORT", "AIP_PREDICT_ROUTE", "AIP_HEALTH_ROUTE"):
        monkeypatch.delenv(name, raising=False)
    for name in (
        "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME",
        "SAGEMAKER_TRITON_PING_MODE",
        "SAGEMAKER_TRITON_INFERENCE_TYPE",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_sagemaker_ping_and_invocations(
    start_triton: Callable[..., Triton], no_cloud_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "pytriton"):
        triton = start_triton(_binder("identity"), allow_sagemaker=True, sagemaker_port=0, allow_grpc=False)
    port = triton._runtime.sagemaker_port
    assert port and port != triton.http_port
    assert f"the SageMaker API: http://0.0.0.0:{port} (/ping, /invocations)" in caplog.messages
    assert request(port, "GET", "/ping")[:1] == (200,)
    status, document = _post(port, "/invocations", INFER)
    assert status == 200 and document["model_name"] == "identity" and document["outputs"][0]["data"] == [1, 2]
    body, headers = _binary_request(SAGEMAKER_MIME)
    status, response_headers, payload = request(port, "POST", "/invocations", body, headers)
    assert status == 200
    mime = response_headers["content-type"]
    assert mime.startswith(SAGEMAKER_MIME) and "inference-header-content-length" not in response_headers
    json_length = int(mime[len(SAGEMAKER_MIME) :])
    assert json.loads(payload[:json_length])["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(payload[json_length:], np.float32).tolist() == [3, 4]
    assert request(port, "GET", "/nope")[0] == 400
    assert request(port, "GET", "/models")[0] == 501
    assert request(port, "POST", "/ping")[0] == 405


def test_sagemaker_default_model_and_restrictions(start_triton: Callable[..., Triton], no_cloud_env: Any) -> None:
    no_cloud_env.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "doubled")
    no_cloud_env.setenv("SAGEMAKER_TRITON_PING_MODE", "live")
    triton = start_triton(
        _binder("identity", "doubled"),
        allow_sagemaker=True,
        sagemaker_port=0,
        allow_grpc=False,
        http_restricted_api="inference:key=value",
    )
    port = triton._runtime.sagemaker_port
    assert request(port, "GET", "/ping")[0] == 200
    status, document = _post(port, "/invocations", INFER)
    assert status == 403 and document == {"error": "This API is restricted, expecting header 'key'"}
    status, document = _post(port, "/invocations", INFER, {"key": "value"})
    assert status == 200 and document["model_name"] == "doubled" and document["outputs"][0]["data"] == [2, 4]


def test_sagemaker_needs_a_default_model_for_several(start_triton: Callable[..., Triton], no_cloud_env: Any) -> None:
    triton = start_triton(_binder("identity", "doubled"), allow_sagemaker=True, sagemaker_port=0, allow_grpc=False)
    status, document = _post(triton._runtime.sagemaker_port, "/invocations", INFER)
    assert status == 400 and "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is not set" in document["error"]


def test_vertex_ai_routes(
    start_triton: Callable[..., Triton], no_cloud_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    no_cloud_env.setenv("AIP_PREDICT_ROUTE", "/v1/models/m:predict")
    no_cloud_env.setenv("AIP_HEALTH_ROUTE", "/v1/models/m")
    with caplog.at_level(logging.INFO, "pytriton"):
        triton = start_triton(
            _binder("identity", "doubled"),
            allow_vertex_ai=True,
            vertex_ai_port=0,
            vertex_ai_default_model="doubled",
            allow_grpc=False,
        )
    port = triton._runtime.vertex_ai_port
    assert port and port != triton.http_port
    # NVIDIA's add_sub_vertex_ai example serves it on 8080 beside 8000: the log says where, as tritonserver's does
    assert f"the Vertex AI API: http://0.0.0.0:{port} (health /v1/models/m, predict /v1/models/m:predict)" in (
        caplog.messages
    )
    assert request(port, "GET", "/v1/models/m")[0] == 200
    status, document = _post(port, "/v1/models/m:predict", INFER)
    assert status == 200 and document["model_name"] == "doubled" and document["outputs"][0]["data"] == [2, 4]
    body, headers = _binary_request(VERTEX_MIME)
    status, response_headers, payload = request(port, "POST", "/v1/models/m:predict", body, headers)
    assert status == 200 and response_headers["content-type"].startswith(VERTEX_MIME)
    json_length = int(response_headers["content-type"][len(VERTEX_MIME) :])
    assert np.frombuffer(payload[json_length:], np.float32).tolist() == [6, 8]
    # The redirect header reaches any v2 route through the predict route.
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/identity/config"}
    status, document = _post(port, "/v1/models/m:predict", {}, redirect)
    assert status == 200 and document["name"] == "identity"
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/identity/infer"}
    status, document = _post(port, "/v1/models/m:predict", INFER, redirect)
    assert status == 200 and document["model_name"] == "identity"
    status, document = _post(port, "/v1/models/m:predict", {}, {"X-Vertex-Ai-Triton-Redirect": "v2/health/ready"})
    assert status == 200
    assert request(port, "GET", "/v1/models/m:predict", headers=redirect)[0] == 405
    assert request(port, "GET", "/elsewhere")[0] == 400
    # A redirect reaches a restricted API only with the server's access token, as on the HTTP port.
    unload = {"X-Vertex-Ai-Triton-Redirect": "v2/repository/models/identity/unload"}
    status, document = _post(port, "/v1/models/m:predict", {}, unload)
    assert (status, document) == (403, {"error": "This API is restricted, expecting header 'triton-access-token'"})
    status, _ = _post(port, "/v1/models/m:predict", {}, {**unload, **HTTP_AUTH})
    assert status == 200 and request(triton.http_port, "GET", "/v2/models/identity/ready")[0] == 400


def test_vertex_ai_options_follow_aip_variables(no_cloud_env: Any) -> None:
    assert resolve_options(TritonConfig()).vertex_ai is None
    no_cloud_env.setenv("AIP_MODE", "PREDICTION")
    no_cloud_env.setenv("AIP_HTTP_PORT", "8181")
    vertex = resolve_options(TritonConfig()).vertex_ai
    assert vertex is not None and vertex.port == 8181
    assert (vertex.predict_route, vertex.health_route) == ("/predict", "/health")
    assert resolve_options(TritonConfig(allow_vertex_ai=False)).vertex_ai is None
    sagemaker = resolve_options(TritonConfig(allow_sagemaker=True)).sagemaker
    assert sagemaker is not None and sagemaker.port == 8080 and sagemaker.inference_type == "infer"
