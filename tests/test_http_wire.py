"""HTTP answers as tritonserver 2.51 frames them, beside their payloads: content types, codings, repeated headers.

Each case was compared against NVIDIA's PyTriton 0.7 (tritonserver 2.51) with bench/http_wire_probe.py.
Triton's handlers set `application/json` themselves; where a handler answers before it sets one (health,
readiness, routing's 404, a restricted API's 403, an infer refused before its JSON is read), libevhtp sends
`text/plain`.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, SequenceBatcher, Tensor
from pytriton.triton import Triton
from tests.conftest import HTTP_AUTH, running_triton
from tests.http_helpers import request

INFER = b'{"inputs":[{"name":"INPUT_1","datatype":"FP32","shape":[1,2],"data":[1,2]}]}'
HUGE_VERSION = "99999999999999999999"


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        lambda requests: [{"OUTPUT_1": r["INPUT_1"]} for r in requests],
        inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "fails",
        _fails,
        inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "sequence",
        lambda requests: [{"OUTPUT_1": r["INPUT_1"]} for r in requests],
        inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8, sequence_batcher=SequenceBatcher()),
    )


def _fails(requests: object) -> None:
    raise ValueError("the model says no")


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


def _port(server: Triton) -> int:
    assert server.http_port is not None
    return server.http_port


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "error"),
    [
        ("GET", "/v2/health/live", {}, None, 200, None),
        ("GET", "/v2/health/ready", {}, None, 200, None),
        ("GET", "/v2/models/identity/ready", {}, None, 200, None),
        ("GET", "/v2/models/nothing/ready", {}, None, 400, "Model version not ready"),
        ("POST", "/v2/health/live", {}, b"{}", 405, "Method Not Allowed"),
        ("GET", "/v2/models/identity/infer", {}, None, 405, "Method Not Allowed"),
        ("GET", "/v2/nothing", {}, None, 404, "Not Found"),
        ("GET", "/v2/models/identity/versions/abc", {}, None, 404, "Not Found"),
        ("GET", "/v2/models/stats", {}, None, 403, "This API is restricted, expecting header 'triton-access-token'"),
        ("POST", "/v2/models/nothing/infer", {}, INFER, 404, "Request for unknown model: 'nothing' is not found"),
        (
            "POST",
            "/v2/models/identity/infer",
            {"Inference-Header-Content-Length": "1000"},
            INFER,
            400,
            f"inference header size should be in range (0, {len(INFER)}), got: 1000",
        ),
    ],
)
def test_what_triton_answers_before_its_handler_sets_a_content_type_is_text_plain(
    server: Triton,
    method: str,
    path: str,
    headers: Dict[str, str],
    body: Optional[bytes],
    status: int,
    error: Optional[str],
) -> None:
    got, answer_headers, answer = request(_port(server), method, path, body, headers)
    assert (got, answer_headers["content-type"]) == (status, "text/plain")
    assert (json.loads(answer)["error"] if error else answer) == (error or b"")


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v2/systemsharedmemory/unregister", b"", 200),
        ("POST", "/v2/systemsharedmemory/region/x/unregister", b"", 200),
        ("POST", "/v2/repository/models/nothing/unload", b"", 200),
        ("POST", "/v2", b"{}", 405),
        ("PUT", "/v2/models/identity/config", b"{}", 405),
        ("GET", "/v2/repository/models/identity/load", None, 405),
        ("POST", "/v2/models/identity/infer", b"{}", 400),  # the JSON is read: Triton has set its type
    ],
)
def test_handlers_that_set_json_answer_json_even_empty_or_refusing(
    server: Triton, method: str, path: str, body: Optional[bytes], status: int
) -> None:
    got, headers, answer = request(_port(server), method, path, body, HTTP_AUTH)
    assert (got, headers["content-type"]) == (status, "application/json")
    assert answer == b"" if status == 200 else "error" in json.loads(answer)


@pytest.mark.parametrize("coding", ["br", "compress", "gzip, deflate"])
def test_a_content_encoding_not_undone_is_tritons_501_naming_the_codings_that_are(server: Triton, coding: str) -> None:
    status, headers, answer = request(
        _port(server), "POST", "/v2/models/identity/infer", INFER, {"Content-Encoding": coding}
    )
    assert (status, headers["content-type"], headers["accept-encoding"]) == (501, "text/plain", "gzip, deflate")
    assert json.loads(answer)["error"].startswith("Unsupported compression type")


def _repeated(port: int, name: str, values: Tuple[str, ...], body: bytes) -> Tuple[int, bytes]:
    """POST an infer request with header `name` sent once per value, in order."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/identity/infer")
        for value in values:
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_the_first_of_repeated_infer_headers_counts_as_in_triton(server: Triton) -> None:
    status, answer = _repeated(_port(server), "Inference-Header-Content-Length", (str(len(INFER)), "3"), INFER)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        (f"/v2/models/identity/versions/{HUGE_VERSION}/ready", "text/plain"),
        (f"/v2/models/identity/versions/{HUGE_VERSION}/config", "application/json"),
        (f"/v2/models/identity/versions/{HUGE_VERSION}", "application/json"),
    ],
)
def test_a_version_past_int64_is_refused_in_tritons_words(server: Triton, path: str, content_type: str) -> None:
    status, headers, answer = request(_port(server), "GET", path, None, HTTP_AUTH)
    assert (status, headers["content-type"]) == (400, content_type)
    assert json.loads(answer)["error"] == (
        f"failed to get model version from specified version string '{HUGE_VERSION}' (details: stol), "
        "version should be an integral value > 0"
    )


def test_an_error_the_model_answers_has_no_json_type_and_one_refused_at_submission_has(server: Triton) -> None:
    port = _port(server)
    status, headers, answer = request(port, "POST", "/v2/models/fails/infer", INFER)
    assert (status, headers["content-type"]) == (500, "text/plain")  # Triton's response callback sets none
    assert "the model says no" in json.loads(answer)["error"]
    status, headers, answer = request(port, "POST", "/v2/models/sequence/infer", INFER)  # no correlation ID
    assert (status, headers["content-type"]) == (400, "application/json")  # refused as Triton's InferAsync refuses
    assert "must specify a non-zero or non-empty correlation ID" in json.loads(answer)["error"]


def test_through_frontend_processes_an_answered_error_keeps_its_framing() -> None:
    with running_triton(_bind, allow_grpc=False, allow_metrics=False, frontends=3) as triton:
        port = _port(triton)
        status, headers, _ = request(port, "POST", "/v2/models/fails/infer", INFER)
        assert (status, headers["content-type"]) == (500, "text/plain")
        status, headers, _ = request(port, "POST", "/v2/models/sequence/infer", INFER)
        assert (status, headers["content-type"]) == (400, "application/json")


def test_a_connect_request_is_routed_as_triton_routes_it_to_no_route(server: Triton) -> None:
    status, headers, answer = request(_port(server), "CONNECT", "example.com:443")
    assert (status, headers["content-type"], json.loads(answer)) == (404, "text/plain", {"error": "Not Found"})


@pytest.mark.parametrize("before", [b"", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_an_http2_client_is_told_this_port_speaks_http1(server: Triton, before: bytes) -> None:
    # curl --http2-prior-knowledge, httpx with http1=False: tritonserver closes without a word; this server
    # answered 400 "invalid HTTP request: Pause on PRI/Upgrade" (its HTTP parser's words).
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
        sock.sendall(before + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    heads, body = received.rsplit(b"\r\n\r\n", 1)  # the last answer's body: its error
    assert heads.split(b"HTTP/1.1 ")[-1].startswith(b"505 HTTP Version Not Supported\r\n")
    assert json.loads(body) == {
        "error": "HTTP/2 is not served on this port, which speaks HTTP/1.1 (gRPC has a port of its own)"
    }
