"""nvidia-pytriton 0.7's client options, against a real server.

model_config, ensure_model_is_ready, access_token, from_existing_client, load/unload, FuturesModelClient's queue,
and the auth and repository-index helpers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pytriton.client.auth import create_auth_headers, extract_access_token_from_headers
from pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.utils import ModelState, get_model_state, parse_grpc_response, parse_http_response
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH
from tests.test_client_support import WAIT_S, ClientServer, Gate, floats

pytest_plugins = ["tests.test_client_support"]

# What the add_sub model of the client tests looks like, handed to a client so it does not ask.
ADD_SUB = TritonModelConfig(
    model_name="add_sub",
    max_batch_size=8,
    inputs=[TensorSpec("a", (-1,), np.float32), TensorSpec("b", (-1,), np.float32)],
    outputs=[TensorSpec("sum", (-1,), np.float32), TensorSpec("diff", (-1,), np.float32)],
)


def test_auth_headers_per_protocol() -> None:
    assert create_auth_headers("t", "http") == {"triton-access-token": "t"}
    assert create_auth_headers("t", "GRPC") == {"triton-grpc-protocol-triton-access-token": "t"}
    for token, protocol in (("", "http"), (None, "http"), ("t", "ftp")):
        with pytest.raises(ValueError):
            create_auth_headers(token, protocol)
    assert extract_access_token_from_headers({"triton-access-token": "a"}) == "a"
    assert extract_access_token_from_headers({"triton-grpc-protocol-triton-access-token": "b"}) == "b"
    assert extract_access_token_from_headers({"other": "x"}) is None and extract_access_token_from_headers(None) is None
    with pytest.raises(ValueError, match="Conflicting authentication headers"):
        extract_access_token_from_headers({"triton-access-token": "a", "triton-grpc-protocol-triton-access-token": "b"})


def test_a_given_config_is_used_without_asking_the_server(client_url: str) -> None:
    # ensure_model_is_ready=False: no readiness wait, no config request; a model that is not there fails at
    # once rather than after init_timeout_s.
    missing = TritonModelConfig(model_name="missing", max_batch_size=8, inputs=ADD_SUB.inputs, outputs=ADD_SUB.outputs)
    with ModelClient(client_url, "missing", model_config=missing, ensure_model_is_ready=False, init_timeout_s=60) as c:
        assert c.model_config is missing
        with pytest.raises(PyTritonClientInferenceServerError, match="unknown model"):
            c.infer_sample(floats(1), floats(2))
    with ModelClient(client_url, "add_sub", model_config=ADD_SUB, ensure_model_is_ready=False) as client:
        assert client.infer_sample(floats(1), floats(2))["sum"].tolist() == [3]


def test_ensure_model_is_ready_still_waits_for_the_model(client_url: str) -> None:
    missing = TritonModelConfig(model_name="missing", max_batch_size=8, inputs=ADD_SUB.inputs, outputs=ADD_SUB.outputs)
    with ModelClient(client_url, "missing", model_config=missing, init_timeout_s=0.3) as client:
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(floats(1), floats(2))


def test_from_existing_client_shares_settings_and_config(client_url: str) -> None:
    with ModelClient(client_url, "add_sub", inference_timeout_s=7) as first:
        first.infer_sample(floats(1), floats(1))
        with ModelClient.from_existing_client(first) as second:
            assert type(second) is ModelClient
            assert second.model_config is first.model_config
            assert second.infer_sample(floats(1), floats(2))["diff"].tolist() == [-1]


def test_decoupled_clients_are_model_clients_of_their_kind(client_server: ClientServer) -> None:
    url = client_server.url("grpc")
    with DecoupledModelClient(url, "stream") as client:
        assert isinstance(client, ModelClient)
        assert [r["y"].tolist() for r in client.infer_sample(x=floats(1))] == [[1], [2], [3], [4]]
        copy = DecoupledModelClient.from_existing_client(client)
        assert [r["y"].tolist() for r in copy.infer_sample(x=floats(0))] == [[0], [1], [2], [3]]
        copy.close()
    with pytest.raises(PyTritonClientValueError, match="only supported for grpc"):
        DecoupledModelClient(client_server.url("http"), "stream")
    assert issubclass(AsyncioDecoupledModelClient, AsyncioModelClient)

    async def stream() -> list:  # type: ignore[type-arg]
        async with AsyncioDecoupledModelClient(url, "stream", model_config=None) as client:
            return [r["y"].tolist() async for r in client.infer_sample(x=floats(1))]

    assert asyncio.run(stream()) == [[1], [2], [3], [4]]


def test_asyncio_client_with_a_given_config(client_url: str) -> None:
    async def infer() -> np.ndarray:
        async with AsyncioModelClient(client_url, "add_sub", model_config=ADD_SUB, ensure_model_is_ready=False) as c:
            return (await c.infer_sample(floats(1), floats(2)))["sum"]

    assert asyncio.run(infer()).tolist() == [3]


@pytest.fixture(scope="module")
def guarded() -> Iterator[Triton]:
    """A server that restricts inference too, so every client must carry the token."""
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, restricted_endpoints=["inference", "model-repository"])
    stream_config = ModelConfig(max_batch_size=4, decoupled=True)
    vector = [Tensor(name="x", dtype=np.float32, shape=(-1,))]

    def stream(requests: list) -> Iterator[list]:  # type: ignore[type-arg]
        yield [{"x": request["x"]} for request in requests]

    config = TritonConfig(http_port=0, grpc_port=0, allow_metrics=False)
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            "echo", lambda requests: requests, inputs=vector, outputs=vector, config=ModelConfig(max_batch_size=4)
        )
        triton.bind("stream", stream, inputs=vector, outputs=vector, config=stream_config)
        yield triton


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_client_sends_the_access_token(guarded: Triton, protocol: str) -> None:
    url = f"{protocol}://127.0.0.1:{guarded.http_port if protocol == 'http' else guarded.grpc_port}"
    with ModelClient(url, "echo", init_timeout_s=5) as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            client.infer_sample(x=floats(1))
    with ModelClient(url, "echo", access_token=ACCESS_TOKEN) as client:
        assert client.infer_sample(x=floats(1))["x"].tolist() == [1]
        with ModelClient.from_existing_client(client) as copy:
            assert copy.infer_batch(x=np.ones((2, 1), np.float32))["x"].shape == (2, 1)

    async def infer() -> np.ndarray:
        async with AsyncioModelClient(url, "echo", access_token=ACCESS_TOKEN) as client:
            return (await client.infer_sample(x=floats(2)))["x"]

    assert asyncio.run(infer()).tolist() == [2]
    with FuturesModelClient(url, "echo", access_token=ACCESS_TOKEN) as futures:
        assert futures.infer_sample(x=floats(3)).result(WAIT_S)["x"].tolist() == [3]
    if protocol == "grpc":
        with DecoupledModelClient(url, "stream", access_token=ACCESS_TOKEN) as decoupled:
            assert [r["x"].tolist() for r in decoupled.infer_sample(x=floats(4))] == [[4]]


def test_load_and_unload_need_the_token(guarded: Triton) -> None:
    url = f"http://127.0.0.1:{guarded.http_port}"
    with ModelClient(url, "echo", access_token=ACCESS_TOKEN) as client:
        client.unload_model()
        index = httpclient.InferenceServerClient(url[len("http://") :])
        try:
            assert not index.is_model_ready("echo")
            assert get_model_state(index, "echo", headers=HTTP_AUTH) is ModelState.UNAVAILABLE
            entries = index.get_model_repository_index(headers=HTTP_AUTH)
            assert parse_http_response(entries)[("echo", "1")] is ModelState.UNAVAILABLE
        finally:
            index.close()
            client.load_model()
        assert client.infer_sample(x=floats(5))["x"].tolist() == [5]
    with ModelClient(url, "echo") as client:
        with pytest.raises(Exception, match="restricted"):
            client.unload_model()


def test_repository_index_parsers() -> None:
    from tritonclient.grpc import service_pb2

    http_index = [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "a", "version": "2", "state": ""},
        {"name": "b", "state": "READY"},  # no version: left out, as 0.7 does
    ]
    assert parse_http_response(http_index) == {("a", "1"): ModelState.READY, ("a", "2"): ModelState.LOADING}
    grpc_index = service_pb2.RepositoryIndexResponse(
        models=[{"name": "a", "version": "1", "state": "UNAVAILABLE"}, {"name": "b"}]
    )
    assert parse_grpc_response(grpc_index.models) == {("a", "1"): ModelState.UNAVAILABLE}


def test_futures_client_queue_bound(client_url: str, slow_gate: Gate) -> None:
    with pytest.raises(ValueError, match="max_queue_size"):
        FuturesModelClient(client_url, "slow", max_queue_size=0)
    with FuturesModelClient(client_url, "slow", max_workers=1, max_queue_size=1, non_blocking=True) as client:
        running = client.infer_sample(x=floats(0))
        assert slow_gate.entered.wait(WAIT_S)  # the one worker is busy
        queued = client.infer_sample(x=floats(1))  # waits in the queue
        with pytest.raises(PyTritonClientQueueFullError):
            client.infer_sample(x=floats(2))
        slow_gate.release()
        done, _ = concurrent.futures.wait([running, queued], timeout=WAIT_S)
        assert len(done) == 2


def test_a_connection_the_server_closes_mid_call_is_a_client_error() -> None:
    # A server that dies after reading a request: tritonclient.http raised geventhttpclient's HTTPConnectionClosed,
    # no PyTritonClientError. 0.7 words every failed connection as a timeout; so does this one now.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def read_then_close() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)

    closer = threading.Thread(target=read_then_close, daemon=True)
    closer.start()
    try:
        url = f"http://127.0.0.1:{port}"
        with ModelClient(url, "add_sub", model_config=ADD_SUB, ensure_model_is_ready=False) as client:
            with pytest.raises(PyTritonClientTimeoutError) as closed:
                client.infer_sample(floats(1), floats(2))
        assert str(closed.value).startswith("Timeout occurred during inference request. Timeout: 60.0 s Message: ")
    finally:
        closer.join(WAIT_S)
        listener.close()


def test_a_server_that_closes_every_connection_is_not_ready() -> None:
    # Readiness probes took a connection closed unanswered (geventhttpclient's HTTPConnectionClosed) for an error
    # to raise at once, where a refused one is "not ready yet": the wait now goes on to its timeout.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def read_then_close() -> None:
        while not stop.is_set():
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)

    closer = threading.Thread(target=read_then_close, daemon=True)
    closer.start()
    try:
        with ModelClient(f"http://127.0.0.1:{port}", "add_sub", init_timeout_s=0.5) as client:
            with pytest.raises(PyTritonClientTimeoutError, match=r"^Waiting for server to be ready timed out\.$"):
                client.wait_for_server(0.5)
            with pytest.raises(PyTritonClientTimeoutError):
                client.infer_sample(floats(1), floats(2))
    finally:
        stop.set()
        socket.create_connection(("127.0.0.1", port)).close()  # wakes the accept
        closer.join(WAIT_S)
        listener.close()
