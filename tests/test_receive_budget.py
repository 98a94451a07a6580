"""What large request bodies and messages hold while they arrive is bounded server-wide (max_received_bytes).

Each connection may hold one body of up to max_body_bytes (2 GiB): a dozen clients sending that much would
make the server hold 24 GiB. A real server on loopback, raw HTTP and HTTP/2 clients and tritonclient; the gate
model holds a request (and its share of the budget) until released, so that the next large body must wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from pytriton.core.tensors.raw_tensors import unchanging
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits, default_max_received_bytes
from pytriton.transport import receive_budget
from pytriton.transport.receive_budget import ReceiveBudget, watch
from pytriton.triton import Triton, TritonConfig
from tests.budget_models import Gate, first_values
from tests.conftest import running_triton
from tests.h2_wire import H2Client, grpc_message, request_headers
from tests.http_helpers import request

MIB = 2**20
BUDGET = 6 * MIB
HELD_BYTES = 4 * MIB  # the gate's request: another one of 4 MiB does not fit beside it
FP32 = [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))]
OUT = [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))]
HOLD_S = 30.0
BODY_TIMEOUT_S = 1.0


KEPT: List[np.ndarray] = []


def _keeper(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Keeps its inputs (views of the request's bytes) after answering."""
    KEPT.extend(r["INPUT_1"] for r in requests)
    return first_values(requests)


@pytest.fixture
def served() -> Iterator[Tuple[Triton, Gate]]:
    gate = Gate(HOLD_S)
    limits = ServerLimits(max_received_bytes=BUDGET, body_timeout_s=BODY_TIMEOUT_S)
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False), limits=limits)
    try:
        triton.bind("gate", gate, inputs=FP32, outputs=OUT, config=ModelConfig(max_batch_size=4))
        triton.bind("first", first_values, inputs=FP32, outputs=OUT, config=ModelConfig(max_batch_size=4))
        triton.bind("keeper", _keeper, inputs=FP32, outputs=OUT, config=ModelConfig(max_batch_size=4))
        triton.run()
        yield triton, gate
    finally:
        gate.release.set()
        triton.stop()
        KEPT.clear()


def _budget(triton: Triton) -> ReceiveBudget:
    return triton._runtime.receive_budget  # type: ignore[no-any-return]


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _all_given_back(triton: Triton) -> None:
    budget = _budget(triton)
    deadline = time.monotonic() + 5.0
    while (budget.held or budget.waiting) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert (budget.held, budget.waiting) == (0, 0)


def _tensor(nbytes: int, first: float) -> np.ndarray:
    values = np.zeros((1, nbytes // 4), np.float32)
    values[0, 0] = first
    return values


def _infer_http(model: str, nbytes: int, first: float, chunked: bool = False) -> bytes:
    """An HTTP request (head and body): an infer of `nbytes` in one binary tensor whose first value is `first`."""
    tensor = {
        "name": "INPUT_1",
        "shape": [1, nbytes // 4],
        "datatype": "FP32",
        "parameters": {"binary_data_size": nbytes},
    }
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + _tensor(nbytes, first).tobytes()
    lines = [
        f"POST /v2/models/{model}/infer HTTP/1.1",
        "Host: x",
        "Content-Type: application/octet-stream",
        f"Inference-Header-Content-Length: {len(head)}",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}",
    ]
    if chunked:
        step = 256 * 1024
        body = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step]) for i in range(0, len(body), step)
        )
        body += b"0\r\n\r\n"
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class RawSender:
    """Sends a raw HTTP request from a thread (sendall blocks while the server reads nothing); reads the answer."""

    def __init__(self, port: int, data: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=HOLD_S)
        self.sent = threading.Event()
        self.answer = b""
        self._thread = threading.Thread(target=self._run, args=(data,), daemon=True)
        self._thread.start()

    def _run(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
            self.sent.set()
            while b"\r\n\r\n" not in self.answer or not self._whole():
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                self.answer += chunk
        except OSError:
            return

    def _whole(self) -> bool:
        head, _, body = self.answer.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                return len(body) >= int(line.split(b":")[1])
        return False

    def output(self, timeout: float = HOLD_S) -> Any:
        self._thread.join(timeout)
        assert self.answer.startswith(b"HTTP/1.1 200"), self.answer[:300]
        return json.loads(self.answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"]

    def close(self) -> None:
        self.sock.close()


def _hold_gate(triton: Triton, gate: Gate) -> threading.Thread:
    """An HTTP request of HELD_BYTES that the gate holds (and its share with it) until released."""
    answers: List[Any] = []

    def send() -> None:
        status, _, body = request(
            triton.http_port,
            "POST",
            "/v2/models/gate/infer",
            _infer_http("gate", HELD_BYTES, 7.0).partition(b"\r\n\r\n")[2],
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(_head_length(HELD_BYTES)),
            },
        )
        answers.append((status, body))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    assert gate.entered.wait(10.0)
    assert _budget(triton).held >= HELD_BYTES
    thread.answers = answers  # type: ignore[attr-defined]
    return thread


def _head_length(nbytes: int) -> int:
    return len(_infer_http("gate", nbytes, 0.0).partition(b"\r\n\r\n")[2]) - nbytes


def _small_infer_http(triton: Triton) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [3.0, 4.0]}]})
    status, _, answer = request(triton.http_port, "POST", "/v2/models/first/infer", body)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [3.0]


def test_a_body_larger_than_the_budget_waits_unread_for_the_one_held_then_goes_alone(served: Any) -> None:
    triton, gate = served
    held = _hold_gate(triton, gate)
    budget = _budget(triton)
    large = RawSender(triton.http_port, _infer_http("first", 24 * MIB, 5.0))  # four times the budget
    try:
        _until(lambda: budget.waiting == 1, "the second body to wait")
        time.sleep(BODY_TIMEOUT_S * 1.5)  # the server's wait is not the client's stall: no 408
        # Not read: 24 MiB cannot all lie in loopback's socket buffers, so the client is still sending.
        assert not large.sent.is_set() and large.answer == b""
        assert budget.waiting == 1 and budget.held < BUDGET
        _small_infer_http(triton)  # small requests take no share and never wait
        gate.release.set()
        assert large.output() == [5.0]
        held.join(HOLD_S)
        assert held.answers[0][0] == 200  # type: ignore[attr-defined]
    finally:
        large.close()
    _all_given_back(triton)


def test_waiting_bodies_are_granted_in_arrival_order_and_all_answered(served: Any) -> None:
    triton, gate = served
    held = _hold_gate(triton, gate)
    budget = _budget(triton)
    senders = []
    try:
        for index in range(3):
            senders.append(RawSender(triton.http_port, _infer_http("first", HELD_BYTES, float(index))))
            _until(lambda count=index + 1: budget.waiting == count, f"body {index} to wait")
        gate.release.set()
        assert [sender.output() for sender in senders] == [[0.0], [1.0], [2.0]]
        held.join(HOLD_S)
    finally:
        for sender in senders:
            sender.close()
    _all_given_back(triton)


def test_a_dropped_connection_gives_its_share_back_at_once(served: Any) -> None:
    triton, gate = served
    budget = _budget(triton)
    data = _infer_http("first", HELD_BYTES, 1.0)
    # Granted (nothing else holds a share), cut off after 1 MiB of its body.
    with socket.create_connection(("127.0.0.1", triton.http_port)) as sock:
        sock.sendall(data[:MIB])
        _until(lambda: budget.held >= HELD_BYTES, "the share to be taken")
    _until(lambda: budget.held == 0, "the share to come back", timeout=2.0)
    # Waiting, then cut off (a reset: a FIN would wait in the client's kernel behind the bytes the server's shut
    # window holds back, until that kernel gives up and resets): it leaves the queue, though nothing is read.
    held = _hold_gate(triton, gate)
    with socket.create_connection(("127.0.0.1", triton.http_port)) as sock:
        sock.sendall(data[:MIB])
        _until(lambda: budget.waiting == 1, "the body to wait")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    _until(lambda: budget.waiting == 0, "the waiting share to leave the queue", timeout=2.0)
    gate.release.set()
    held.join(HOLD_S)
    _all_given_back(triton)


def test_the_share_comes_back_when_answered_though_the_model_keeps_the_bytes(served: Any) -> None:
    triton, _ = served
    sender = RawSender(triton.http_port, _infer_http("keeper", HELD_BYTES, 2.0))
    try:
        assert sender.output() == [2.0]
    finally:
        sender.close()
    assert KEPT, "the model kept its input"
    _until(lambda: _budget(triton).held == 0, "the share to come back on the answer", timeout=2.0)


def test_the_share_comes_back_when_the_bytes_are_gone_before_the_answer() -> None:
    budget = ReceiveBudget(BUDGET)

    async def run() -> None:
        share = budget.claim(HELD_BYTES, lambda: None)
        view = watch(memoryview(bytearray(HELD_BYTES)), share)
        tensor = np.frombuffer(view, np.float32)
        del view
        assert budget.held == HELD_BYTES
        del tensor
        assert budget.held == 0

    asyncio.run(run())


def test_outputs_that_are_views_of_a_large_body_count_as_the_requests_own_memory() -> None:
    # As the transports check it (the body's exporter, app.py and call.py): an identity model's output, a view of a
    # watched body, goes out as views, not copied.
    async def run() -> None:
        share = ReceiveBudget(BUDGET).claim(HELD_BYTES, lambda: None)
        body = watch(memoryview(bytearray(HELD_BYTES)), share)
        output = np.frombuffer(body[64:], np.float32).reshape(1, -1)
        assert unchanging([memoryview(output)], body.obj)
        assert not unchanging([memoryview(output.copy())], body.obj)

    asyncio.run(run())


def test_a_chunked_body_takes_shares_as_its_bytes_come(served: Any) -> None:
    triton, gate = served
    held = _hold_gate(triton, gate)
    budget = _budget(triton)
    sender = RawSender(triton.http_port, _infer_http("first", 8 * MIB, 6.0, chunked=True))
    try:
        _until(lambda: budget.waiting == 1, "the chunked body to wait past its first MiB")
        assert sender.answer == b""
        gate.release.set()
        assert sender.output() == [6.0]
        held.join(HOLD_S)
    finally:
        sender.close()
    _all_given_back(triton)


def _unread_by_server(server_port: int, client: socket.socket) -> int:
    """Bytes the server's end of `client`'s connection has received and not read yet (/proc/net/tcp's rx_queue)."""
    local = f"0100007F:{server_port:04X}"
    remote = f"0100007F:{client.getsockname()[1]:04X}"
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == (local, remote):
                return int(fields[4].split(":")[1], 16)
    raise AssertionError("the server's end of the connection is not in /proc/net/tcp")


def _answer(sock: socket.socket) -> Any:
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body)["outputs"][0]["data"]


def test_a_chunked_body_that_ends_in_the_read_that_made_it_wait_is_served_and_its_connection_reads_on(
    served: Any,
) -> None:
    # Its end came with the bytes past its first MiB: no grant would resume the connection (the body is no longer
    # the one arriving), and it read nothing again, not even the next request.
    triton, gate = served
    held = _hold_gate(triton, gate)
    budget = _budget(triton)
    data = _infer_http("first", MIB + 4096, 8.0, chunked=True)
    head_size = data.index(b"\r\n\r\n") + 4
    split = head_size + MIB - 64  # with the framing, before the body's first MiB
    sock = socket.create_connection(("127.0.0.1", triton.http_port), timeout=HOLD_S)
    try:
        sock.sendall(data[:split])
        _until(lambda: _unread_by_server(triton.http_port, sock) == 0, "the server to read the body's start")
        sock.sendall(data[split:])  # past the first MiB, and the end: one read
        assert _answer(sock) == [8.0]
        assert budget.waiting == 0 and budget.held >= HELD_BYTES  # the gate's share
        sock.sendall(_infer_http("first", 4096, 9.0))
        assert _answer(sock) == [9.0]
    finally:
        sock.close()
        gate.release.set()
    held.join(HOLD_S)
    _all_given_back(triton)


# -- gRPC ---------------------------------------------------------------------------------------


def _grpc_infer(client: grpcclient.InferenceServerClient, model: str, nbytes: int, first: float) -> float:
    inputs = grpcclient.InferInput("INPUT_1", [1, nbytes // 4], "FP32")
    inputs.set_data_from_numpy(_tensor(nbytes, first))
    result = client.infer(model, [inputs], client_timeout=HOLD_S)
    return float(result.as_numpy("OUTPUT_1")[0, 0])


def _in_thread(call: Callable[[], Any]) -> Tuple[threading.Thread, List[Any]]:
    results: List[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    return thread, results


def test_grpc_a_message_waits_with_its_stream_window_shut_while_others_are_served(served: Any) -> None:
    triton, gate = served
    budget = _budget(triton)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
    try:
        held, held_result = _in_thread(lambda: _grpc_infer(client, "gate", HELD_BYTES, 7.0))
        assert gate.entered.wait(10.0)
        large, large_result = _in_thread(lambda: _grpc_infer(client, "first", 16 * MIB, 5.0))
        _until(lambda: budget.waiting == 1, "the second message to wait")
        time.sleep(0.5)
        assert large.is_alive() and budget.waiting == 1
        # The same connection serves small calls meanwhile: only the waiting stream's window is shut.
        assert _grpc_infer(client, "first", 4096, 3.0) == 3.0
        gate.release.set()
        large.join(HOLD_S)
        held.join(HOLD_S)
        assert (held_result, large_result) == ([7.0], [5.0])
    finally:
        client.close()
    _all_given_back(triton)


def _first_mib_sent(triton: Triton, wire: bytes) -> Tuple[H2Client, int]:
    """A connection with a ModelInfer call whose message's first MiB is sent; the client and the call's stream."""
    client = H2Client(triton.grpc_port)
    try:
        client.handshake()
        stream = client.new_stream()
        client.send_headers(stream, request_headers())
        client.send_data(stream, wire[:MIB], end_stream=False)
    except BaseException:
        client.close()
        raise
    return client, stream


def test_grpc_a_stream_reset_or_a_lost_connection_gives_the_share_back(served: Any) -> None:
    triton, gate = served
    budget = _budget(triton)
    message = service_pb2.ModelInferRequest(model_name="first")
    message.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, 3 * MIB])
    message.raw_input_contents.append(bytes(12 * MIB))
    wire = grpc_message(message.SerializeToString())
    client, stream = _first_mib_sent(triton, wire)
    try:
        _until(lambda: budget.held >= 12 * MIB, "the message's share")  # larger than the budget: alone, at once
        client.rst_stream(stream, 8)  # CANCEL
        _until(lambda: budget.held == 0, "the share of a reset stream", timeout=2.0)
    finally:
        client.close()
    held = _hold_gate(triton, gate)
    client, _ = _first_mib_sent(triton, wire)
    try:
        _until(lambda: budget.waiting == 1, "the message to wait")
    finally:
        client.close()
    _until(lambda: budget.waiting == 0, "the waiting share of a lost connection", timeout=2.0)
    gate.release.set()
    held.join(HOLD_S)
    _all_given_back(triton)


def test_frontend_processes_each_bound_their_bodies_and_answer_them_all() -> None:
    limits = ServerLimits(max_received_bytes=2 * MIB)

    def bind(triton: Triton) -> None:
        triton.bind("first", first_values, inputs=FP32, outputs=OUT, config=ModelConfig(max_batch_size=4))

    with running_triton(bind, frontends=3, limits=limits, metrics_port=None, allow_metrics=False) as triton:
        senders = [RawSender(triton.http_port, _infer_http("first", 5 * MIB, float(i))) for i in range(4)]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
        try:
            calls = [_in_thread(lambda i=i: _grpc_infer(client, "first", 6 * MIB, 10.0 + i)) for i in range(3)]
            assert [sender.output() for sender in senders] == [[float(i)] for i in range(4)]
            for thread, _ in calls:
                thread.join(HOLD_S)
            assert sorted(result[0] for _, result in calls) == [10.0, 11.0, 12.0]
        finally:
            client.close()
            for sender in senders:
                sender.close()


def test_the_limit_defaults_to_half_the_memory_and_comes_from_the_environment() -> None:
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert ServerLimits().max_received_bytes is None
    assert 0 < ServerLimits().received_bytes() == default_max_received_bytes() <= physical // 2
    environ = {"PYTRITON_LIMIT_MAX_RECEIVED_BYTES": str(3 * MIB)}
    assert ServerLimits.from_env(environ).max_received_bytes == 3 * MIB
    assert ServerLimits.from_env({}).max_received_bytes is None


@pytest.mark.parametrize(
    ("limits", "openai_port", "expected"),
    [
        (None, None, lambda half: half // 2),  # two frontends: the server as a whole holds half the memory
        (None, 0, lambda half: half // 3),  # and the server's process, which serves the OpenAI API's own port
        (ServerLimits(max_received_bytes=3 * MIB), None, lambda half: 3 * MIB),  # a value given: each process's
    ],
)
def test_frontend_processes_share_the_default_budget(
    limits: Any, openai_port: Any, expected: Callable[[int], int]
) -> None:
    triton = Triton(
        config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False),
        limits=limits or ServerLimits(),
        frontends=3,
        openai_port=openai_port,
    )
    try:
        triton.bind("first", first_values, inputs=FP32, outputs=OUT, config=ModelConfig(max_batch_size=4))
        triton.run()
        share = expected(default_max_received_bytes())
        # The frontends are started with these options (their Init), and build their budgets of them.
        assert triton._runtime.options.limits.max_received_bytes == share
        assert _budget(triton).capacity == share
        sender = RawSender(triton.http_port, _infer_http("first", 2 * MIB, 7.0))
        try:
            assert sender.output() == [7.0]
        finally:
            sender.close()
    finally:
        triton.stop()


@contextlib.contextmanager
def _stream_answered(triton: Triton, count: int) -> Iterator[None]:
    """A ModelStreamInfer stream that sent `count` messages of HELD_BYTES to `first` and got their answers; open."""
    answers: List[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append(error or float(result.as_numpy("OUTPUT_1")[0, 0]))
        if len(answers) == count:
            done.set()

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
    try:
        client.start_stream(callback)
        for index in range(count):
            inputs = grpcclient.InferInput("INPUT_1", [1, HELD_BYTES // 4], "FP32")
            inputs.set_data_from_numpy(_tensor(HELD_BYTES, float(index)))
            client.async_stream_infer("first", [inputs])
        assert done.wait(HOLD_S)
        assert sorted(answers) == [float(index) for index in range(count)]
        yield
    finally:
        client.stop_stream()
        client.close()


def test_grpc_a_streams_large_messages_each_give_their_share_back_when_their_bytes_go(served: Any) -> None:
    triton, _ = served
    with _stream_answered(triton, 4):  # each larger than half the budget: one at a time, as the one before goes
        _all_given_back(triton)  # the stream is still open: its messages' bytes gave their shares back


def test_a_large_requests_bytes_are_let_go_once_it_is_answered(served: Any) -> None:
    # The share's weak reference is kept until its bytes go: the share must not keep them (a gRPC call keeps its
    # request's memory, and the share's grant callback reached the call: every 1 MiB message stayed in memory).
    triton, _ = served
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
    try:
        for index in range(3):
            assert _grpc_infer(client, "first", HELD_BYTES, float(index)) == float(index)
    finally:
        client.close()
    sender = RawSender(triton.http_port, _infer_http("first", HELD_BYTES, 4.0))
    try:
        assert sender.output() == [4.0]
    finally:
        sender.close()
    _until(lambda: not receive_budget._WATCHED, "the requests' bytes to be let go", timeout=2.0)
    assert (_budget(triton).held, _budget(triton).waiting) == (0, 0)


def test_a_streams_large_messages_bytes_are_let_go_once_answered(served: Any) -> None:
    # No cycle collection here: a message's bytes kept by a reference cycle would keep their share, and the memory.
    triton, _ = served
    with _stream_answered(triton, 3):
        _until(lambda: not receive_budget._WATCHED, "the stream's messages' bytes to be let go", timeout=2.0)
        assert (_budget(triton).held, _budget(triton).waiting) == (0, 0)
