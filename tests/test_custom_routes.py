"""Custom HTTP routes and mounted ASGI apps on the HTTP port (Triton.add_route, Triton.mount)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from pytriton.compose import call_model, call_model_async
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.routes import RouteRequest, RouteResponse
from pytriton.triton import Triton, TritonSecurityConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, running_triton

INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


@batch
def _double(x: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x * 2}


async def _double_route(request: RouteRequest) -> Any:
    values = np.array([request.json()["x"]], dtype=np.float32)
    outputs = await call_model_async("double", {"x": values})
    return {"y": outputs["y"][0], "name": request.path_params.get("name")}


def _sync_route(request: RouteRequest) -> RouteResponse:
    outputs = call_model("double", {"x": np.array([[float(request.query["x"])]], dtype=np.float32)})
    return RouteResponse(str(float(outputs["y"][0][0])).encode(), status=201, media_type="text/plain")


async def _failing_route(request: RouteRequest) -> Any:
    return await call_model_async("double", {"x": np.zeros((1, 1), np.float64)})  # FP64 for an FP32 input


async def _asgi_app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    body = json.dumps({"path": scope["path"], "root_path": scope["root_path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _bind(triton: Triton) -> None:
    triton.bind("double", _double, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8))
    triton.add_route("/double", _double_route)
    triton.add_route("/double/{name}", _double_route)
    triton.add_route("/sync", _sync_route, methods=["GET"])
    triton.add_route("/failing", _failing_route)
    triton.mount("/app", _asgi_app)


def _request(
    port: int, path: str, body: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None
) -> Tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _metric_lines(port: int) -> List[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith("pytriton_custom_route_requests{")]


@pytest.mark.parametrize("frontends", [None, 2])
def test_routes_call_models_in_process_and_are_counted(frontends: Optional[int]) -> None:
    with running_triton(_bind, frontends=frontends) as triton:
        port = triton.http_port
        assert port is not None
        assert (triton._runtime._pool is not None) == (frontends == 2)  # routes forwarded by frontend processes
        status, body = _request(port, "/double", {"x": [1.0, 2.5]})
        assert (status, json.loads(body)) == (200, {"y": [2.0, 5.0], "name": None})
        status, body = _request(port, "/double/abc", {"x": [1.0]})
        assert (status, json.loads(body)) == (200, {"y": [2.0], "name": "abc"})
        assert _request(port, "/sync?x=4") == (201, b"8.0")
        status, body = _request(port, "/failing", {})
        assert status == 400
        assert (
            json.loads(body)
            == {
                "error": "[request id: <id_unknown>] inference input 'x' data-type is 'FP64', but model 'double' "
                "expects 'FP32'"
            }
            or "FP64" in json.loads(body)["error"]
        )
        status, body = _request(port, "/app/inner/path")
        assert (status, json.loads(body)) == (200, {"path": "/inner/path", "root_path": "/app"})
        assert _request(port, "/sync", {})[0] == 405  # POST to a GET route
        assert _request(port, "/nowhere")[0] == 404
        assert triton.metrics_port is not None
        assert sorted(_metric_lines(triton.metrics_port)) == sorted(
            [
                'pytriton_custom_route_requests{route="/double",method="POST",status="200"} 1',
                'pytriton_custom_route_requests{route="/double/{name}",method="POST",status="200"} 1',
                'pytriton_custom_route_requests{route="/sync",method="GET",status="201"} 1',
                'pytriton_custom_route_requests{route="/sync",method="POST",status="405"} 1',
                'pytriton_custom_route_requests{route="/failing",method="POST",status="400"} 1',
                'pytriton_custom_route_requests{route="/app",method="GET",status="200"} 1',
            ]
        )


@pytest.mark.parametrize("frontends", [None, 2])
def test_routes_restricted_as_custom_need_the_access_token(frontends: Optional[int]) -> None:
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, restricted_endpoints=["custom", "statistics"])
    with running_triton(_bind, security_config=security, frontends=frontends) as triton:
        port = triton.http_port
        assert port is not None
        status, body = _request(port, "/double", {"x": [1.0]})
        assert (status, json.loads(body)) == (
            403,
            {"error": "This API is restricted, expecting header 'triton-access-token'"},
        )
        assert _request(port, "/app/x")[0] == 403
        status, body = _request(port, "/double", {"x": [1.0]}, headers=HTTP_AUTH)
        assert status == 200
        assert _request(port, "/app/x", headers=HTTP_AUTH)[0] == 200
        assert _request(port, "/v2/health/ready")[0] == 200  # other APIs keep their own rules
        assert _request(port, "/v2/models/stats")[0] == 403


def test_a_header_rule_of_http_restricted_api_guards_custom_routes() -> None:
    with running_triton(_bind, http_restricted_api="custom:route-key=open-sesame") as triton:
        port = triton.http_port
        assert port is not None
        status, body = _request(port, "/double", {"x": [1.0]})
        assert (status, json.loads(body)) == (403, {"error": "This API is restricted, expecting header 'route-key'"})
        assert _request(port, "/double", {"x": [1.0]}, headers={"route-key": "open-sesame"})[0] == 200


def test_routes_open_by_default_under_the_default_token_rules() -> None:
    with running_triton(_bind) as triton:
        assert triton.http_port is not None
        assert _request(triton.http_port, "/double", {"x": [3.0]})[0] == 200


def test_reserved_and_repeated_routes_are_refused() -> None:
    triton = Triton()
    try:
        with pytest.raises(PyTritonValidationError, match="under /v2/"):
            triton.add_route("/v2/models/x/custom", _double_route)
        with pytest.raises(PyTritonValidationError, match="under /v1/"):
            triton.mount("/v1", _asgi_app)
        triton.add_route("/twice", _double_route)
        with pytest.raises(PyTritonValidationError, match="already served for POST"):
            triton.add_route("/twice", _double_route, methods=["post"])
    finally:
        triton.stop()
