"""Robustness: server limits, faults in the callable, disconnecting clients and shutdown with requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.exceptions import PyTritonValidationError
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.options.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_BYTES, ServerLimits
from pytriton.triton import Triton, TritonConfig
from tests.h2_wire import H2Client, grpc_message, infer_request, request_headers
from tests.http_helpers import post_json, request
from tests.waiting import wait_until

WAIT_S = 10.0
FP32 = [Tensor(dtype=np.float32, shape=(-1,))]


# ---------------------------------------------------------------- helpers


@contextlib.contextmanager
def serving(bind: Callable[[Triton], None], limits: Optional[ServerLimits] = None, **config: Any) -> Iterator[Triton]:
    """A server on free ports with the given limits (metrics off)."""
    options: Dict[str, Any] = {"http_port": 0, "grpc_port": 0, "allow_metrics": False}
    options.update(config)
    triton = Triton(config=TritonConfig(**options), limits=limits)
    try:
        bind(triton)
        triton.run()
        yield triton
    finally:
        triton.stop()


def loop_tasks(triton: Triton) -> int:
    """Number of asyncio tasks on the server's loop (the probe's own task included)."""
    return triton._runtime._loop.call(lambda: len(asyncio.all_tasks()))


def pending(triton: Triton, model: str) -> int:
    """Requests waiting in a model's queue."""
    return triton._runtime.engine.model(model).scheduler.pending


def head_bytes_read(triton: Triton, client: socket.socket) -> int:
    """Bytes of an unfinished request head that the HTTP port has read from `client` (0: none yet)."""
    from pytriton.transport.http.server import AsgiServer

    port = client.getsockname()[1]

    def count() -> int:
        return sum(
            connection._head_bytes
            for frontend in triton._runtime._frontends
            if isinstance(frontend, AsgiServer)
            for connection in frontend.connections
            if connection._transport.get_extra_info("peername")[1] == port
        )

    return triton._runtime._loop.call(count)


def infer_body(values: List[float], name: str = "INPUT_1", **parameters: Any) -> Dict[str, Any]:
    """A JSON infer body with one FP32 row."""
    body: Dict[str, Any] = {"inputs": [{"name": name, "shape": [1, len(values)], "datatype": "FP32", "data": values}]}
    if parameters:
        body["parameters"] = parameters
    return body


def raw_http(port: int) -> socket.socket:
    """A plain TCP connection to the HTTP port."""
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def read_response(sock: socket.socket) -> Tuple[int, Dict[str, str], bytes]:
    """Read one HTTP/1.1 response with a Content-Length body; status 0 when the server closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def grpc_request(model: str, values: List[float], name: str = "INPUT_1", **parameters: Any) -> Any:
    """A ModelInferRequest with one FP32 row in raw contents."""
    message = service_pb2.ModelInferRequest(model_name=model)
    tensor = message.inputs.add(name=name, datatype="FP32", shape=[1, len(values)])
    del tensor
    message.raw_input_contents.append(np.asarray(values, dtype=np.float32).tobytes())
    for key, value in parameters.items():
        if isinstance(value, str):
            message.parameters[key].string_param = value
        else:
            message.parameters[key].int64_param = value
    return message


@contextlib.contextmanager
def grpc_stub(triton: Triton) -> Iterator[Any]:
    """A raw GRPCInferenceService stub on a fresh channel."""
    channel = grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}")
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


class Gate:
    """A callable that holds each call until released; counts the calls it saw."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def warm_up(self, call: Callable[[], Any]) -> None:
        """Make one call through an open gate (the instance thread starts), then close the gate."""
        self.release.set()
        call()
        self.release.clear()
        self.entered.clear()
        self.calls = 0

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        self.calls += 1
        self.entered.set()
        self.release.wait(WAIT_S)
        return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


# ---------------------------------------------------------------- ServerLimits


def test_limits_defaults_env_and_validation(monkeypatch):
    defaults = ServerLimits()
    assert defaults.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 2**31 - 1  # binary tensors: as a gRPC message
    assert defaults.max_json_bytes == DEFAULT_MAX_JSON_BYTES == 64 * 1024 * 1024  # tritonserver 2.59's JSON bound
    assert defaults.grpc_max_message_bytes == 2**31 - 1 and defaults.keep_alive_timeout_s == 75.0
    monkeypatch.setenv("PYTRITON_LIMIT_MAX_BODY_BYTES", "1000")
    monkeypatch.setenv("PYTRITON_LIMIT_HEADER_TIMEOUT_S", "2.5")
    from_env = ServerLimits.from_env()
    assert from_env.max_body_bytes == 1000 and from_env.header_timeout_s == 2.5
    assert from_env.max_connections == defaults.max_connections
    with pytest.raises(PyTritonValidationError, match="PYTRITON_LIMIT_MAX_CONNECTIONS must be an integer"):
        ServerLimits.from_env({"PYTRITON_LIMIT_MAX_CONNECTIONS": "many"})
    with pytest.raises(PyTritonValidationError, match="max_body_bytes must be a positive integer"):
        ServerLimits(max_body_bytes=0)
    with pytest.raises(PyTritonValidationError, match="body_timeout_s must be a finite number >= 0"):
        ServerLimits(body_timeout_s=-1)
    with pytest.raises(PyTritonValidationError, match="grpc_max_message_bytes must be <="):
        ServerLimits(grpc_max_message_bytes=2**31)


def test_a_misspelt_limit_variable_is_warned_of(caplog):
    # It was ignored without a word: the server ran with the default of the limit meant.
    limits = ServerLimits.from_env({"PYTRITON_LIMIT_MAX_BOD_BYTES": "1000", "PYTRITON_LIMIT_LAME_DUCK_S": "1"})
    assert limits.max_body_bytes == DEFAULT_MAX_BODY_BYTES and limits.lame_duck_s == 1.0
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        "PYTRITON_LIMIT_MAX_BOD_BYTES is not a server limit, ignored (did you mean PYTRITON_LIMIT_MAX_BODY_BYTES?)"
    ]


def test_grpc_connection_limits_defaults_env_and_validation():
    defaults = ServerLimits()
    assert (defaults.grpc_max_concurrent_streams, defaults.grpc_max_stream_requests) == (100, 128)
    assert (defaults.grpc_max_connections, defaults.grpc_idle_timeout_s, defaults.grpc_handshake_timeout_s) == (
        4096,
        300.0,
        10.0,
    )
    from_env = ServerLimits.from_env(
        {"PYTRITON_LIMIT_GRPC_MAX_CONCURRENT_STREAMS": "8", "PYTRITON_LIMIT_GRPC_IDLE_TIMEOUT_S": "0"}
    )
    assert from_env.grpc_max_concurrent_streams == 8 and from_env.grpc_idle_timeout_s == 0.0  # 0: no timeout
    with pytest.raises(PyTritonValidationError, match="grpc_max_stream_requests must be a positive integer"):
        ServerLimits(grpc_max_stream_requests=0)
    with pytest.raises(PyTritonValidationError, match="grpc_max_concurrent_streams must be <= 2"):
        ServerLimits(grpc_max_concurrent_streams=2**31)


def test_limits_come_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv("PYTRITON_LIMIT_MAX_BODY_BYTES", "300")

    def bind(triton: Triton) -> None:
        triton.bind("identity", _identity, inputs=FP32, outputs=FP32)

    body = infer_body([1.0] * 100)
    with serving(bind, allow_grpc=False) as triton:
        status, document = post_json(triton.http_port, "/v2/models/identity/infer", body)
        assert status == 413 and "larger than 300 bytes" in document["error"]
    with serving(bind, ServerLimits(max_body_bytes=10_000), allow_grpc=False) as triton:
        assert post_json(triton.http_port, "/v2/models/identity/infer", body)[0] == 200


# ---------------------------------------------------------------- HTTP connection limits

# Size limits only: the timeouts stay long, so that a request sent whole is never timed out on a loaded machine
# (uvloop runs a loop turn's expired timers before it reads: a loop late by 0.3 s answered 408 to a request that
# had arrived in time). Each timeout is tested on a server of its own where the phase before it cannot expire.
HTTP_LIMITS = ServerLimits(
    max_body_bytes=16 * 1024,
    max_header_bytes=8 * 1024,
    max_tensor_elements=1000,
    max_response_bytes=4096,
)
HEAD_TIMEOUT = ServerLimits(header_timeout_s=0.3)
BODY_AND_IDLE_TIMEOUTS = ServerLimits(body_timeout_s=0.3, keep_alive_timeout_s=0.3)


def _bind_limits(triton: Triton) -> None:
    def sized(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return [{"OUTPUT_1": np.zeros((1, int(r.parameters.get("n", 1))), np.float32)} for r in requests]

    triton.bind("identity", _identity, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=8))
    triton.bind("sized", sized, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=8))


@pytest.fixture(scope="module")
def limited():
    with serving(_bind_limits, HTTP_LIMITS) as triton:
        yield triton


@pytest.fixture(scope="module")
def impatient_head():
    with serving(_bind_limits, HEAD_TIMEOUT) as triton:
        yield triton


@pytest.fixture(scope="module")
def impatient_body():
    with serving(_bind_limits, BODY_AND_IDLE_TIMEOUTS) as triton:
        yield triton


def test_body_over_the_limit_is_413(limited):
    status, document = post_json(limited.http_port, "/v2/models/identity/infer", infer_body([1.0] * 5000))
    assert status == 413 and "larger than 16384 bytes" in document["error"]
    assert post_json(limited.http_port, "/v2/models/identity/infer", infer_body([1.0]))[0] == 200


JSON_LIMITED = ServerLimits(max_json_bytes=4096)


def test_json_over_its_limit_is_400_while_binary_tensors_pass_it():
    """tritonserver 2.51 reads HTTP bodies of any size; 2.59's --http-max-input-size bounds the JSON only."""
    words = "request JSON size of {} bytes exceeds the maximum allowed input size of 4096 bytes"
    with serving(_bind_limits, JSON_LIMITED, allow_grpc=False) as triton:
        port = triton.http_port
        big = json.dumps(infer_body([1.0] * 2000)).encode()
        status, _, answer = request(port, "POST", "/v2/models/identity/infer", big)
        assert status == 400 and json.loads(answer)["error"].startswith(words.format(len(big)))
        # The same row as a binary tensor (8 KB): its JSON part is small, so the request is served.
        values = np.arange(2000, dtype=np.float32)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT_1",
                        "shape": [1, 2000],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 8000},
                    }
                ],
                "outputs": [{"name": "OUTPUT_1", "parameters": {"binary_data": True}}],
            }
        ).encode()
        status, headers, answer = request(
            port,
            "POST",
            "/v2/models/identity/infer",
            header + values.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert status == 200, answer
        json_length = int(headers["inference-header-content-length"])
        assert np.array_equal(np.frombuffer(answer[json_length:], np.float32), values)
        generate = json.dumps({"INPUT_1": [1.0] * 2000}).encode()
        status, _, answer = request(port, "POST", "/v2/models/identity/generate", generate)
        assert status == 400 and json.loads(answer)["error"].startswith(words.format(len(generate)))
        token = {"triton-access-token": triton.get_access_token()}  # shared memory is restricted as in 0.7
        status, _, answer = request(port, "POST", "/v2/systemsharedmemory/region/r/register", b" " * 5000, token)
        assert status == 413 and "larger than 4096 bytes" in json.loads(answer)["error"]
        assert post_json(port, "/v2/models/identity/infer", infer_body([1.0] * 10))[0] == 200


def test_headers_over_the_limit_are_431_and_close(limited):
    with raw_http(limited.http_port) as sock:
        filler = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 1000) for i in range(12))
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n")
        status, headers, body = read_response(sock)
        assert status == 431 and headers["connection"] == "close"
        assert "larger than 8192 bytes" in json.loads(body)["error"]
        assert closed_by_server(sock)
    with raw_http(limited.http_port) as sock:  # a long but allowed head is served
        filler = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 1000) for i in range(6))
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n")
        assert read_response(sock)[0] == 200


def test_a_huge_unfinished_head_is_431_before_it_ends(limited):
    with raw_http(limited.http_port) as sock:  # 1 MiB of one header, never finished: read in many chunks
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Huge: " + b"a" * (1 << 20))
        status, headers, body = read_response(sock)
        assert status == 431 and headers["connection"] == "close"
        assert "larger than 8192 bytes" in json.loads(body)["error"]
        assert closed_by_server(sock)


def test_slow_headers_are_408(impatient_head):
    with raw_http(impatient_head.http_port) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        status, _, body = read_response(sock)
        assert status == 408 and "not received within 0.3 s" in json.loads(body)["error"]
        assert time.monotonic() - started < WAIT_S
        assert closed_by_server(sock)


def test_stalled_body_is_408_and_the_request_never_runs(impatient_body):
    baseline = loop_tasks(impatient_body)
    with raw_http(impatient_body.http_port) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        status, _, body = read_response(sock)
        assert status == 408 and "body stalled" in json.loads(body)["error"]
        assert closed_by_server(sock)
    wait_until(lambda: loop_tasks(impatient_body) <= baseline, "the handler task ended")


def test_a_slow_but_steady_body_is_served():
    # body_timeout_s bounds the wait for each part, not the whole body: 12 parts 0.25 s apart take 3 s, longer
    # than the 2 s timeout, and each comes 1.75 s before it.
    body = json.dumps(infer_body([1.0, 2.0])).encode()
    step = -(-len(body) // 12)
    with serving(_bind_limits, ServerLimits(body_timeout_s=2.0)) as triton, raw_http(triton.http_port) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        started = time.monotonic()
        for start in range(0, len(body), step):
            time.sleep(0.25)
            sock.sendall(body[start : start + step])
        assert time.monotonic() - started > 2.0
        status, _, answer = read_response(sock)
        assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]


def test_idle_connections_are_closed(impatient_head, impatient_body):
    with raw_http(impatient_head.http_port) as sock:  # never sends a request: its head is late
        started = time.monotonic()
        assert closed_by_server(sock)
        assert time.monotonic() - started < WAIT_S
    with raw_http(impatient_body.http_port) as sock:  # idle after a request (keep-alive)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200
        assert closed_by_server(sock)


@pytest.mark.parametrize("value", ["close", "Close", "keep-alive, CLOSE"])
def test_connection_close_in_any_spelling_closes_after_the_response(limited, value):
    # llhttp ignores what follows such a request: a connection kept open would leave the next one unanswered.
    body = json.dumps(infer_body([1.0])).encode()
    head = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n"
    with raw_http(limited.http_port) as sock:
        sock.sendall(head % (value.encode(), len(body)) + body)
        status, headers, _ = read_response(sock)
        assert status == 200 and headers["connection"] == "close"
        assert closed_by_server(sock)


def test_upgrade_headers_are_ignored_and_the_connection_serves_on():
    # curl --http2 on http:// asks for h2c with every request; the server stays on HTTP/1.1, body included.
    body = json.dumps(infer_body([1.0, 2.0])).encode()
    upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    post = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n"

    def bind(triton: Triton) -> None:
        triton.bind("identity", _identity, FP32, FP32, config=ModelConfig(max_batch_size=8))

    with serving(bind) as triton:
        with raw_http(triton.http_port) as sock:
            for extra in (upgrade, b"Connection: upgrade\r\nUPGRADE: websocket\r\n", b""):
                sock.sendall(post % (extra, len(body)) + body)
                status, headers, answer = read_response(sock)
                assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]
                assert "connection" not in headers
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n")
            assert read_response(sock)[0] == 200
        with raw_http(triton.http_port) as sock:  # an Upgrade header split across reads reaches llhttp
            sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgr")
            # Read whole, the head's Upgrade header would be dropped and the request served (200, kept open).
            wait_until(lambda: head_bytes_read(triton, sock) > 0, "the server to read the head's first part")
            sock.sendall(b"ade: h2c\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            status, headers, answer = read_response(sock)
            assert status == 400 and "Upgrade" in json.loads(answer)["error"]
            assert headers["connection"] == "close" and closed_by_server(sock)
        with raw_http(triton.http_port) as sock:  # ... where a bodiless request is still served, then closed
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgr")
            wait_until(lambda: head_bytes_read(triton, sock) > 0, "the server to read the head's first part")
            sock.sendall(b"ade: h2c\r\n\r\n")
            status, headers, _ = read_response(sock)
            assert status == 200 and headers["connection"] == "close" and closed_by_server(sock)


def test_too_many_tensor_elements_is_400_before_the_model_runs(limited):
    # data of as many values as the shape holds: fewer are refused first, for the data (as Triton reads it first)
    for shape, data in (([1, 1001], [0.0] * 1001), ([0, 10**12], [])):
        body = {"inputs": [{"name": "INPUT_1", "shape": shape, "datatype": "FP32", "data": data}]}
        status, document = post_json(limited.http_port, "/v2/models/identity/infer", body)
        assert status == 400 and "1000 elements (or dimension)" in document["error"]
    with grpc_stub(limited) as stub:
        message = grpc_request("identity", [0.0])
        message.inputs[0].shape[:] = [1, 5000]
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(message, timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1000 elements" in raised.value.details()
    status, document = post_json(limited.http_port, "/v2/models/identity/infer", infer_body([1.0] * 999))
    assert status == 200


def test_a_shape_triton_refuses_gets_tritons_words_before_the_element_bound(limited):
    # tritonserver 2.51 sets no bound on a tensor's elements: a shape it refuses (a batch past max_batch_size, a rank
    # other than the input's), beyond the bound too, gets its words; this server answered its bound first.
    for shape, refusal in (
        ([9, 2000], "inference request batch-size must be <= 8 for 'identity'"),
        ([1, 2, 2000], "unexpected shape for input 'INPUT_1' for model 'identity'. Expected [-1,-1], got [1,2,2000]."),
    ):
        message = grpc_request("identity", [0.0])
        message.inputs[0].shape[:] = shape
        with grpc_stub(limited) as stub:
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(message, timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details().startswith("[request id: <id_unknown>] " + refusal)


def test_oversized_output_fails_only_its_request(limited):
    status, document = post_json(limited.http_port, "/v2/models/sized/infer", infer_body([1.0], n=2000))
    assert status == 500
    assert "take 8000 bytes, more than the 4096 bytes a response may carry" in document["error"]
    with grpc_stub(limited) as stub:
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("sized", [1.0], n=2000), timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.INTERNAL and "4096 bytes" in raised.value.details()
        assert stub.ModelInfer(grpc_request("sized", [1.0], n=1000), timeout=WAIT_S).outputs[0].shape == [1, 1000]


def test_connection_cap_answers_503_on_the_extra_connection_while_every_one_served_is_busy():
    def bind(triton: Triton) -> None:
        triton.bind("identity", _identity, inputs=FP32, outputs=FP32)

    body = b'{"inputs":[{"name":"INPUT_1","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'
    head = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with serving(bind, ServerLimits(max_connections=2), allow_grpc=False) as triton:
        first, second = raw_http(triton.http_port), raw_http(triton.http_port)
        with first, second:
            for sock in (first, second):  # both busy: their bodies are awaited (an idle one would make room)
                sock.sendall(head)
                assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")
            with raw_http(triton.http_port) as third:
                third.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, error = read_response(third)
                assert status == 503 and headers["connection"] == "close"
                assert "at most 2 connections" in json.loads(error)["error"]
            for sock in (first, second):
                sock.sendall(body)
                assert read_response(sock)[0] == 200
            # Both idle now: a new connection takes the place of the one idle longest, which closes.
            assert request(triton.http_port, "GET", "/v2/health/live")[0] == 200
            assert first.recv(65536) == b""


# ---------------------------------------------------------------- gRPC limits


def test_grpc_message_size_and_concurrent_rpc_limits():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    limits = ServerLimits(grpc_max_message_bytes=64 * 1024, grpc_max_concurrent_rpcs=2)
    with serving(bind, limits, allow_http=False) as triton, grpc_stub(triton) as stub:
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("gate", [0.0] * 20_000), timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in raised.value.details()
        first = stub.ModelInfer.future(grpc_request("gate", [1.0]), timeout=WAIT_S)
        wait_until(gate.entered.is_set, "the first call runs")
        second = stub.ModelInfer.future(grpc_request("gate", [2.0]), timeout=WAIT_S)
        wait_until(lambda: pending(triton, "gate") == 1, "the second call is queued")
        for refused in ([3.0], [4.0], [5.0]):  # a refusal must not free a place for the next call
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(grpc_request("gate", refused), timeout=WAIT_S)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "Concurrent RPC limit exceeded" in raised.value.details()
        gate.release.set()
        assert [f.result().outputs[0].name for f in (first, second)] == ["OUTPUT_1", "OUTPUT_1"]
        futures = [stub.ModelInfer.future(grpc_request("gate", [6.0]), timeout=WAIT_S) for _ in range(2)]
        assert [f.result().outputs[0].name for f in futures] == ["OUTPUT_1", "OUTPUT_1"]  # both places are free
        assert gate.calls == 4


def test_grpc_keepalive_enforcement_answers_a_client_pinging_too_often():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    # Triton's defaults (TritonConfig grpc_http2_*): pings without data at most every 300 s, 2 strikes.
    pinging = [
        ("grpc.keepalive_time_ms", 10),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", 10),
    ]
    with serving(bind, allow_http=False) as triton:
        with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}", options=pinging) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(grpc_request("gate", [1.0]), timeout=WAIT_S)
        gate.release.set()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "Too many pings" in raised.value.details()
        with grpc_stub(triton) as stub:  # a well-behaved client is served
            assert stub.ModelInfer(grpc_request("gate", [2.0]), timeout=WAIT_S).outputs[0].name == "OUTPUT_1"


# ---------------------------------------------------------------- faults in the callable


def _faulty(requests: List[Any]) -> List[Any]:
    kind = requests[0].parameters.get("kind")
    value = requests[0]["INPUT_1"]
    if kind == "raise":
        raise RuntimeError("the callable broke")
    return {
        "not-a-list": {"OUTPUT_1": value},
        "wrong-count": [],
        "non-array": [{"OUTPUT_1": [1.0]}],
        "str-object": [{"OUTPUT_1": np.array(["text"], dtype=object)}],
        "missing": [{}],
        "wrong-dtype": [{"OUTPUT_1": value.astype(np.int64)}],
        "ok": [{"OUTPUT_1": value}],
    }[kind]


FAULTS = {
    "raise": "the callable broke",
    "not-a-list": "must be list of response dicts",
    "wrong-count": "does not match number of requests (1)",
    "non-array": "are numpy arrays",
    "str-object": "Use string/byte-string instead of object",
}


@pytest.fixture(scope="module")
def faulty():
    def bind(triton: Triton) -> None:
        for name, strict in (("strict", True), ("lenient", False)):
            triton.bind(name, _faulty, inputs=FP32, outputs=FP32, strict=strict)

    with serving(bind) as triton:
        yield triton


def _grpc_fault(stub: Any, model: str, kind: str) -> Any:
    message = grpc_request(model, [1.0, 2.0], kind=kind)
    message.outputs.add(name="OUTPUT_1")
    return stub.ModelInfer(message, timeout=WAIT_S)


@pytest.mark.parametrize("model", ["strict", "lenient"])
@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_callable_faults_over_grpc_fail_only_that_request(faulty, model, kind):
    with grpc_stub(faulty) as stub:
        with pytest.raises(grpc.RpcError) as raised:
            _grpc_fault(stub, model, kind)
        assert raised.value.code() == grpc.StatusCode.INTERNAL and FAULTS[kind] in raised.value.details()
        response = _grpc_fault(stub, model, "ok")
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0]


def test_wrong_dtype_fails_in_strict_mode_only_over_grpc(faulty):
    with grpc_stub(faulty) as stub:
        with pytest.raises(grpc.RpcError) as raised:
            _grpc_fault(stub, "strict", "wrong-dtype")
        assert raised.value.code() == grpc.StatusCode.INTERNAL and "has invalid type" in raised.value.details()
        # Without strict, the output goes out as its declared datatype, cast as NVIDIA's proxy casts it (astype).
        response = _grpc_fault(stub, "lenient", "wrong-dtype")
        assert response.outputs[0].datatype == "FP32"
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0]


def test_a_requested_output_the_callable_did_not_return_is_left_out_as_triton_leaves_it(faulty):
    # NVIDIA's PyTriton 0.7 (strict or not) and Triton answer 200 without it; a client's as_numpy() gives None.
    body = dict(infer_body([1.0], kind="missing"), outputs=[{"name": "OUTPUT_1"}])
    with grpc_stub(faulty) as stub:
        for model in ("strict", "lenient"):
            status, document = post_json(faulty.http_port, f"/v2/models/{model}/infer", body)
            assert status == 200 and document["outputs"] == [], document
            response = _grpc_fault(stub, model, "missing")
            assert list(response.outputs) == [] and list(response.raw_output_contents) == []
            response = _grpc_fault(stub, model, "ok")  # the model still answers what it returns
            assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0]


def test_callable_faults_in_a_stream_fail_only_that_request(faulty):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{faulty.grpc_port}")
    results: List[Tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append((result, error))
        if len(results) == 2:
            done.set()

    inputs = [grpcclient.InferInput("INPUT_1", [1, 1], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 1), np.float32))
    client.start_stream(callback)
    try:
        client.async_stream_infer("lenient", inputs, request_id="bad", parameters={"kind": "raise"})
        client.async_stream_infer("lenient", inputs, request_id="good", parameters={"kind": "ok"})
        assert done.wait(WAIT_S)
    finally:
        client.stop_stream()
        client.close()
    by_outcome = {("error" if error else "ok"): (result, error) for result, error in results}
    assert "the callable broke" in str(by_outcome["error"][1])
    assert by_outcome["ok"][0].get_response().id == "good"


def test_a_bad_output_in_a_batch_fails_only_its_request():
    batches: List[int] = []

    def half_bad(requests: List[Any]) -> List[Dict[str, Any]]:
        batches.append(len(requests))
        return [{"OUTPUT_1": [1.0] if r.parameters.get("bad") else r["INPUT_1"]} for r in requests]

    def bind(triton: Triton) -> None:
        batcher = DynamicBatcher(max_queue_delay_microseconds=5_000_000, preferred_batch_size=[2])
        triton.bind("half", half_bad, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=2, batcher=batcher))

    with serving(bind, allow_grpc=False) as triton, ThreadPoolExecutor(2) as pool:
        path = "/v2/models/half/infer"
        good = pool.submit(post_json, triton.http_port, path, infer_body([5.0]))
        bad = pool.submit(post_json, triton.http_port, path, infer_body([6.0], bad=True))
        assert good.result(WAIT_S) == (200, good.result()[1]) and good.result()[1]["outputs"][0]["data"] == [5.0]
        status, document = bad.result(WAIT_S)
        assert status == 500 and "are numpy arrays" in document["error"]
        assert batches == [2]


# ---------------------------------------------------------------- a callable that hangs


def test_hung_callable_is_reported_and_other_requests_still_get_answers(caplog):
    caplog.set_level(logging.WARNING, logger="pytriton")
    gate = Gate()

    def bind(triton: Triton) -> None:
        policy = QueuePolicy(default_timeout_microseconds=300_000)
        batcher = DynamicBatcher(default_queue_policy=policy)
        triton.bind("hang", gate, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=4, batcher=batcher))

    with serving(bind, ServerLimits(hung_call_warning_s=0.2)) as triton, grpc_stub(triton) as stub:
        # The client's deadline answers the call stuck in the callable...
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("hang", [1.0]), timeout=0.5)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and gate.entered.is_set()
        # ... the instance stays busy (it is not handed new work while its call runs), so the queue
        # policy answers the next requests, over both transports.
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("hang", [2.0]), timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Request timeout expired" in raised.value.details()
        status, document = post_json(triton.http_port, "/v2/models/hang/infer", infer_body([3.0]))
        assert status == 503 and "Request timeout expired" in document["error"]
        wait_until(lambda: "has been running one call" in caplog.text, "the hung call is reported")
        record = next(r for r in caplog.records if "has been running one call" in r.getMessage())
        assert record.levelno == logging.WARNING
        assert "model 'hang' version 1: instance 0 (thread pytriton-hang-1-0)" in record.getMessage()
        gate.release.set()
        response = stub.ModelInfer(grpc_request("hang", [4.0]), timeout=WAIT_S)
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [4.0]
        assert gate.calls == 2


def test_http_client_timeout_on_a_hung_callable_cancels_its_queued_request():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    with serving(bind, allow_grpc=False) as triton:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post_json, triton.http_port, "/v2/models/gate/infer", infer_body([1.0]))
            assert gate.entered.wait(WAIT_S)
            connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=0.3)
            connection.request("POST", "/v2/models/gate/infer", json.dumps(infer_body([2.0])))
            with pytest.raises(socket.timeout):
                connection.getresponse()
            connection.close()
            wait_until(lambda: pending(triton, "gate") == 0, "the abandoned request left the queue")
            gate.release.set()
            assert first.result(WAIT_S)[0] == 200
        assert gate.calls == 1
        stats = triton._runtime.engine.model("gate").stats
        assert stats.inference["success"].count == 1 and stats.inference["fail"].count == 1


# ---------------------------------------------------------------- clients that disconnect


def _leak_baseline(triton: Triton) -> Tuple[int, Set[Optional[int]]]:
    return loop_tasks(triton), {thread.ident for thread in threading.enumerate()}


def _assert_no_leak(triton: Triton, baseline: Tuple[int, Set[Optional[int]]]) -> None:
    """No task is left on the loop, and no thread is left but the instance thread a first call starts.

    Threads of the test's own clients end shortly after they are closed, hence the wait.
    """
    wait_until(lambda: loop_tasks(triton) <= baseline[0], "every request task ended")

    def only_instance_threads_added() -> bool:
        added = [thread.name for thread in threading.enumerate() if thread.ident not in baseline[1]]
        return all(re.fullmatch(r"pytriton-[\w.-]+-\d+-\d+", name) for name in added)

    wait_until(only_instance_threads_added, "no thread is left behind")


def test_http_client_leaving_while_queued_cancels_its_request():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    with serving(bind, allow_grpc=False) as triton:
        gate.warm_up(lambda: post_json(triton.http_port, "/v2/models/gate/infer", infer_body([0.0])))
        baseline = _leak_baseline(triton)
        body = json.dumps(infer_body([1.0])).encode()
        raw = b"POST /v2/models/gate/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        running, queued = raw_http(triton.http_port), raw_http(triton.http_port)
        with running:
            running.sendall(raw)
            assert gate.entered.wait(WAIT_S)
            with queued:
                queued.sendall(raw)
                wait_until(lambda: pending(triton, "gate") == 1, "the second request is queued")
            wait_until(lambda: pending(triton, "gate") == 0, "the request of the gone client left the queue")
            gate.release.set()
            assert read_response(running)[0] == 200
        assert gate.calls == 1
        _assert_no_leak(triton, baseline)


def test_http_client_leaving_mid_body_leaks_nothing():
    def bind(triton: Triton) -> None:
        triton.bind("identity", _identity, inputs=FP32, outputs=FP32)

    with serving(bind, allow_grpc=False) as triton:
        baseline = _leak_baseline(triton)
        for _ in range(5):
            with raw_http(triton.http_port) as sock:
                sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{")
                wait_until(lambda: loop_tasks(triton) > baseline[0], "the handler waits for the body")
        _assert_no_leak(triton, baseline)
        assert post_json(triton.http_port, "/v2/models/identity/infer", infer_body([1.0]))[0] == 200


def test_grpc_cancel_while_queued_cancels_the_request():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    with serving(bind, allow_http=False) as triton, grpc_stub(triton) as stub:
        gate.warm_up(lambda: stub.ModelInfer(grpc_request("gate", [0.0]), timeout=WAIT_S))
        baseline = _leak_baseline(triton)
        first = stub.ModelInfer.future(grpc_request("gate", [1.0]), timeout=WAIT_S)
        assert gate.entered.wait(WAIT_S)
        second = stub.ModelInfer.future(grpc_request("gate", [2.0]), timeout=WAIT_S)
        wait_until(lambda: pending(triton, "gate") == 1, "the second call is queued")
        second.cancel()
        wait_until(lambda: pending(triton, "gate") == 0, "the cancelled call left the queue")
        gate.release.set()
        assert first.result().outputs[0].name == "OUTPUT_1"
        assert gate.calls == 1
        _assert_no_leak(triton, baseline)


def _endless_bind(stopped: threading.Event) -> Callable[[Triton], None]:
    def endless(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        try:
            while True:
                yield [{"OUTPUT_1": request["INPUT_1"]} for request in requests]
                time.sleep(0.002)  # pace the model; the test waits on `stopped`
        finally:
            stopped.set()

    def bind(triton: Triton) -> None:
        triton.bind("endless", endless, inputs=FP32, outputs=FP32, config=ModelConfig(decoupled=True))

    return bind


def test_grpc_stream_cancel_stops_the_generator_and_leaks_nothing():
    stopped, requests_done = threading.Event(), threading.Event()

    def requests() -> Iterator[Any]:
        yield grpc_request("endless", [1.0])
        requests_done.wait(WAIT_S)  # the stream stays open until the test is done with it

    with serving(_endless_bind(stopped), allow_http=False) as triton, grpc_stub(triton) as stub:
        baseline = _leak_baseline(triton)
        responses = stub.ModelStreamInfer(requests(), timeout=WAIT_S)
        assert not next(responses).error_message
        responses.cancel()
        requests_done.set()
        assert stopped.wait(WAIT_S)
        _assert_no_leak(triton, baseline)


def test_http_generate_stream_disconnect_leaks_nothing():
    stopped = threading.Event()
    with serving(_endless_bind(stopped), allow_grpc=False) as triton:
        baseline = _leak_baseline(triton)
        body = json.dumps({"INPUT_1": [1.0]}).encode()
        with raw_http(triton.http_port) as sock:
            sock.sendall(
                b"POST /v2/models/endless/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            received = b""
            while b"data: " not in received:
                received += sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 200")
        assert stopped.wait(WAIT_S)
        _assert_no_leak(triton, baseline)


class Flood:
    """An endless decoupled model of 256 KiB responses, as fast as it can: counts its steps and notes its end in
    shared memory, so that it counts as well in an instance process of its own."""

    def __init__(self) -> None:
        self._memory = shared_memory.SharedMemory(create=True, size=16)
        self.name = self._memory.name
        self._counts = np.ndarray((2,), np.int64, self._memory.buf)  # steps, ended
        self._counts[:] = 0

    def __getstate__(self) -> Dict[str, Any]:
        return {"name": self.name}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.name = state["name"]
        self._memory = shared_memory.SharedMemory(name=self.name)
        resource_tracker.unregister(self._memory._name, "shared_memory")  # type: ignore[attr-defined] # the test's
        self._counts = np.ndarray((2,), np.int64, self._memory.buf)

    @property
    def steps(self) -> int:
        return int(self._counts[0])

    def stopped(self) -> bool:
        return bool(self._counts[1])

    def __call__(self, requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        try:
            while True:
                self._counts[0] += 1
                yield [{"OUTPUT_1": np.zeros((1, 65536), np.float32)} for _ in requests]
        finally:
            self._counts[1] = 1

    def bind(self, triton: Triton, in_process: bool = False) -> None:
        model = ProcessInstances(self) if in_process else self
        triton.bind("flood", model, inputs=FP32, outputs=FP32, config=ModelConfig(decoupled=True))

    def close(self) -> None:
        del self._counts
        self._memory.close()
        self._memory.unlink()


@contextlib.contextmanager
def flooding(setup: str, **config: Any) -> Iterator[Tuple[Triton, Flood]]:
    """A server whose model `flood` runs in a thread, in an instance process, or behind two frontend processes."""
    flood = Flood()
    options: Dict[str, Any] = {"http_port": 0, "grpc_port": 0, "allow_metrics": False}
    options.update(config)
    triton = Triton(config=TritonConfig(**options), frontends=3 if setup == "frontends" else None)
    try:
        flood.bind(triton, in_process=setup == "process")
        triton.run()
        yield triton, flood
    finally:
        triton.stop()
        flood.close()


SETUPS = ["thread", "process", "frontends"]


# Steps a flood makes for a client that reads none: the responses the stream holds for its consumer, the steps
# its thread runs ahead (and, behind frontends, those the hub sent ahead), what the socket buffers hold (the client's
# receive buffer is 4 KiB), with room to spare; unheld, the flood passes it within a quarter of a second.
HELD_STEPS = 500


def steps_once_held(flood: Flood) -> int:
    """The steps the flood made once it stopped making more (more than HELD_STEPS: it was never held)."""
    deadline = time.monotonic() + WAIT_S
    seen = -1
    while flood.steps != seen and flood.steps <= HELD_STEPS:
        assert time.monotonic() < deadline, f"the model never stopped: {flood.steps} steps"
        seen = flood.steps
        time.sleep(0.25)  # not a race: without a hold the flood makes hundreds of steps meanwhile
    return flood.steps


def unread_socket(port: int) -> socket.socket:
    """A connection whose receive buffer is small: what the client reads none of stays in the server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


@pytest.mark.parametrize("setup", SETUPS)
def test_a_generate_stream_client_that_reads_nothing_holds_the_model_not_a_queue_of_responses(setup):
    with flooding(setup, allow_grpc=False) as (triton, flood):
        body = json.dumps({"INPUT_1": [1.0]}).encode()
        with unread_socket(triton.http_port) as sock:
            sock.sendall(
                b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            held = steps_once_held(flood)
            assert held <= HELD_STEPS
            received = 0
            while flood.steps < held + 50:  # the client reads: the stream goes on
                chunk = sock.recv(1 << 20)
                assert chunk, "the server closed the stream"
                received += len(chunk)
            assert received > 40 * 65536
        wait_until(flood.stopped, "the model stopped for the client that left")


def test_a_generate_stream_client_that_reads_nothing_holds_no_other_stream_of_its_batch():
    """A client that reads nothing and one that reads share a batch: the reader's stream goes on, the other is cut off.

    The batch's generator had been held for the client that read nothing until send_timeout_s, and the reader with it.
    """
    flood = Flood()
    triton = Triton(
        config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False), limits=ServerLimits(send_timeout_s=600)
    )
    config = ModelConfig(
        decoupled=True, max_batch_size=2, batcher=DynamicBatcher(max_queue_delay_microseconds=60_000_000)
    )
    try:
        triton.bind("flood", flood, inputs=FP32, outputs=FP32, config=config)
        triton.run()
        body = json.dumps({"INPUT_1": [1.0]}).encode()
        head = b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        with unread_socket(triton.http_port) as sock:
            sock.sendall(head % (len(body), body))
            reader = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=WAIT_S)
            try:
                reader.request("POST", "/v2/models/flood/generate_stream", body)
                answer = reader.getresponse()
                assert answer.status == 200
                events = 0
                while events < 400:  # far past what the other client's buffers and its backlog hold
                    line = answer.readline()
                    assert line, "the stream ended"
                    events += line.startswith(b"data: ")
            finally:
                reader.close()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            received = b""
            while not received.endswith(b"0\r\n\r\n"):  # the client that read nothing: its stream ends in an error
                chunk = sock.recv(1 << 20)
                assert chunk, received[-300:]
                received += chunk
            assert b"fell too far behind" in received[-1000:], received[-1000:]
        wait_until(flood.stopped, "the model stopped once both clients were gone")
    finally:
        triton.stop()
        flood.close()


def test_a_stream_held_for_a_client_that_reads_nothing_ends_at_the_send_timeout():
    flood = Flood()
    triton = Triton(
        config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False),
        limits=ServerLimits(send_timeout_s=1.0),
    )
    try:
        flood.bind(triton)
        triton.run()
        body = json.dumps({"INPUT_1": [1.0]}).encode()
        with unread_socket(triton.http_port) as sock:
            sock.sendall(
                b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            wait_until(flood.stopped, "the server cut off the client and stopped its model")  # the instance is free
            assert flood.steps <= HELD_STEPS
            assert request(triton.http_port, "GET", "/v2/health/ready")[0] == 200
    finally:
        triton.stop()
        flood.close()


@pytest.mark.parametrize("setup", SETUPS)
def test_a_model_stream_infer_client_that_reads_nothing_holds_the_model_not_a_queue_of_responses(setup):
    with flooding(setup, allow_http=False) as (triton, flood):
        client = H2Client(triton.grpc_port)  # its windows stay at 64 KiB: it reads none of the responses
        try:
            client.handshake()
            stream = client.new_stream()
            client.send_headers(stream, request_headers(path="/inference.GRPCInferenceService/ModelStreamInfer"))
            client.send_data(stream, grpc_message(infer_request([1.0], model="flood")), end_stream=False)
            assert steps_once_held(flood) <= HELD_STEPS
            client.rst_stream(stream, 8)  # CANCEL
            wait_until(flood.stopped, "the model stopped for the cancelled stream")
        finally:
            client.close()


# ---------------------------------------------------------------- shutdown with requests in flight


def test_stop_finishes_every_accepted_request_and_refuses_new_ones():
    gate = Gate()

    def bind(triton: Triton) -> None:
        triton.bind("gate", gate, inputs=FP32, outputs=FP32)

    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False, exit_timeout_secs=20))
    bind(triton)
    triton.run()
    port = triton.http_port
    channel = grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    with ThreadPoolExecutor(4) as pool:
        http_calls = [pool.submit(post_json, port, "/v2/models/gate/infer", infer_body([float(i)])) for i in range(2)]
        grpc_calls = [stub.ModelInfer.future(grpc_request("gate", [10.0 + i]), timeout=WAIT_S) for i in range(2)]
        assert gate.entered.wait(WAIT_S)
        wait_until(lambda: pending(triton, "gate") == 3, "every request is accepted")
        stopper = threading.Thread(target=triton.stop)
        stopper.start()
        wait_until(lambda: request(port, "GET", "/v2/health/ready")[0] == 400, "readiness goes false")
        assert request(port, "GET", "/v2/health/live")[0] == 200
        status, document = post_json(port, "/v2/models/gate/infer", infer_body([99.0]))
        assert status == 503 and "not accepting requests" in document["error"]
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("gate", [99.0]), timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        gate.release.set()
        answers = [call.result(WAIT_S) for call in http_calls]
        assert [status for status, _ in answers] == [200, 200]
        assert sorted(d["outputs"][0]["data"][0] for _, d in answers) == [0.0, 1.0]
        values = [np.frombuffer(call.result().raw_output_contents[0], np.float32)[0] for call in grpc_calls]
        assert sorted(values) == [10.0, 11.0]
        stopper.join(WAIT_S)
        assert not stopper.is_alive()
    channel.close()
    assert not triton._runtime._loop.alive
    wait_until(lambda: "pytriton-gate-1-0" not in {t.name for t in threading.enumerate()}, "the instance thread ended")


SIGINT_SERVER = textwrap.dedent(
    """
    import signal, sys, threading, time
    import numpy as np
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    def infer(requests):
        print("in model", flush=True)
        time.sleep(0.5)  # the model's work; the test sends SIGINT meanwhile
        return [{"OUTPUT_1": r["INPUT_1"]} for r in requests]

    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False, exit_timeout_secs=10))
    tensor = [Tensor(dtype=np.float32, shape=(-1,))]
    triton.bind("m", infer, inputs=tensor, outputs=tensor)
    triton.run()

    # The port, once serve() handles SIGINT: before, a SIGINT kills the process, or is lost where it was ignored
    # when the process started (SIG_IGN is inherited: a background job's under a shell without job control, as
    # CI runs may be), so "not Python's default handler" is no sign. serve() sets SIGTERM's handler after SIGINT's.
    def announce():
        while not callable(signal.getsignal(signal.SIGTERM)):
            time.sleep(0.01)
        print(triton.grpc_port, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    triton.serve(monitoring_period_sec=0.05)
    print("serve returned", flush=True)
    """
)


def test_sigint_finishes_a_grpc_request_in_flight_then_exits(tmp_path: Path):
    script = tmp_path / "server.py"
    script.write_text(SIGINT_SERVER)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelInfer.future(grpc_request("m", [7.0]), timeout=WAIT_S)
        assert process.stdout.readline().strip() == "in model"
        process.send_signal(signal.SIGINT)
        response = call.result()
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [7.0]
        channel.close()
        assert process.wait(WAIT_S) == 0
        assert process.stdout.read().strip() == "serve returned"
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
