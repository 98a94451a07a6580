"""http_restricted_api and grpc_restricted_protocol: restricted APIs refuse calls without their header."""

from __future__ import annotations

import functools
import http.client
import json
import queue
import socket
from typing import Any, Callable, Dict, List, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import Tensor
from pytriton.options.access import Category, Restriction, http_category, parse_rules
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url
from tests.http_helpers import request

RULES = "model-repository,model-config:admin-key=admin-secret;inference:infer-key=infer-secret"
INFER_BODY = json.dumps({"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
    )


def test_rules_parse_groups_and_prefix_keys() -> None:
    rules = parse_rules(RULES, option="grpc_restricted_protocol", header_prefix="triton-grpc-protocol-")
    assert rules.rules == {
        Category.MODEL_REPOSITORY: Restriction("triton-grpc-protocol-admin-key", "admin-secret"),
        Category.MODEL_CONFIG: Restriction("triton-grpc-protocol-admin-key", "admin-secret"),
        Category.INFERENCE: Restriction("triton-grpc-protocol-infer-key", "infer-secret"),
    }
    assert not parse_rules(None, option="http_restricted_api")
    assert parse_rules("trace:k=a=b", option="x").rules[Category.TRACE] == Restriction("k", "a=b")
    # A list holds one option value per item, as nvidia-pytriton 0.7 passes a list (one tritonserver flag each).
    listed = parse_rules(["model-repository,model-config:admin-key=admin-secret", "inference:k=v"], option="x")
    assert listed.rules[Category.MODEL_CONFIG] == Restriction("admin-key", "admin-secret")
    assert listed.rules[Category.INFERENCE] == Restriction("k", "v")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus:k=v", "unknown restricted api 'bogus'"),
        ("health:k=v;health,metadata:k2=v2", "restricted api 'health' can not be specified in multiple config groups"),
        ("health", "format is '<apis>:<key>=<value>'"),
        ("health:k", "format is '<apis>:<key>=<value>'"),
        ("health:=v", "format is '<apis>:<key>=<value>'"),
        # Names are taken as written, as tritonserver takes them (its words, measured on 2.51).
        ("health, metadata:k=v", "unknown restricted api ' metadata'"),
        ("health,,metadata:k=v", "unknown restricted api ''"),
        ("Health:k=v", "unknown restricted api 'Health'"),
        ("health,health:k=v", "restricted api 'health' can not be specified in multiple config groups"),
    ],
)
def test_bad_rules_are_refused(text: str, message: str) -> None:
    with pytest.raises(PyTritonValidationError, match=message):
        parse_rules(text, option="http_restricted_api")


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/v2", Category.METADATA),
        ("/v2/health/ready", Category.HEALTH),
        ("/v2/models/m", Category.METADATA),
        ("/v2/models/m/versions/1/ready", Category.HEALTH),
        ("/v2/models/m/config", Category.MODEL_CONFIG),
        ("/v2/models/m/versions/1/infer", Category.INFERENCE),
        ("/v2/models/m/generate_stream", Category.INFERENCE),
        ("/v2/models/stats", Category.STATISTICS),
        ("/v2/models/m/stats", Category.STATISTICS),
        ("/v2/models/m/trace/setting", Category.TRACE),
        ("/v2/trace/setting", Category.TRACE),
        ("/v2/logging", Category.LOGGING),
        ("/v2/repository/index", Category.MODEL_REPOSITORY),
        ("/v2/repository/models/m/load", Category.MODEL_REPOSITORY),
        ("/v2/systemsharedmemory/status", Category.SHARED_MEMORY),
        ("/metrics", Category.CUSTOM),  # outside /v1 and /v2: a custom route's (Triton.add_route)
        ("/my/route", Category.CUSTOM),
        ("//v2/logging", Category.CUSTOM),  # not under /v2: Triton's routes find nothing
        ("/v2/nope", None),
        # Paths Triton's route patterns do not match answer 404 there, not the category's 403.
        ("/v2/models/m/versions/abc", None),
        ("/v2/models/m/versions/-1/infer", None),
        ("/v2/models/m/versions/1/trace/setting", None),
        ("/v2/models//stats", None),
        ("/v2/repository/foo", None),
        ("/v2/repository/models/m/drop", None),
        ("/v2/systemsharedmemory/foo", None),
        ("/v2/cudasharedmemory/region//status", None),
        # ...and those they match, with Triton's optional parts.
        ("/v2/models/stats/ready", Category.HEALTH),  # a model named "stats"
        ("/v2/repository/r/index", Category.MODEL_REPOSITORY),
        ("/v2/repository/r/models/m/unload", Category.MODEL_REPOSITORY),
        ("/v2/cudasharedmemory/region/r/unregister", Category.SHARED_MEMORY),
        ("/v1/models", Category.METADATA),
        ("/v1/embeddings", Category.INFERENCE),
    ],
)
def test_http_paths_map_to_categories(path: str, category: Any) -> None:
    assert http_category(path) is category


def test_http_restricted_api_needs_the_header(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, http_restricted_api=RULES, allow_grpc=False, allow_metrics=False)
    port = triton.http_port
    status, _, body = request(port, "POST", "/v2/repository/index")
    assert status == 403
    assert json.loads(body) == {"error": "This API is restricted, expecting header 'admin-key'"}
    assert request(port, "POST", "/v2/repository/index", headers={"admin-key": "wrong"})[0] == 403
    assert request(port, "POST", "/v2/repository/index", headers={"Admin-Key": "admin-secret"})[0] == 200
    assert request(port, "GET", "/v2/models/identity/config")[0] == 403
    assert request(port, "GET", "/v2/models/identity/config", headers={"admin-key": "admin-secret"})[0] == 200
    status, _, body = request(port, "POST", "/v2/models/identity/infer", INFER_BODY)
    assert status == 403 and b"expecting header 'infer-key'" in body
    assert request(port, "POST", "/v2/models/identity/infer", INFER_BODY, {"infer-key": "infer-secret"})[0] == 200
    # Unrestricted categories and unknown paths are untouched.
    assert request(port, "GET", "/v2/health/ready")[0] == 200
    assert request(port, "GET", "/v2/models/identity")[0] == 200
    assert request(port, "GET", "/v2/nope")[0] == 404


def test_http_client_passes_with_headers(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, http_restricted_api=RULES, allow_grpc=False, allow_metrics=False)
    client = httpclient.InferenceServerClient(http_url(triton))
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.get_model_repository_index()
    index = client.get_model_repository_index(headers={"admin-key": "admin-secret"})
    assert [entry["name"] for entry in index] == ["identity"]
    inputs = [httpclient.InferInput("IN", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    result = client.infer("identity", inputs, headers={"infer-key": "infer-secret"})
    assert result.as_numpy("OUT").tolist() == [[1, 2]]
    client.close()


def test_grpc_restricted_protocol_needs_the_metadata(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, grpc_restricted_protocol=RULES, allow_metrics=False)
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_repository_index()
    assert raised.value.status() == "StatusCode.UNAVAILABLE"
    assert raised.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    admin = {"triton-grpc-protocol-admin-key": "admin-secret"}
    assert [model.name for model in client.get_model_repository_index(headers=admin).models] == ["identity"]
    assert client.get_model_config("identity", headers=admin).config.name == "identity"
    inputs = [grpcclient.InferInput("IN", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
        client.infer("identity", inputs)
    result = client.infer("identity", inputs, headers={"triton-grpc-protocol-infer-key": "infer-secret"})
    assert result.as_numpy("OUT").tolist() == [[1, 2]]
    # The HTTP header form does not open a gRPC restriction; unrestricted RPCs need nothing.
    with pytest.raises(InferenceServerException, match="restricted"):
        client.infer("identity", inputs, headers={"infer-key": "infer-secret"})
    assert client.is_server_ready() and client.get_model_metadata("identity").name == "identity"
    client.close()


def _put_outcome(results: queue.Queue[Any], result: Any, error: Any) -> None:
    results.put(error or result)


def test_grpc_restricted_stream(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, grpc_restricted_protocol="inference:infer-key=s", allow_metrics=False)
    inputs = [grpcclient.InferInput("IN", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    for headers, expect_error in ((None, True), ({"triton-grpc-protocol-infer-key": "s"}, False)):
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        results: queue.Queue[Any] = queue.Queue()
        client.start_stream(functools.partial(_put_outcome, results), headers=headers)
        try:
            client.async_stream_infer("identity", inputs)
        except InferenceServerException:  # the refused stream may already be closed; its error is in the callback
            assert expect_error
        outcome = results.get(timeout=10)
        client.stop_stream()
        client.close()
        if expect_error:
            assert isinstance(outcome, InferenceServerException)
            assert "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'" in str(outcome)
        else:
            assert outcome.as_numpy("OUT").tolist() == [[1, 2]]


def _repeated_header(port: int, path: str, name: str, values: Tuple[str, ...]) -> int:
    """The status of a POST to `path` that sends header `name` once per value, in order."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", path)
        for value in values:
            connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_http_a_repeated_header_is_read_at_its_first_value(start_triton: Callable[..., Triton]) -> None:
    """tritonserver 2.51 (libevhtp) reads the first: [right, wrong] passes, [wrong, right] gets 403."""
    triton = start_triton(_bind, http_restricted_api=RULES, allow_grpc=False, allow_metrics=False)
    port = triton.http_port
    assert _repeated_header(port, "/v2/repository/index", "admin-key", ("admin-secret", "wrong")) == 200
    assert _repeated_header(port, "/v2/repository/index", "admin-key", ("wrong", "admin-secret")) == 403
    assert _repeated_header(port, "/v2/repository/index", "Admin-Key", ("admin-secret", "admin-secret")) == 200


def test_http_paths_triton_does_not_route_are_not_found_under_restriction(start_triton: Callable[..., Triton]) -> None:
    """As in tritonserver 2.51: 404 for paths its routes do not match, restricted or not; a model "stats" is routed."""
    rules = "inference,metadata,model-repository,statistics,trace,shared-memory,health:k=v"
    triton = start_triton(_bind, http_restricted_api=rules, allow_grpc=False, allow_metrics=False)
    port = triton.http_port
    for method, path in [
        ("POST", "/v2/models/identity/versions/abc/infer"),
        ("GET", "/v2/models/identity/versions/1/trace/setting"),
        ("POST", "/v2/repository/foo"),
        ("GET", "/v2/systemsharedmemory/foo"),
        ("GET", "/v2/models//stats"),
    ]:
        status, _, body = request(port, method, path)
        assert (status, json.loads(body)) == (404, {"error": "Not Found"}), path
        assert request(port, method, path, headers={"k": "v"})[0] == 404, path  # nor served with the header
    assert request(port, "GET", "/v2/models/stats/ready")[0] == 403
    status, _, body = request(port, "GET", "/v2/models/stats/config", headers={"k": "v"})
    assert (status, json.loads(body)) == (404, {"error": "Request for unknown model: 'stats' is not found"})


def test_grpc_repeated_metadata_is_read_at_its_first_value(start_triton: Callable[..., Triton]) -> None:
    """tritonserver 2.51 finds the first value of a key in its metadata multimap."""
    triton = start_triton(_bind, grpc_restricted_protocol=RULES, allow_metrics=False)
    key = "triton-grpc-protocol-admin-key"
    with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), metadata=[(key, "admin-secret"), (key, "x")])
        assert [model.name for model in index.models] == ["identity"]
        with pytest.raises(grpc.RpcError) as raised:
            stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), metadata=[(key, "x"), (key, "admin-secret")])
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert raised.value.details() == f"This protocol is restricted, expecting header '{key}'"


def test_http_a_value_not_ascii_is_compared_in_utf8(start_triton: Callable[..., Triton]) -> None:
    """tritonserver 2.51 compares the header's bytes with its option's (UTF-8): t\xc3\xb6k passes, t\xf6k not."""
    triton = start_triton(_bind, http_restricted_api="health:k=t\u00f6k", allow_grpc=False, allow_metrics=False)
    for value, status in ((b"t\xc3\xb6k", 200), (b"t\xf6k", 403)):
        with socket.create_connection(("127.0.0.1", triton.http_port), timeout=30) as connection:
            connection.sendall(
                b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nk: " + value + b"\r\nConnection: close\r\n\r\n"
            )
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert answer.split(b" ")[1] == str(status).encode(), value


def test_grpc_a_bin_key_is_compared_on_its_decoded_bytes(start_triton: Callable[..., Triton]) -> None:
    """A `-bin` key travels base64-encoded; tritonserver 2.51 compares the decoded bytes with the value and passes."""
    triton = start_triton(_bind, grpc_restricted_protocol="model-repository:k-bin=s3cret", allow_metrics=False)
    key = "triton-grpc-protocol-k-bin"
    with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), metadata=[(key, b"s3cret")])
        assert [model.name for model in index.models] == ["identity"]
        with pytest.raises(grpc.RpcError) as raised:
            stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), metadata=[(key, b"other")])
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpc_an_unparsable_message_is_refused_before_the_restriction(start_triton: Callable[..., Triton]) -> None:
    """grpc parses the message before tritonserver 2.51 checks the metadata: INTERNAL, with or without it."""
    triton = start_triton(_bind, grpc_restricted_protocol=RULES, allow_metrics=False)
    with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}") as channel:
        index = channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex")
        for metadata in ((), (("triton-grpc-protocol-admin-key", "admin-secret"),)):
            with pytest.raises(grpc.RpcError) as raised:
                index(b"\xff\xff\xff", metadata=metadata, timeout=30)
            assert raised.value.code() == grpc.StatusCode.INTERNAL
            assert raised.value.details() == "Unable to parse request"
