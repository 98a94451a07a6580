"""Requests an abusive client sends to cost the server CPU out of proportion to their size.

Each is answered at the cost of reading it: the server's loop must not be held for seconds by a request
of a few hundred KiB while other clients wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import socket
import threading
import time
import weakref
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.openai import OpenAIChat
from pytriton.options.limits import ServerLimits
from pytriton.protocol.grpc_codec import EncodedResponse
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig
from tests.conftest import running_triton
from tests.h2_wire import END_STREAM, H2Client, grpc_message, infer_request, request_headers

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SETTINGS_INITIAL_WINDOW_SIZE = 4
SEND_TIMEOUT_S = 1.0

# The 100,000 requested outputs took about 100 s of the loop with the quadratic check, 0.2 s without it.
ANSWER_S = 10.0


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module")
def stub() -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with running_triton(_bind, allow_http=False, allow_metrics=False) as triton:
        with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    return request


def test_grpc_100000_requested_outputs_are_refused_at_the_cost_of_reading_them(stub: Any) -> None:
    """Each name was looked up in the list of those before it: 100,000 distinct names held the loop for minutes."""
    request = _request()
    for index in range(100_000):
        request.outputs.add(name=f"O{index}")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=ANSWER_S)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert raised.value.details() == "unexpected inference output 'O0' for model 'identity'"
    assert time.monotonic() - started < ANSWER_S


def test_grpc_an_output_requested_100000_times_is_one_output(stub: Any) -> None:
    request = _request()
    for _ in range(100_000):
        request.outputs.add(name="OUTPUT_1")
    response = stub.ModelInfer(request, timeout=ANSWER_S)
    assert [output.name for output in response.outputs] == ["OUTPUT_1"]
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0]


def _wide(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A 256 KiB answer: more than a client's default 64 KiB window."""
    return [{"OUTPUT_1": np.ones((1, 65536), np.float32)} for _ in requests]


@pytest.fixture(scope="module")
def impatient() -> Iterator[Triton]:
    """A server whose send timeout is SEND_TIMEOUT_S, serving `wide`."""
    triton = Triton(
        config=TritonConfig(http_port=0, grpc_port=0, allow_http=False, allow_metrics=False),
        limits=ServerLimits(send_timeout_s=SEND_TIMEOUT_S),
    )
    try:
        triton.bind(
            "wide",
            _wide,
            [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
            [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        yield triton
    finally:
        triton.stop()


def _shut_client(triton: Triton) -> Tuple[H2Client, List[int]]:
    """A client whose streams open with no window: a unary call and a stream of three requests, answers held."""
    client = H2Client(triton.grpc_port, settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    client.handshake()
    calls = [client.start_call(infer_request([1.0], model="wide"))]
    stream = client.new_stream()
    client.send_headers(stream, request_headers(path=STREAM_INFER))
    for _ in range(3):
        client.send_data(stream, grpc_message(infer_request([1.0], model="wide")), end_stream=False)
    return client, [*calls, stream]


def test_a_grpc_client_that_keeps_its_windows_shut_is_let_go_at_the_send_timeout(impatient: Triton) -> None:
    """Its answers waited in their calls for as long as the connection lived (a stream's up to 160 of them): the
    send timeout watched only the socket's buffer, which a shut window never fills."""
    client, _ = _shut_client(impatient)
    try:
        started = time.monotonic()
        client.wait_closed(timeout=SEND_TIMEOUT_S * 5)
        assert time.monotonic() - started >= SEND_TIMEOUT_S * 0.8
    finally:
        client.close()


def test_a_grpc_client_that_opens_its_windows_slowly_keeps_its_connection(impatient: Triton) -> None:
    client, (call, stream) = _shut_client(impatient)
    try:
        for _ in range(int(SEND_TIMEOUT_S * 3 / 0.25)):  # three send timeouts of a slow reader
            for stream_id in (0, call, stream):
                client.window_update(stream_id, 1024)
            time.sleep(0.25)
        for stream_id in (0, call, stream):
            client.window_update(stream_id, 2**30)
        response = client.response(call)
        assert response.grpc_status == "0"
        assert response.output() == [1.0] * 65536
    finally:
        client.close()


def _answers_alive() -> int:
    return sum(1 for thing in gc.get_objects() if isinstance(thing, EncodedResponse))


def test_a_stream_whose_client_left_lets_go_of_its_unsent_answers_without_the_cycle_collector(
    impatient: Triton,
) -> None:
    """Its queued answers (up to the stream's bound of requests, and more) stayed alive with the stream's
    cancelled handler, in a reference cycle of its traceback, until a full collection: 8 MiB answers of
    clients that left held gigabytes. With the collector off, they must go when the stream ends."""
    requests = 40
    client = H2Client(impatient.grpc_port, settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    client.handshake()
    stream = client.new_stream()
    client.send_headers(stream, request_headers(path=STREAM_INFER))
    gc.collect()
    before = _answers_alive()
    gc.disable()
    try:
        for _ in range(requests):
            client.send_data(stream, grpc_message(infer_request([1.0], model="wide")), end_stream=False)
        deadline = time.monotonic() + ANSWER_S
        while _answers_alive() < before + requests // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _answers_alive() >= before + requests // 2, "the answers never waited: the test tests nothing"
        client.close()
        while _answers_alive() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _answers_alive() <= before
    finally:
        gc.enable()
        client.close()


@pytest.fixture(scope="module")
def http_triton() -> Iterator[Triton]:
    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


CUT_BODY_BYTES = 24 * 1024 * 1024 + 4 * 4321  # a length no other buffer of the test's process has


def _cut_bodies_alive() -> int:
    return sum(1 for thing in gc.get_objects() if isinstance(thing, memoryview) and thing.nbytes == CUT_BODY_BYTES)


def test_an_http_client_that_leaves_mid_body_lets_go_of_its_body_without_the_cycle_collector(
    http_triton: Triton,
) -> None:
    """A large body is read into one buffer of its declared length; a client that left part-way left that buffer
    alive with its connection, in a reference cycle of the protocol's bound methods, until a full collection:
    four clients that sent half of a 64 MiB body held 128 MB. With the collector off, it must go with the client."""
    head = (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
        b"Content-Length: %d\r\n\r\n" % CUT_BODY_BYTES
    )
    gc.collect()
    gc.disable()
    client = socket.create_connection(("127.0.0.1", http_triton.http_port))
    try:
        client.sendall(head + bytes(1024 * 1024))
        deadline = time.monotonic() + ANSWER_S
        while _cut_bodies_alive() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _cut_bodies_alive() == 1, "the body was never read into its buffer: the test tests nothing"
        client.close()
        while _cut_bodies_alive() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _cut_bodies_alive() == 0
    finally:
        gc.enable()
        client.close()


HELD_INPUT_FLOATS = 3 * 1024 * 1024 // 4 + 4321  # inputs of a size no other buffer of the test's process has
_release = threading.Event()
_running = threading.Event()


def _held(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Keeps its instance busy until released, so that the next requests wait in the queue."""
    _running.set()
    _release.wait(ANSWER_S)
    return [{"OUTPUT_1": request["INPUT_1"][:, :1]} for request in requests]


def _failing(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise ValueError("no")


_stream_inputs: List[weakref.ref[np.ndarray]] = []  # the inputs the failing generator was given


def _oversized(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Outputs of 4 GiB each, over the response limit (2 GiB), as views of one value: no memory taken."""
    return [{"OUTPUT_1": np.broadcast_to(np.float32(0), (1, 2**30))} for _ in requests]


def _failing_stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    _stream_inputs.extend(weakref.ref(request["INPUT_1"]) for request in requests)
    yield [{"OUTPUT_1": request["INPUT_1"][:, :1]} for request in requests]
    raise ValueError("no more")


def _oversized_stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    _stream_inputs.extend(weakref.ref(request["INPUT_1"]) for request in requests)
    yield _oversized(requests)


def _failing_text(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"text_output": np.array([[b"a"]], dtype=object)} for _ in requests]
    raise ValueError("no more")


def _failing_chat(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    raise ValueError("no words")
    yield []  # a generator


@pytest.fixture(scope="module")
def busy() -> Iterator[Triton]:
    def bind(triton: Triton) -> None:
        rows_in = [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))]
        rows_out = [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))]
        text_in = [Tensor(name="text_input", dtype=bytes, shape=(1,))]
        text_out = [Tensor(name="text_output", dtype=bytes, shape=(1,))]
        triton.bind("held", _held, rows_in, rows_out, config=ModelConfig(max_batch_size=8))
        triton.bind("failing", _failing, rows_in, rows_out, config=ModelConfig(max_batch_size=8))
        triton.bind("oversized", _oversized, rows_in, rows_out, config=ModelConfig(max_batch_size=8))
        decoupled_rows = ModelConfig(max_batch_size=8, decoupled=True)
        triton.bind("failing_stream", _failing_stream, rows_in, rows_out, config=decoupled_rows)
        triton.bind("oversized_stream", _oversized_stream, rows_in, rows_out, config=decoupled_rows)
        triton.bind("failing_text", _failing_text, text_in, text_out, config=ModelConfig(decoupled=True))
        chat = ModelConfig(decoupled=True)
        triton.bind("failing_chat", _failing_chat, text_in, text_out, config=chat, openai=OpenAIChat())

    with running_triton(bind, allow_metrics=False) as triton:
        yield triton


def _views_alive(size: int) -> int:
    return sum(1 for thing in gc.get_objects() if isinstance(thing, memoryview) and thing.nbytes == size)


def _pending(triton: Triton) -> int:
    return int(triton._runtime.engine.model("held").scheduler.pending)


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + ANSWER_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition(), what


def _leave_while_queued(triton: Triton, send: Any, size: int) -> None:
    """Keep the model busy, queue a request of large inputs, have its client leave; its inputs must go at once.

    `send` sends the large request and returns a closer of its client; views of `size` bytes hold its inputs."""
    _release.clear()
    _running.clear()
    gc.collect()
    gc.disable()
    blocker = H2Client(triton.grpc_port)
    try:
        blocker.handshake()
        blocker.start_call(infer_request([1.0], model="held"))
        _until(_running.is_set, "the model never ran")
        leave = send()
        _until(lambda: _pending(triton) == 1, "the request never waited in the queue: the test tests nothing")
        assert _views_alive(size) >= 1, "the test tests nothing"
        leave()
        _until(lambda: _pending(triton) == 0, "the request stayed in the queue")
        _until(lambda: _views_alive(size) == 0, "its inputs stayed alive")
    finally:
        gc.enable()
        _release.set()
        blocker.close()


def _held_http_request(model: str, datatype: str = "FP32") -> Tuple[bytes, bytes]:
    """The head and body of an HTTP request of HELD_INPUT_FLOATS inputs (binary, 4 bytes each) for `model`."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT_1",
                    "datatype": datatype,
                    "shape": [1, HELD_INPUT_FLOATS],
                    "parameters": {"binary_data_size": HELD_INPUT_FLOATS * 4},
                }
            ]
        }
    ).encode()
    body = header + bytes(HELD_INPUT_FLOATS * 4)
    head = (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
        b"Content-Length: %d\r\n\r\n" % (model.encode(), len(header), len(body))
    )

    return head, body


def test_an_http_request_whose_client_left_while_it_waited_lets_go_of_its_body_without_the_cycle_collector(
    busy: Triton,
) -> None:
    """The queue's CANCELLED error, held by the request's future, had the handler's frames (its body) in its
    traceback, and the frame of the model's infer held that future: four requests of 16 MiB whose clients left
    held 256 MB until a full collection."""
    head, body = _held_http_request("held")

    def send() -> Any:
        client = socket.create_connection(("127.0.0.1", busy.http_port))
        client.sendall(head + body)
        return client.close

    _leave_while_queued(busy, send, len(body))


def test_a_grpc_call_whose_client_left_while_it_waited_lets_go_of_its_request_without_the_cycle_collector(
    busy: Triton,
) -> None:
    """A cancelled handler's task held its cancellation, whose traceback held the handler's frames (the request)
    and the call, which holds the task: 16 calls of 3 MiB whose client left held 96 MB until a full collection."""

    def send() -> Any:
        client = H2Client(busy.grpc_port)
        client.handshake()
        client.start_call(infer_request(np.zeros(HELD_INPUT_FLOATS, np.float32), model="held"))
        return client.close

    _leave_while_queued(busy, send, HELD_INPUT_FLOATS * 4)


@contextlib.contextmanager
def _quiet_model_log() -> Iterator[None]:
    """pytest's capture of a model's error log record would hold the error's traceback (and its frames)."""
    model_log = logging.getLogger("pytriton.model")
    level = model_log.level
    model_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        model_log.setLevel(level)


@pytest.mark.parametrize("model", ["failing_stream", "oversized_stream"])
def test_a_decoupled_model_that_raised_lets_go_of_its_requests_without_the_cycle_collector(
    busy: Triton, model: str
) -> None:
    """The generator's error, raised from a local of the frame that takes its steps, held that frame in its own
    traceback: a reference cycle that kept the batch's requests (their inputs) until a full collection. The
    refusal of outputs over max_response_bytes, kept in a local of the scheduler's frame its traceback held, too."""
    _stream_inputs.clear()
    with _quiet_model_log():
        gc.collect()
        gc.disable()
        client = H2Client(busy.grpc_port)
        try:
            client.handshake()
            stream = client.new_stream()
            client.send_headers(stream, request_headers(path=STREAM_INFER))
            request = infer_request(np.zeros(HELD_INPUT_FLOATS, np.float32), model=model)
            client.send_data(stream, grpc_message(request), end_stream=True)
            _until(lambda: bool(_stream_inputs), "the model never ran: the test tests nothing")
            _until(lambda: all(alive() is None for alive in _stream_inputs), "its inputs stayed alive")
        finally:
            gc.enable()
            client.close()


def test_an_http_request_that_failed_lets_go_of_its_body_without_the_cycle_collector(busy: Triton) -> None:
    """The failed call's future held the callable's error, whose traceback held the scheduler's frame, which held
    that future and the batch (and so, through its requests' answers, their handlers' frames): 12 failed requests
    of 16 MiB held 192 MB until a full collection, with clients that read their answers."""
    head, body = _held_http_request("failing")
    model_log = logging.getLogger("pytriton.model")
    level = model_log.level
    model_log.setLevel(logging.CRITICAL)  # pytest's capture of the error's log record would hold its traceback
    gc.collect()
    gc.disable()
    client = socket.create_connection(("127.0.0.1", busy.http_port))
    try:
        client.sendall(head + body)
        client.settimeout(ANSWER_S)
        assert client.recv(1024).startswith(b"HTTP/1.1 500 "), "the request did not fail: the test tests nothing"
        _until(lambda: _views_alive(len(body)) == 0, "its body stayed alive")
    finally:
        gc.enable()
        model_log.setLevel(level)
        client.close()


def _answered_then_let_go(triton: Triton, head: bytes, body: bytes, status: bytes) -> None:
    """Send an HTTP request, read its answer's status line (`status`), then its body must go with the collector off."""
    with _quiet_model_log():
        gc.collect()
        gc.disable()
        client = socket.create_connection(("127.0.0.1", triton.http_port))
        try:
            client.sendall(head + body)
            client.settimeout(ANSWER_S)
            answer = client.recv(1024)
            assert answer.startswith(b"HTTP/1.1 " + status), answer
            _until(lambda: _views_alive(len(body)) == 0, "its body stayed alive")
        finally:
            gc.enable()
            client.close()


def test_an_http_request_the_model_refused_lets_go_of_its_body_without_the_cycle_collector(busy: Triton) -> None:
    """The decoder kept the model's refusal of an input in a local of the frame its traceback held (a reference
    cycle): 1 GiB bodies of a wrong datatype or too many elements held 1 GiB each until a full collection."""
    head, body = _held_http_request("held", datatype="INT32")
    _answered_then_let_go(busy, head, body, b"400 ")


def test_an_http_request_whose_outputs_were_too_large_lets_go_of_its_body_without_the_cycle_collector(
    busy: Triton,
) -> None:
    """The scheduler kept the refusal of oversized outputs in a list of the frame its traceback held (a reference
    cycle), with the batch's requests and outputs: max_response_bytes let each such request hold its body and its
    outputs until a full collection."""
    head, body = _held_http_request("oversized")
    _answered_then_let_go(busy, head, body, b"500 ")


def test_a_generate_stream_that_failed_lets_go_of_its_body_without_the_cycle_collector(busy: Triton) -> None:
    """The stream's error, raised from a local of the frame that yields its responses, held that frame in its own
    traceback: a reference cycle that kept the handler's frames (its request's body) until a full collection."""
    body = json.dumps({"text_input": "x" * (HELD_INPUT_FLOATS * 4)}).encode()
    head = b"POST /v2/models/failing_text/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _quiet_model_log():
        gc.collect()
        gc.disable()
        client = socket.create_connection(("127.0.0.1", busy.http_port))
        try:
            client.sendall(head + body)
            client.settimeout(ANSWER_S)
            answer = b""
            while not answer.endswith(b"\r\n0\r\n\r\n"):
                part = client.recv(65536)
                assert part, answer
                answer += part
            assert b'data: {"error":' in answer, "the stream did not fail: the test tests nothing"
            _until(lambda: _views_alive(len(body)) == 0, "its body stayed alive")
        finally:
            gc.enable()
            client.close()


def _failing_stream_in_a_process(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"OUTPUT_1": request["INPUT_1"][:, :1]} for request in requests]
    raise ValueError("no more")


@pytest.fixture(scope="module")
def in_processes() -> Iterator[Triton]:
    def bind(triton: Triton) -> None:
        triton.bind(
            "failing_stream",
            ProcessInstances(_failing_stream_in_a_process),
            [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
            [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8, decoupled=True),
        )

    with running_triton(bind, allow_http=False, allow_metrics=False) as triton:
        yield triton


def _requests_alive() -> int:
    return sum(1 for thing in gc.get_objects() if isinstance(thing, Request))


def test_a_decoupled_model_in_a_process_that_raised_lets_go_of_its_requests_without_the_cycle_collector(
    in_processes: Triton,
) -> None:
    """As in the server's own process: the error its instance process sent back, raised from a local of the frame
    that takes the steps, held that frame (and so the batch's requests) in a reference cycle."""
    with _quiet_model_log():
        gc.collect()
        before = _requests_alive()
        gc.disable()
        client = H2Client(in_processes.grpc_port)
        try:
            client.handshake()
            stream = client.new_stream()
            client.send_headers(stream, request_headers(path=STREAM_INFER))
            request = infer_request(np.zeros(HELD_INPUT_FLOATS, np.float32), model="failing_stream")
            client.send_data(stream, grpc_message(request), end_stream=True)
            trailers = client.wait_for(lambda frame: frame.stream == stream and frame.has(END_STREAM), timeout=ANSWER_S)
            assert trailers is not None
            _until(lambda: _requests_alive() <= before, "its requests stayed alive")
        finally:
            gc.enable()
            client.close()


CHAT_CONTENT_CHARS = HELD_INPUT_FLOATS * 4


def _chat_messages_alive() -> int:
    """Lists that hold the chat's content or its prompt (a str at least that long), as the handler's do."""
    return sum(
        1
        for thing in gc.get_objects()
        if isinstance(thing, list) and any(isinstance(item, str) and len(item) >= CHAT_CONTENT_CHARS for item in thing)
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_chat_that_failed_lets_go_of_its_request_without_the_cycle_collector(
    busy: Triton, stream: bool
) -> None:
    """Whole: the failed generation's task, the last of a loop variable of the frame that raised its error, held
    that error; streamed: the error was raised from a local. Either way a reference cycle kept the handler's frames
    (the request and its prompt) until a full collection: six failed chats of 16 MiB held 192 MB."""
    body = json.dumps(
        {"model": "failing_chat", "stream": stream, "messages": [{"role": "user", "content": "x" * CHAT_CONTENT_CHARS}]}
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _quiet_model_log():
        gc.collect()
        gc.disable()
        client = socket.create_connection(("127.0.0.1", busy.http_port))
        try:
            client.sendall(head + body)
            client.settimeout(ANSWER_S)
            assert client.recv(1024).startswith(b"HTTP/1.1 500 "), "the chat did not fail: the test tests nothing"
            _until(lambda: _chat_messages_alive() == 0, "its request stayed alive")
        finally:
            gc.enable()
            client.close()


def _bytes_read_per_turn(send: Any) -> Tuple[bytes, List[int]]:
    """What `send(sock)` got back, and the bytes the HTTP port read in each turn of the loop meanwhile, in order."""
    from pytriton.transport.http.connection import HttpConnection

    reads: List[Tuple[int, int]] = []  # (the loop's turn, bytes read) of each read
    turns = [0]
    parse = HttpConnection.buffer_updated

    def counted(connection: HttpConnection, nbytes: int) -> None:
        reads.append((turns[0], nbytes))
        parse(connection, nbytes)

    async def count_turns() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        counter = triton._runtime._loop.call(lambda: asyncio.ensure_future(count_turns()))
        HttpConnection.buffer_updated = counted  # type: ignore[method-assign]
        try:
            with socket.create_connection(("127.0.0.1", triton.http_port), timeout=ANSWER_S) as sock:
                answer = send(sock)
        finally:
            HttpConnection.buffer_updated = parse  # type: ignore[method-assign]
            triton._runtime._loop.call(counter.cancel)
    per_turn: Dict[int, int] = {}
    for turn, nbytes in reads:
        per_turn[turn] = per_turn.get(turn, 0) + nbytes
    return answer, [per_turn[turn] for turn in sorted(per_turn)]


ONE_BYTE_CHUNKS = b"1\r\n \r\n" * 1_500_000  # 9 MB of chunked framing for 1.5 MB of body


def test_a_chunked_body_of_one_byte_chunks_is_read_a_short_run_at_a_time() -> None:
    """Each chunk costs the server a Python callback (~1 us) for 6 bytes: libuv read up to 32 x 256 KiB for the
    connection in one turn of the loop (~1.5 s of callbacks), and other clients waited seconds a request while
    such a body came. The connection must let the loop turn after a short run of reads."""

    def send(sock: socket.socket) -> bytes:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.sendall(ONE_BYTE_CHUNKS + b"0\r\n\r\n")
        return sock.recv(65536).split(b"\r\n", 1)[0]

    status, per_turn = _bytes_read_per_turn(send)
    assert status == b"HTTP/1.1 400 Bad Request"  # 1.5 MB of spaces: no JSON
    assert sum(per_turn) >= len(ONE_BYTE_CHUNKS)
    assert max(per_turn) < 1024 * 1024, sorted(per_turn)[-5:]


PIPELINED_GETS = 50_000


def test_thousands_of_pipelined_requests_are_read_a_few_at_a_time() -> None:
    """A read is parsed whole, ~30 us of Python a request: 14,000 pipelined GETs of 18 bytes in a 256 KiB read held
    the loop ~0.5 s, read after read, and other clients waited 0.7 s a request while they came. After a read of
    so many, the connection's reads must be short (its requests are answered all the same)."""

    def send(sock: socket.socket) -> bytes:
        sender = threading.Thread(target=sock.sendall, args=(b"GET /v2/health/live HTTP/1.1\r\n\r\n" * PIPELINED_GETS,))
        sender.start()
        answered, tail = 0, b""
        while answered < PIPELINED_GETS:
            received = sock.recv(1 << 20)
            assert received, f"the server closed after {answered} answers"
            seen = tail + received
            answered += seen.count(b"HTTP/1.1 200 OK")
            tail = seen[-14:]  # a status line cut between two reads (too short to hold a whole one)
        sender.join(ANSWER_S)
        return b"answered"

    answered, per_turn = _bytes_read_per_turn(send)
    assert answered == b"answered"
    assert sorted(per_turn)[-2] <= 64 * 1024, sorted(per_turn)[-5:]  # the first read may be long, not the others
