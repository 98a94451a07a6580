"""Custom HTTP routes and mounted ASGI apps on the HTTP port (Triton.add_route, Triton.mount)."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

from pytriton.compose import ModelCallError, call_model, call_model_async
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.openai import OpenAIChat
from pytriton.routes import RouteRequest, RouteResponse
from pytriton.transport.http.cycle import BODY_HIGH_WATER
from pytriton.triton import ServerLimits, Triton, TritonSecurityConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, running_triton
from tests.fleet import wait_until

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


@pytest.mark.parametrize("frontends", [None, 3])
def test_routes_call_models_in_process_and_are_counted(frontends: Optional[int]) -> None:
    with running_triton(_bind, frontends=frontends) as triton:
        port = triton.http_port
        assert port is not None
        assert (triton._runtime._pool is not None) == (frontends == 3)  # routes forwarded by frontend processes
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


@pytest.mark.parametrize("frontends", [None, 3])
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


# -- a route whose client leaves --------------------------------------------------------------------------------

WAIT_S = 20.0


class _Held:
    """A model that runs until its request is cancelled, and what the routes that call it saw."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.inner_cancelled = threading.Event()
        self.handler_cancelled = threading.Event()
        self.handler_finished = threading.Event()
        self.errors: queue.Queue[str] = queue.Queue()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        self.calls += 1
        self.entered.set()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not self.release.is_set():
            if requests[0].is_cancelled():
                self.inner_cancelled.set()
                break
            time.sleep(0.01)  # a callable polls is_cancelled() between its steps
        return [{"y": request["x"]} for request in requests]


HELD = _Held()


async def _held_async(request: RouteRequest) -> Any:
    try:
        await call_model_async("held", {"x": np.array([1.0], np.float32)})
    except asyncio.CancelledError:
        HELD.handler_cancelled.set()
        raise
    HELD.handler_finished.set()
    return {}


def _held_sync(request: RouteRequest) -> Any:
    for _ in range(2):  # the second call comes after the client left: it fails at once
        try:
            call_model("held", {"x": np.array([1.0], np.float32)})
        except ModelCallError as error:
            HELD.errors.put(error.status.name)
    HELD.handler_finished.set()
    return {}


def _bind_held(triton: Triton) -> None:
    triton.bind("held", HELD, INPUTS, OUTPUTS, config=ModelConfig(batching=False))
    triton.add_route("/held/async", _held_async)
    triton.add_route("/held/sync", _held_sync)


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends"])
def held_server(request: Any) -> Iterator[Triton]:
    with running_triton(_bind_held, frontends=request.param) as triton:
        yield triton


@pytest.mark.parametrize("path", ["/held/async", "/held/sync"])
def test_a_route_whose_client_stays_is_answered_when_its_model_is(held_server: Triton, path: str) -> None:
    HELD.reset()
    assert held_server.http_port is not None
    answers: queue.Queue[Tuple[int, bytes]] = queue.Queue()
    client = threading.Thread(target=lambda: answers.put(_request(held_server.http_port or 0, path, {})))
    client.start()
    try:
        assert HELD.entered.wait(WAIT_S)
    finally:
        HELD.release.set()
        client.join(WAIT_S)
    assert answers.get_nowait() == (200, b"{}")
    assert HELD.handler_finished.is_set() and not HELD.handler_cancelled.is_set()
    assert not HELD.inner_cancelled.is_set() and HELD.errors.empty()


def _post_and_leave(port: int, path: str) -> None:
    """POST to a route, wait until its inner call runs, then close the connection without reading an answer."""
    body = b"{}"
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        assert HELD.entered.wait(WAIT_S), "the route's inner call did not start"


def _left_count(port: int, path: str) -> int:
    for line in _metric_lines(port):
        if line.startswith(f'pytriton_custom_route_requests{{route="{path}",method="POST",status="499"}}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_an_async_route_handler_is_cancelled_when_its_client_leaves(held_server: Triton) -> None:
    HELD.reset()
    assert held_server.http_port is not None and held_server.metrics_port is not None
    before = _left_count(held_server.metrics_port, "/held/async")
    _post_and_leave(held_server.http_port, "/held/async")
    assert HELD.handler_cancelled.wait(WAIT_S), "the handler was not cancelled"
    assert HELD.inner_cancelled.wait(WAIT_S), "its inner call was not cancelled"
    assert not HELD.handler_finished.is_set()
    metrics_port = held_server.metrics_port
    wait_until(lambda: _left_count(metrics_port, "/held/async") == before + 1, WAIT_S, "a 499 count")


def test_a_sync_route_handlers_model_calls_fail_once_its_client_leaves(held_server: Triton) -> None:
    HELD.reset()
    assert held_server.http_port is not None and held_server.metrics_port is not None
    _post_and_leave(held_server.http_port, "/held/sync")
    assert HELD.inner_cancelled.wait(WAIT_S), "the running inner call was not cancelled"
    assert HELD.handler_finished.wait(WAIT_S)
    assert [HELD.errors.get_nowait(), HELD.errors.get_nowait()] == ["CANCELLED", "CANCELLED"]
    assert HELD.calls == 1  # the call made after the client left never reached the model


# -- what a handler raises or returns that the server must still answer -------------------------------------------


def _exit_route(request: RouteRequest) -> Any:
    raise SystemExit(3)  # argparse's way out, say


def _interrupt_route(request: RouteRequest) -> Any:
    raise KeyboardInterrupt()


async def _async_exit_route(request: RouteRequest) -> Any:
    raise SystemExit(4)


def _stop_iteration_route(request: RouteRequest) -> Any:
    return next(iter(()))  # an exhausted iterator's StopIteration, which asyncio refuses to set on a future


def _stop_async_iteration_route(request: RouteRequest) -> Any:
    raise StopAsyncIteration()


async def _cancelled_route(request: RouteRequest) -> Any:
    raise asyncio.CancelledError()  # the handler's own, say a future it awaited was cancelled elsewhere


class _UpstreamError(Exception):
    """An error of a library the handler uses that carries an HTTP status of its own (aiohttp's, requests')."""

    status = 404


def _upstream_route(request: RouteRequest) -> Any:
    raise _UpstreamError("the upstream service answered 404")


def _bind_odd(triton: Triton) -> None:
    triton.add_route("/exit", _exit_route, methods=["GET"])
    triton.add_route("/interrupt", _interrupt_route, methods=["GET"])
    triton.add_route("/async-exit", _async_exit_route, methods=["GET"])
    triton.add_route("/cancelled", _cancelled_route, methods=["GET"])
    triton.add_route("/stop-iteration", _stop_iteration_route, methods=["GET"])
    triton.add_route("/stop-async-iteration", _stop_async_iteration_route, methods=["GET"])
    triton.add_route("/upstream", _upstream_route, methods=["GET"])
    triton.add_route("/text", lambda request: RouteResponse("é", media_type="text/plain"), methods=["GET"])
    triton.add_route("/no-content", lambda request: RouteResponse.json({}, status=204), methods=["GET"])
    triton.add_route("/not-modified", lambda request: RouteResponse(b"stale", status=304), methods=["GET"])
    triton.add_route("/ok", lambda request: "ok", methods=["GET"])
    triton.mount("/app", _no_content_app)


async def _no_content_app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"null"})  # as Starlette's JSONResponse(None, 204) sends


@pytest.fixture(scope="module", params=[None, 2], ids=["one-process", "frontends"])
def odd_server(request: Any) -> Iterator[Triton]:
    with running_triton(_bind_odd, frontends=request.param) as triton:
        yield triton


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/exit", "SystemExit: 3"),
        ("/interrupt", "KeyboardInterrupt"),
        ("/async-exit", "SystemExit: 4"),
        ("/cancelled", "CancelledError"),
        ("/stop-iteration", "StopIteration"),  # never answered, and "StopAsyncIteration: " with a space, before
        ("/stop-async-iteration", "StopAsyncIteration"),
        ("/upstream", "_UpstreamError: the upstream service answered 404"),
    ],
)
def test_what_a_handler_raises_fails_its_request_with_500_and_the_server_goes_on(
    odd_server: Triton, path: str, error: str
) -> None:
    port = odd_server.http_port
    assert port is not None
    assert _request(port, path) == (500, json.dumps({"error": error}, separators=(",", ":")).encode())
    assert _request(port, "/ok") == (200, b"ok")


def test_a_method_a_route_does_not_serve_gets_405_with_the_methods_it_does(odd_server: Triton) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{odd_server.http_port}/ok", data=b"{}", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    with refused.value:
        assert (refused.value.code, refused.value.headers["allow"]) == (405, "GET")  # RFC 9110 15.5.6


def test_a_str_body_of_a_route_response_is_sent_as_utf8(odd_server: Triton) -> None:
    assert odd_server.http_port is not None
    assert _request(odd_server.http_port, "/text") == (200, "é".encode())


@pytest.mark.parametrize("path", ["/no-content", "/not-modified", "/app/x"])
def test_a_204_or_304_answer_goes_without_a_body_and_the_connection_serves_on(odd_server: Triton, path: str) -> None:
    assert odd_server.http_port is not None
    with socket.create_connection(("127.0.0.1", odd_server.http_port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        received = b""
        while not received.endswith(b"\r\n\r\nok"):
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {received!r}"
            received += chunk
    first, second = received.split(b"\r\n\r\n", 1)
    assert first.split(b"\r\n", 1)[0] in (b"HTTP/1.1 204 No Content", b"HTTP/1.1 304 Not Modified")
    if path != "/not-modified":
        assert b"content-length" not in first.lower()  # RFC 9110 8.6: never with a 204
    assert second.startswith(b"HTTP/1.1 200 OK\r\n")  # the next answer, not the 204's or 304's body


async def _echo_route(request: RouteRequest) -> RouteResponse:
    return RouteResponse(request.body, media_type="application/octet-stream")


def _bind_echo(triton: Triton) -> None:
    triton.add_route("/echo", _echo_route)
    triton.bind(
        "whole",
        lambda requests: [{"text_output": np.array([[b"hi"]], dtype=object)} for _ in requests],
        [Tensor(name="text_input", dtype=bytes, shape=(1,))],
        [Tensor(name="text_output", dtype=bytes, shape=(1,))],
        openai=OpenAIChat(),
    )


BODY_LIMIT = 64 * 1024


@pytest.mark.parametrize("path", ["/echo", "/v1/chat/completions"])
@pytest.mark.parametrize("frontends", [None, 3])
def test_a_chunked_body_past_the_limit_that_never_ends_is_answered_413_and_its_connection_closed(
    frontends: Optional[int], path: str
) -> None:
    """The client sends a chunked body past the limit, then neither more nor its end (a body that never ends).

    With one process, the 413 went out at once but the rest of the body was read and dropped for as long as the
    client sent it (for ever; the body timeout ends a stalled one only); a frontend process read it all, unanswered,
    before forwarding its first bytes to the hub.
    """
    limits = ServerLimits(max_body_bytes=BODY_LIMIT, max_json_bytes=BODY_LIMIT, body_timeout_s=0)
    with running_triton(_bind_echo, frontends=frontends, limits=limits) as triton:
        assert triton.http_port is not None
        with socket.create_connection(("127.0.0.1", triton.http_port), timeout=WAIT_S) as sock:
            sock.sendall(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                % path.encode()
            )
            chunk = b"%x\r\n%s\r\n" % (4096, b" " * 4096)
            try:
                # Past the limit and past what the server holds before it hands a chunked body on (a body under that
                # reaches the app once it ends); no last chunk: the body goes on.
                sock.sendall(chunk * ((BODY_HIGH_WATER + 2 * BODY_LIMIT) // 4096))
            except OSError:  # closed already (the answer is read below)
                pass
            received = b""
            try:
                while True:  # until the server closes: without the fix, recv times out
                    data = sock.recv(65536)
                    if not data:
                        break
                    received += data
            except ConnectionResetError:  # what it read of the body last was the bytes it closed on
                pass
        head = received.split(b"\r\n\r\n", 1)[0]
        assert head.startswith(b"HTTP/1.1 413 "), received
        assert b"\r\nConnection: close" in head
        assert _request(triton.http_port, "/echo", {"x": 1}) == (200, b'{"x": 1}')  # the server goes on


@pytest.mark.parametrize("path", ["/echo", "/v2/models/whole/generate"])
def test_a_chunked_body_whose_first_part_is_past_the_limit_is_refused_413_at_once(path: str) -> None:
    """The app waits for the body from its head on, so the body reaches it in one part of BODY_HIGH_WATER bytes.

    The route's read checked the limit on the parts after the first only: past the limit in its first part, it
    waited for a second, which a body that never ends never brings (the client got no answer).
    """
    limits = ServerLimits(max_body_bytes=BODY_LIMIT, max_json_bytes=BODY_LIMIT, body_timeout_s=0)
    with running_triton(_bind_echo, limits=limits) as triton:
        assert triton.http_port is not None
        with socket.create_connection(("127.0.0.1", triton.http_port), timeout=WAIT_S) as sock:
            sock.sendall(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                % path.encode()
            )
            time.sleep(0.3)  # the app starts and waits for the body: not a retry, what makes its first part large
            chunk = b"%x\r\n%s\r\n" % (4096, b" " * 4096)
            try:
                sock.sendall(chunk * ((BODY_HIGH_WATER + 2 * 4096) // 4096))  # no last chunk
            except OSError:  # closed already (the answer is read below)
                pass
            received = b""
            try:
                while b"\r\n\r\n" not in received:
                    data = sock.recv(65536)
                    if not data:
                        break
                    received += data
            except ConnectionResetError:
                pass
        assert received.startswith(b"HTTP/1.1 413 "), received
