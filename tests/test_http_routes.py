"""One route table (options/http_routes.py): a path's category is that of the route the HTTP app serves it by."""

from __future__ import annotations

import http.client
import json
from typing import Any, Callable, Dict, Iterator, List, Tuple
from urllib.parse import unquote

import numpy as np
import pytest

from pytriton.model_config import Tensor
from pytriton.options.access import GRPC_METHOD_CATEGORIES, Category, http_category
from pytriton.options.http_routes import find_route
from pytriton.security import TritonSecurityConfig
from pytriton.transport.grpc.handlers import RPCS
from pytriton.triton import Triton

# Every category restricted, each under a header of its own: a 403 names the category the server checked.
EVERY_CATEGORY = ";".join(f"{category.value}:key-{category.value}=secret" for category in Category)
EVERY_HEADER = {f"key-{category.value}": "secret" for category in Category}
NOT_FOUND = (404, b'{"error":"Not Found"}')


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        lambda requests: [{"OUT": request.data["IN"]} for request in requests],
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
    )


def _v2_paths() -> Iterator[str]:
    """Each route's path with good and bad parameters, with a trailing slash, an empty segment, an encoded slash."""
    actions = ["", "/ready", "/config", "/stats", "/infer", "/generate", "/generate_stream", "/trace/setting", "/bogus"]
    for model in ("identity", "stats", "nosuch", "a%2Fb", ""):
        for version in ("", "/versions/1", "/versions/abc", "/versions/", "/versions/%31"):
            for action in actions:
                yield f"/v2/models/{model}{version}{action}"
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        for region in ("", "/region/r", "/region/", "/region/a%2Fb"):
            for action in ("/status", "/register", "/unregister", "/bogus", ""):
                yield f"/v2/{kind}{region}{action}"
    for repository in ("", "/r", "/", "/a%2Fb", "/models", "/index"):
        yield f"/v2/repository{repository}/index"
        for name in ("nosuch", "", "a%2Fb"):
            for action in ("load", "unload", "drop"):
                yield f"/v2/repository{repository}/models/{name}/{action}"
    yield from ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/health", "/v2/models/stats", "/v2/models")
    yield from ("/v2/logging", "/v2/trace/setting", "/v2/trace", "/v2/nope", "/v2/", "/v2//logging")
    yield from ("/v2/health%2Flive", "/v2/models/identity/", "/v2/repository/index/")


def _answer(
    connection: http.client.HTTPConnection, method: str, path: str, headers: Dict[str, str]
) -> Tuple[int, bytes]:
    """Status and body of one request on a keep-alive connection."""
    connection.request(method, path, body=b"" if method == "POST" else None, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()


def test_every_route_the_app_serves_has_the_category_its_path_is_given(start_triton: Callable[..., Triton]) -> None:
    # Before one table, /v2/repository//index and /v2/repository/models//load were served with no category:
    # model-repository restricted, they answered 200 and 500 without the header.
    triton = start_triton(
        _bind, TritonSecurityConfig(restricted_endpoints=[]), http_restricted_api=EVERY_CATEGORY, allow_grpc=False
    )
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
    wrong: List[Any] = []
    for path in _v2_paths():
        category = http_category([unquote(segment) for segment in path.split("/")])  # as the app splits it
        for method in ("GET", "POST"):
            allowed = _answer(connection, method, path, EVERY_HEADER)
            refused = _answer(connection, method, path, {})
            if category is None:
                ok = refused == allowed == NOT_FOUND
            else:  # the category is checked before anything else; a name with an encoded "/" is then not found
                expected = f"This API is restricted, expecting header 'key-{category.value}'"
                ok = refused == (403, json.dumps({"error": expected}, separators=(",", ":")).encode())
                ok = ok and allowed[0] != 403
            if not ok:
                wrong.append((method, path, category, allowed, refused))
    connection.close()
    assert not wrong


def test_http_category_reads_the_route_found() -> None:
    assert http_category("/v2/repository/r/index") is Category.MODEL_REPOSITORY
    # tritonserver 2.51 answers 404 {"error":"Not Found"} to an empty repository or model name, before any check.
    for path in ("/v2/repository//index", "/v2/repository/models//load", "/v2/repository//models/m/unload"):
        assert find_route(path.split("/")) is None and http_category(path) is None
    route, parameters = find_route("/v2/models/stats/versions/2/infer".split("/")) or (None, None)
    assert route is not None and route.handler == "infer" and parameters == {"model": "stats", "version": "2"}
    route, parameters = find_route("/v2/cudasharedmemory/region/r/register".split("/")) or (None, None)
    assert route is not None and parameters == {"region": "r", "action": "register"}
    assert http_category("/v2/models/stats") is Category.STATISTICS
    assert find_route("/v2/models/m/versions/1/trace/setting".split("/")) is None  # Triton's has no version


@pytest.mark.parametrize("rpc", RPCS, ids=lambda rpc: rpc.method.name)
def test_every_grpc_method_has_a_category(rpc: Any) -> None:
    assert rpc.method.name in GRPC_METHOD_CATEGORIES
