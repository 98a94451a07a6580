"""TritonSecurityConfig: a default server guards its administrative APIs with a generated token, as 0.7 does.

What nvidia-pytriton 0.7.0 answered (its tritonserver, default TritonSecurityConfig), measured on this machine:
- `POST /v2/repository/models/add/unload` without the token, or with a wrong one: 403,
  `{"error":"This API is restricted, expecting header 'triton-access-token'"}`; the same for
  `POST /v2/repository/index`, `GET /v2/models/stats`, `GET /v2/models/add/stats`, `GET /v2/logging`,
  `GET /v2/trace/setting`, `GET /v2/models/add/trace/setting`, `GET /v2/systemsharedmemory/status` and
  `GET /v2/cudasharedmemory/status`; with `triton-access-token: <token>` the index answered 200.
- gRPC RepositoryIndex, ModelStatistics, SystemSharedMemoryStatus and RepositoryModelUnload without the
  metadata, or with the HTTP header's name: UNAVAILABLE,
  "This protocol is restricted, expecting header 'triton-grpc-protocol-triton-access-token'";
  with `triton-grpc-protocol-triton-access-token: <token>` they answered.
- Health, metadata, model config and inference needed no token.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import Tensor
from pytriton.triton import (
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    Triton,
    TritonConfig,
    TritonSecurityConfig,
)
from tests.conftest import grpc_url, http_url
from tests.http_helpers import request

HTTP_DENIED = {"error": "This API is restricted, expecting header 'triton-access-token'"}
GRPC_DENIED = "This protocol is restricted, expecting header 'triton-grpc-protocol-triton-access-token'"
INFER_BODY = json.dumps({"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
RESTRICTED_HTTP = [
    ("POST", "/v2/repository/models/identity/unload"),
    ("POST", "/v2/repository/models/identity/load"),
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/identity/stats"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/models/identity/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/cudasharedmemory/status"),
]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
    )


@pytest.fixture
def default_server() -> Any:
    """A server with nvidia-pytriton's defaults: no security_config at all."""
    with Triton(config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False)) as triton:
        _bind(triton)
        yield triton


def test_default_config_generates_a_token_for_the_default_endpoints() -> None:
    config = TritonSecurityConfig()
    assert config.restricted_endpoints == DEFAULT_PROTECTED_ENDPOINTS
    assert config.restricted_endpoints == ["shared-memory", "model-repository", "statistics", "trace", "logging"]
    assert isinstance(config.access_token, str) and len(config.access_token) >= 32
    assert TritonSecurityConfig().access_token != config.access_token
    assert TritonSecurityConfig(access_token="mine").access_token == "mine"
    unrestricted = TritonSecurityConfig(restricted_endpoints=[])
    assert unrestricted.access_token is None and unrestricted.restricted_endpoints == []
    assert TRITON_ACCESS_HEADER == "triton-access-token"


def test_unknown_endpoint_names_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(PyTritonValidationError) as raised:
        TritonSecurityConfig(restricted_endpoints=["model-repository", "everything"])
    assert raised.value.message == (
        "Invalid endpoint names: everything. Valid endpoints are: custom, health, inference, logging, metadata, "
        "model-config, model-repository, shared-memory, statistics, trace"  # custom: pytriton's own (Triton.add_route)
    )


@pytest.mark.parametrize(("method", "path"), RESTRICTED_HTTP)
def test_default_server_refuses_restricted_http_without_the_token(
    default_server: Triton, method: str, path: str
) -> None:
    port = default_server.http_port
    status, _, body = request(port, method, path)
    assert (status, json.loads(body)) == (403, HTTP_DENIED)
    assert request(port, method, path, headers={TRITON_ACCESS_HEADER: "wrong"})[0] == 403


def test_default_server_unload_needs_the_token_and_works_with_it(default_server: Triton) -> None:
    port = default_server.http_port
    token = default_server.get_access_token()
    assert token
    status, _, body = request(port, "POST", "/v2/repository/models/identity/unload")
    assert (status, json.loads(body)) == (403, HTTP_DENIED)
    assert request(port, "GET", "/v2/models/identity/ready")[0] == 200  # still served
    assert (
        request(port, "POST", "/v2/repository/models/identity/unload", headers={TRITON_ACCESS_HEADER: token})[0] == 200
    )
    assert request(port, "GET", "/v2/models/identity/ready")[0] == 400
    assert request(port, "POST", "/v2/repository/models/identity/load", headers={TRITON_ACCESS_HEADER: token})[0] == 200


def test_default_server_leaves_health_metadata_config_and_inference_open(default_server: Triton) -> None:
    port = default_server.http_port
    assert request(port, "GET", "/v2/health/ready")[0] == 200
    assert request(port, "GET", "/v2")[0] == 200
    assert request(port, "GET", "/v2/models/identity")[0] == 200
    assert request(port, "GET", "/v2/models/identity/config")[0] == 200
    assert request(port, "POST", "/v2/models/identity/infer", INFER_BODY)[0] == 200


def test_http_client_with_the_token(default_server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(default_server))
    with pytest.raises(InferenceServerException, match="expecting header 'triton-access-token'"):
        client.get_inference_statistics("identity")
    headers = {TRITON_ACCESS_HEADER: default_server.get_access_token() or ""}
    assert client.get_inference_statistics("identity", headers=headers)["model_stats"][0]["name"] == "identity"
    assert client.get_log_settings(headers=headers)["log_verbose_level"] == 0
    client.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda client, headers: client.get_model_repository_index(headers=headers),
        lambda client, headers: client.get_inference_statistics("identity", headers=headers),
        lambda client, headers: client.get_system_shared_memory_status(headers=headers),
        lambda client, headers: client.get_trace_settings(headers=headers),
        lambda client, headers: client.get_log_settings(headers=headers),
        lambda client, headers: client.unload_model("identity", headers=headers),
    ],
    ids=["index", "statistics", "shared-memory", "trace", "logging", "unload"],
)
def test_grpc_restricted_calls_need_the_token_metadata(default_server: Triton, call: Callable[[Any, Any], Any]) -> None:
    client = grpcclient.InferenceServerClient(grpc_url(default_server))
    token = default_server.get_access_token() or ""
    for headers in (None, {TRITON_ACCESS_HEADER: token}, {"triton-grpc-protocol-triton-access-token": "wrong"}):
        with pytest.raises(InferenceServerException) as raised:
            call(client, headers)
        assert (raised.value.status(), raised.value.message()) == ("StatusCode.UNAVAILABLE", GRPC_DENIED)
    call(client, {"triton-grpc-protocol-triton-access-token": token})
    client.close()


def test_grpc_open_calls_need_no_token(default_server: Triton) -> None:
    client = grpcclient.InferenceServerClient(grpc_url(default_server))
    inputs = [grpcclient.InferInput("IN", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    assert client.infer("identity", inputs).as_numpy("OUT").tolist() == [[1, 2]]
    assert client.is_server_ready() and client.get_model_config("identity").config.name == "identity"
    client.close()


def test_no_restricted_endpoints_restricts_nothing() -> None:
    security = TritonSecurityConfig(restricted_endpoints=[])
    config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)
    with Triton(config=config, security_config=security) as triton:
        _bind(triton)
        assert triton.get_access_token() is None
        assert request(triton.http_port, "POST", "/v2/repository/index")[0] == 200


def test_chosen_endpoints_and_token() -> None:
    security = TritonSecurityConfig(access_token="s3cret", restricted_endpoints=["inference"])
    config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)
    with Triton(config=config, security_config=security) as triton:
        _bind(triton)
        port = triton.http_port
        assert triton.get_access_token() == "s3cret"
        assert request(port, "POST", "/v2/repository/index")[0] == 200
        assert request(port, "POST", "/v2/models/identity/infer", INFER_BODY)[0] == 403
        headers = {TRITON_ACCESS_HEADER: "s3cret"}
        assert request(port, "POST", "/v2/models/identity/infer", INFER_BODY, headers)[0] == 200


def test_restricted_api_option_applies_to_the_apis_it_names() -> None:
    """http_restricted_api keeps its own header for what it names; the token guards the rest of its endpoints."""
    config = TritonConfig(
        http_port=0, allow_grpc=False, allow_metrics=False, http_restricted_api="model-repository:admin-key=a"
    )
    with Triton(config=config, security_config=TritonSecurityConfig(access_token="t")) as triton:
        _bind(triton)
        port = triton.http_port
        assert request(port, "POST", "/v2/repository/index", headers={TRITON_ACCESS_HEADER: "t"})[0] == 403
        assert request(port, "POST", "/v2/repository/index", headers={"admin-key": "a"})[0] == 200
        assert request(port, "GET", "/v2/models/stats")[0] == 403
        assert request(port, "GET", "/v2/models/stats", headers={TRITON_ACCESS_HEADER: "t"})[0] == 200
