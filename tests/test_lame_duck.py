"""The lame duck before a stop (ServerLimits.lame_duck_s): unready, still serving, clients steered away.

Each test stops a real server in a thread and, while it is a lame duck, checks what clients see:
readiness false, calls still answered, HTTP/1.1 responses with `Connection: close`, and gRPC's
graceful GOAWAY (RFC 9113 6.8: GOAWAY 2^31-1 and a PING, then the real GOAWAY on the PING's
acknowledgement), read frame by frame on a raw HTTP/2 connection.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig
from pytriton.options.limits import ServerLimits
from pytriton.transport.grpc import goaway
from pytriton.triton import Triton, TritonConfig
from tests.test_grpc_health import NOT_SERVING, SERVING, check
from tests.test_grpc_http2 import (
    ACK,
    FP32,
    NO_ERROR,
    PING,
    READ_S,
    RST_STREAM,
    H2Client,
    _identity,
    goaway_fields,
    infer_request,
)

# Long enough for every check a test makes while the server is a lame duck, even on a loaded machine.
LAME_DUCK_S = 3.0
MAX_STREAM_ID = 2**31 - 1


@pytest.fixture
def stopping() -> Iterator[Triton]:
    """A running server (HTTP and gRPC) with a lame duck of LAME_DUCK_S, stopped in a thread once the test asks."""
    config = TritonConfig(http_port=0, grpc_port=0, allow_metrics=False)
    triton = Triton(config=config, limits=ServerLimits(lame_duck_s=LAME_DUCK_S))
    triton.bind("identity", _identity, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=8))
    triton.run()
    try:
        yield triton
    finally:
        triton.stop()  # returns at once where a test's stop is under way: that one is waited for
        for thread in threading.enumerate():
            if thread.name == _STOPPER:
                thread.join()


_STOPPER = "lame-duck-stop"


def _stop_in_background(triton: Triton) -> threading.Thread:
    stopper = threading.Thread(target=triton.stop, daemon=True, name=_STOPPER)
    stopper.start()
    deadline = time.monotonic() + READ_S
    while triton._runtime.engine.ready and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not triton._runtime.engine.ready
    return stopper


def _http(
    connection: http.client.HTTPConnection, method: str, path: str, body: bytes = b""
) -> http.client.HTTPResponse:
    connection.request(method, path, body=body or None)
    response = connection.getresponse()
    response.read()
    return response


INFER_BODY = b'{"inputs":[{"name":"INPUT_1","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'


def test_http_lame_duck_is_unready_serves_and_closes_connections(stopping):
    connection = http.client.HTTPConnection("127.0.0.1", stopping.http_port, timeout=READ_S)
    before = _http(connection, "POST", "/v2/models/identity/infer", INFER_BODY)
    assert before.status == 200 and before.getheader("connection") is None  # keep-alive while serving
    started = time.monotonic()
    stopper = _stop_in_background(stopping)

    ready = _http(connection, "GET", "/v2/health/ready")
    assert ready.status == 400 and ready.getheader("connection") == "close"
    for _ in range(3):  # each request on a new connection: still served, and told to reconnect
        fresh = http.client.HTTPConnection("127.0.0.1", stopping.http_port, timeout=READ_S)
        answer = _http(fresh, "POST", "/v2/models/identity/infer", INFER_BODY)
        assert answer.status == 200 and answer.getheader("connection") == "close"
        assert (
            _http(http.client.HTTPConnection("127.0.0.1", stopping.http_port), "GET", "/v2/health/live").status == 200
        )
    assert time.monotonic() - started < LAME_DUCK_S, "the checks took longer than the lame duck; raise LAME_DUCK_S"
    stopper.join(LAME_DUCK_S + 10)
    assert not stopper.is_alive()
    assert time.monotonic() - started >= LAME_DUCK_S * 0.9


def test_grpc_lame_duck_sends_a_graceful_goaway_then_the_real_one(stopping, monkeypatch):
    # The final GOAWAY on the PING's acknowledgement only: at the server's 1 s timeout it could come first on a
    # loaded machine, before the late call was read (refused then) or before the test acknowledged the PING.
    monkeypatch.setattr(goaway, "_GOAWAY_PING_TIMEOUT_S", 60.0)
    client = H2Client(stopping.grpc_port)
    try:
        assert client.infer([1.0]).grpc_status == "0"
        _stop_in_background(stopping)
        first = client.wait_goaway()
        assert goaway_fields(first) == (MAX_STREAM_ID, NO_ERROR, b"")
        ping = client.wait_for(lambda frame: frame.kind == PING and not frame.has(ACK))
        # A call the client sent before it read the GOAWAY (before it acknowledges the PING) is served.
        late = client.start_call(infer_request([2.0]))
        response = client.response(late)
        assert response.grpc_status == "0" and response.output() == [2.0]
        client.ping(ping.payload, ack=True)
        final = client.wait_goaway()
        assert goaway_fields(final) == (late, NO_ERROR, b"")
        # No call is left: the connection closes (a stream the client sent after the PING's acknowledgement is
        # above the GOAWAY's last stream id, so the client knows it was not processed and retries it elsewhere).
        client.wait_closed()  # no call left: the connection closes while the server is still a lame duck
    finally:
        client.close()


def test_grpc_connection_opened_during_the_lame_duck_is_served_then_told_at_its_end(stopping):
    started = time.monotonic()
    _stop_in_background(stopping)
    client = H2Client(stopping.grpc_port)
    try:
        assert client.infer([5.0]).output() == [5.0]
        # Told to go away only when the lame duck ends (a client told at once would back off before reconnecting).
        assert goaway_fields(client.wait_goaway(LAME_DUCK_S + READ_S)) == (MAX_STREAM_ID, NO_ERROR, b"")
        assert time.monotonic() - started >= LAME_DUCK_S * 0.9
        # Unacknowledged, the PING times out and the real GOAWAY follows anyway; then the connection closes.
        assert goaway_fields(client.wait_goaway()) == (1, NO_ERROR, b"")
        frames = client.wait_closed()
        assert not [frame for frame in frames if frame.kind == RST_STREAM]
    finally:
        client.close()


def test_grpc_client_calls_keep_succeeding_through_the_lame_duck(stopping):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stopping.grpc_port}")
    try:
        inputs = [grpcclient.InferInput("INPUT_1", [1, 1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 1), np.float32))
        assert client.is_server_ready()
        started = time.monotonic()
        _stop_in_background(stopping)
        assert not client.is_server_ready()
        answered = 0
        while time.monotonic() - started < LAME_DUCK_S * 0.6:  # each call may land on a fresh connection
            result = client.infer("identity", inputs)
            assert result.as_numpy("OUTPUT_1").tolist() == [[1.0]]
            answered += 1
        assert answered > 0
    finally:
        client.close()


def test_grpc_health_check_answers_not_serving_through_the_lame_duck(stopping):
    url = f"127.0.0.1:{stopping.grpc_port}"
    assert check(url) == SERVING
    _stop_in_background(stopping)
    assert check(url) == NOT_SERVING  # as Triton's: the server is not ready


def test_without_a_lame_duck_stop_is_immediate():
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    triton.run()
    started = time.monotonic()
    triton.stop()
    assert time.monotonic() - started < LAME_DUCK_S
    assert ServerLimits().lame_duck_s == 0


def test_lame_duck_from_the_environment():
    assert ServerLimits.from_env({"PYTRITON_LIMIT_LAME_DUCK_S": "7.5"}).lame_duck_s == 7.5
    with pytest.raises(Exception, match="lame_duck_s must be a finite number >= 0"):
        ServerLimits(lame_duck_s=-1)
