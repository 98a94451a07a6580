"""The generate extension over HTTP: generate, and generate_stream as server-sent events, event by event."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.http_helpers import post_json

first_event_seen = threading.Event()
stopped_early = threading.Event()


def _echo_upper(requests):
    return [{"text_output": np.char.upper(r["text_input"].astype(np.bytes_)).astype(object)} for r in requests]


def _count(requests):
    """Yield three partial responses; the second waits until the client has seen the first."""
    count = int(requests[0]["n"].ravel()[0])
    for index in range(count):
        if index == 1:
            first_event_seen.wait(10)
        if requests[0].parameters.get("fail_at") == index:
            raise ValueError(f"failed at {index}")
        yield [{"token": np.array([[f"t{index}".encode()]], dtype=object), "index": np.array([[index]], np.int32)}]


def _endless(requests):
    try:
        for index in range(10_000):
            time.sleep(0.01)
            yield [{"token": np.array([[b"x"]], dtype=object), "index": np.array([[index]], np.int32)}]
    finally:
        stopped_early.set()


def _blank_then_token(requests):
    """Yield a response without outputs (an empty dict), then one with its outputs."""
    yield [{} for _ in requests]
    yield [{"token": np.array([b"t"], dtype=object), "index": np.array([0], np.int32)} for _ in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "upper",
        _echo_upper,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
        config=ModelConfig(max_batch_size=4),
    )
    for name, fn in (("count", _count), ("endless", _endless), ("blank", _blank_then_token)):
        triton.bind(
            name,
            fn,
            inputs=[Tensor(name="n", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="token", dtype=bytes, shape=(1,)), Tensor(name="index", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=4, decoupled=True),
        )


@pytest.fixture(scope="module")
def server():
    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


def _events(response: http.client.HTTPResponse):
    """Yield each SSE data payload as soon as its blank line arrives."""
    buffer = b""
    while True:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(1)
        if not chunk:
            return
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            assert event.startswith(b"data: ")
            yield json.loads(event[len(b"data: ") :])


def _stream(port: int, model: str, document) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(document))
    return connection, connection.getresponse()


def test_generate_non_decoupled(server):
    status, document = post_json(server.http_port, "/v2/models/upper/generate", {"text_input": "hello", "id": "7"})
    assert status == 200
    assert document == {"model_name": "upper", "model_version": "1", "id": "7", "text_output": "HELLO"}
    # In the order Triton writes them: its keys sorted (checked against nvidia-pytriton 0.7).
    assert list(document) == ["id", "model_name", "model_version", "text_output"]


def test_generate_stream_of_a_plain_model_is_one_event(server):
    connection, response = _stream(server.http_port, "upper", {"text_input": "abc"})
    try:
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        assert [event["text_output"] for event in _events(response)] == ["ABC"]
    finally:
        connection.close()


def test_generate_stream_delivers_each_event_as_it_is_yielded(server):
    first_event_seen.clear()
    connection, response = _stream(server.http_port, "count", {"n": 3})
    try:
        assert response.status == 200
        events = []
        for event in _events(response):
            events.append(event)
            first_event_seen.set()  # the model only yields its second response after this
        assert [(e["token"], e["index"]) for e in events] == [("t0", 0), ("t1", 1), ("t2", 2)]
    finally:
        connection.close()


def test_generate_stream_error_mid_stream(server):
    first_event_seen.set()
    connection, response = _stream(server.http_port, "count", {"n": 3, "parameters": {"fail_at": 1}})
    try:
        events = list(_events(response))
    finally:
        connection.close()
    assert events[0]["token"] == "t0"
    assert events[1] == {"error": "ValueError: failed at 1"}


def test_generate_stream_error_before_first_response_is_its_one_event(server):
    # tritonserver 2.51 starts the stream with the first response, a failed one too: the status line is the
    # error's (a model that raised: 500 here, as for /infer), then the error as the one event (nvidia-pytriton 0.7:
    # 400, `text/event-stream; charset=utf-8`, `data: {"error": ...}` and a blank line).
    first_event_seen.set()
    connection, response = _stream(server.http_port, "count", {"n": 3, "parameters": {"fail_at": 0}})
    try:
        assert response.status == 500
        assert response.getheader("content-type") == "text/event-stream; charset=utf-8"
        assert response.read() == b'data: {"error":"ValueError: failed at 0"}\n\n'
    finally:
        connection.close()


def test_generate_on_decoupled_model_with_one_response(server):
    first_event_seen.set()
    status, document = post_json(server.http_port, "/v2/models/count/generate", {"n": 1})
    assert status == 200 and document["token"] == "t0" and document["index"] == 0
    status, document = post_json(server.http_port, "/v2/models/count/generate", {"n": 2})
    # tritonserver 2.51's words for a decoupled model that answered more than once
    assert status == 400 and document["error"] == (
        "generate expects model to produce exactly 1 response, use generate stream for model that generates "
        "various number of responses"
    )


def test_a_response_without_outputs_is_an_event_and_counts(server):
    # As tritonserver 2.51 (nvidia-pytriton 0.7): a yielded empty dict is a response, sent as gRPC sends it, its
    # event the model's name and version alone; generate counts it among the responses.
    connection, response = _stream(server.http_port, "blank", {"n": 1})
    try:
        events = list(_events(response))
    finally:
        connection.close()
    assert events == [
        {"model_name": "blank", "model_version": "1"},
        {"index": 0, "model_name": "blank", "model_version": "1", "token": "t"},
    ]
    status, document = post_json(server.http_port, "/v2/models/blank/generate", {"n": 1})
    assert status == 400 and document["error"].startswith("generate expects model to produce exactly 1 response")


def test_infer_on_decoupled_model_is_refused(server):
    status, document = post_json(
        server.http_port,
        "/v2/models/count/infer",
        {"inputs": [{"name": "n", "shape": [1, 1], "datatype": "INT32", "data": [1]}]},
    )
    # nvidia-pytriton 0.7 answered the same 501 and message
    assert (status, document) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )


def test_generate_bad_requests(server):
    # tritonserver 2.51's words: a key that names no input is a parameter, whose type it checks first.
    status, document = post_json(server.http_port, "/v2/models/upper/generate", {"nothing": {"a": 1}})
    assert (status, document["error"]) == (
        400,
        "parameter 'nothing' has invalid type. It should be either 'int', 'bool', or 'string'.",
    )
    status, document = post_json(server.http_port, "/v2/models/upper/generate", {"nothing": 1})
    assert status == 400 and document["error"].startswith(
        "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'upper'."
    )
    status, document = post_json(server.http_port, "/v2/models/upper/generate", {"text_input": "x", "extra": [1]})
    assert status == 400 and "parameter 'extra' has invalid type" in document["error"]


def test_client_disconnect_stops_the_generator(server):
    stopped_early.clear()
    connection, response = _stream(server.http_port, "endless", {"n": 1})
    assert response.status == 200
    next(_events(response))
    connection.close()
    assert stopped_early.wait(10)


@pytest.mark.parametrize("frontends", [None, 3])
def test_generate_on_a_model_that_goes_on_is_refused_at_its_second_response_and_stops_it(frontends):
    """The server gathered every response before counting them: 100 s and every response held, for a 400 after."""
    with running_triton(_bind, allow_grpc=False, allow_metrics=False, frontends=frontends) as triton:
        stopped_early.clear()
        status, document = post_json(triton.http_port, "/v2/models/endless/generate", {"n": 1})  # 30 s at most
        assert status == 400 and document["error"].startswith("generate expects model to produce exactly 1 response")
        assert stopped_early.wait(10)
