"""A server at its connection cap takes a new connection in place of the one that has waited on its client longest.

Connections that sent half a request head (or, on the gRPC port, no preface or no call) and then nothing held
their places until a timeout: 300 of them shut Prometheus out of the metrics port for 30 s, and the cap's worth
of them every client out of the HTTP and gRPC ports (transport/connection_cap.py).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

CAP = 4
ROUNDS = 15
WAIT_S = 30.0  # how long a test waits for an answer before it fails (never reached when the server works)
HALF_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # no blank line: the head never ends
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # and an empty SETTINGS


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _bind(triton: Triton) -> None:
    tensors = {"inputs": [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))]}
    tensors["outputs"] = [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))]
    triton.bind("identity", _identity, config=ModelConfig(max_batch_size=8), **tensors)


@pytest.fixture(scope="module", params=[1, 2], ids=["frontends=1", "frontends=2"])
def capped(request: pytest.FixtureRequest) -> Iterator[Triton]:
    limits = ServerLimits(max_connections=CAP, grpc_max_connections=CAP)
    with running_triton(_bind, frontends=request.param, limits=limits) as triton:
        yield triton


@contextlib.contextmanager
def _connections(port: int, count: int, sent: bytes) -> Iterator[List[socket.socket]]:
    """`count` connections to `port`, opened one after the other, each having sent `sent`; closed after."""
    sockets: List[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
            sockets.append(sock)
            if sent:
                sock.sendall(sent)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _until_closed(sock: socket.socket) -> bytes:
    """What the server sent on `sock` until it closed it.

    A reset ends it too: the server may close before it has read what the client sent (the connections are
    accepted in a batch before any is read), and the kernel then resets the connection after what it sent.
    """
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def test_300_half_sent_heads_leave_the_metrics_port_to_prometheus(capped: Triton) -> None:
    # Its cap is 64: they were held until the head timeout (30 s), and a scrape meanwhile got 503.
    assert capped.metrics_port is not None
    with _connections(capped.metrics_port, 300, HALF_HEAD) as slow:
        status, _, body = request(capped.metrics_port, "GET", "/metrics")
        assert status == 200 and b"nv_inference_count" in body
        cut_off = _until_closed(slow[0])  # the oldest: its request is answered 503, and it closes
    assert cut_off.startswith(b"HTTP/1.1 503 ") and b"closed for a new one" in cut_off


def test_half_sent_heads_leave_the_http_port_to_other_clients(capped: Triton) -> None:
    assert capped.http_port is not None
    with _connections(capped.http_port, 2 * CAP, HALF_HEAD) as slow:
        assert request(capped.http_port, "GET", "/v2/health/live")[0] == 200
        if _frontends(capped) == 1:
            cut_off = _until_closed(slow[0])
            assert cut_off.startswith(b"HTTP/1.1 503 ") and f"at most {CAP} connections".encode() in cut_off


@pytest.mark.parametrize("sent", [b"", PREFACE], ids=["nothing", "preface and settings"])
def test_silent_connections_leave_the_grpc_port_to_other_clients(capped: Triton, sent: bytes) -> None:
    assert capped.grpc_port is not None
    with _connections(capped.grpc_port, 2 * CAP, sent) as silent:
        with grpcclient.InferenceServerClient(grpc_url(capped)) as client:
            inputs = [grpcclient.InferInput("INPUT_1", [1, 2], "FP32")]
            inputs[0].set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
            result = client.infer("identity", inputs, client_timeout=WAIT_S)
            assert result.as_numpy("OUTPUT_1").tolist() == [[1.0, 2.0]]
        if _frontends(capped) == 1:
            goaway = _until_closed(silent[0])  # the server's SETTINGS, then GOAWAY NO_ERROR saying why
            assert f"the server serves at most {CAP} gRPC connections at once".encode() in goaway


@pytest.mark.parametrize("sent", [b"", PREFACE], ids=["nothing", "preface and settings"])
def test_silent_connections_opened_as_others_close_leave_the_grpc_port_to_a_client_through_frontends(
    sent: bytes,
) -> None:
    # Round after round, a client closes its silent connections and opens others at once. The hub counted the
    # closed ones until the frontend's word of their closes arrived, and the connections refused over the cap until
    # their clients closed them: the new ones went over the cap to a process that had none it could close for them,
    # and were refused, and so was the client's (11 rounds of 30 failed, with nothing else running).
    with running_triton(_bind, frontends=2, limits=ServerLimits(grpc_max_connections=CAP), allow_http=False) as triton:
        assert triton.grpc_port is not None
        for _ in range(ROUNDS):
            with _connections(triton.grpc_port, 2 * CAP, sent):
                with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
                    inputs = [grpcclient.InferInput("INPUT_1", [1, 2], "FP32")]
                    inputs[0].set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
                    result = client.infer("identity", inputs, client_timeout=WAIT_S)
                    assert result.as_numpy("OUTPUT_1").tolist() == [[1.0, 2.0]]


def test_connections_refused_over_the_cap_hold_no_place_of_it_through_frontends() -> None:
    # Connections refused over the cap stay open a while to say why (HTTP: a 503 for their first request). The hub
    # counted them until they closed, which a server of one process does not: once the connections served were
    # done, a new client was over the cap by that count, and refused by a process that served none.
    body = b'{"inputs":[{"name":"INPUT_1","shape":[1,1],"datatype":"FP32","data":[[5.0]]}]}'
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with running_triton(_bind, frontends=2, limits=ServerLimits(max_connections=CAP), allow_grpc=False) as triton:
        assert triton.http_port is not None
        with _connections(triton.http_port, CAP, head) as uploading:
            for sock in uploading:
                assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")  # its body is read: it is busy
            with _connections(triton.http_port, CAP, b""):  # over the cap, each refused; they stay open
                for sock in uploading:
                    sock.sendall(body)
                    assert _until_closed_or_answered(sock).startswith(b"HTTP/1.1 200 ")
                    sock.close()
                status, _, answer = request(triton.http_port, "GET", "/v2/health/live")
                assert status == 200, answer


def test_a_slow_upload_keeps_its_place_where_an_idle_connection_gives_its_own() -> None:
    body = b'{"inputs":[{"name":"INPUT_1","shape":[1,1],"datatype":"FP32","data":[[5.0]]}]}'
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with running_triton(_bind, frontends=1, limits=ServerLimits(max_connections=2), allow_grpc=False) as triton:
        assert triton.http_port is not None
        with _connections(triton.http_port, 2, b"") as (idle, uploading):
            idle.sendall(live)
            assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")  # answered: it waits on its client
            uploading.sendall(head + b"Expect: 100-continue\r\n\r\n")
            assert uploading.recv(65536).startswith(b"HTTP/1.1 100 ")  # its body is read: it is busy
            uploading.sendall(body[:10])
            with _connections(triton.http_port, 1, live) as (new,):
                assert new.recv(65536).startswith(b"HTTP/1.1 200 ")  # in the idle one's place
                assert _until_closed(idle) == b""  # closed as at its keep-alive timeout
                with _connections(triton.http_port, 1, live) as (newer,):
                    assert newer.recv(65536).startswith(b"HTTP/1.1 200 ")  # in `new`'s: the upload stays
                uploading.sendall(body[10:])
                answer = _until_closed_or_answered(uploading)
                assert answer.startswith(b"HTTP/1.1 200 ") and b"[5.0]" in answer


def _until_closed_or_answered(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length (or what came before the server closed)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk
    head = received.split(b"\r\n\r\n", 1)[0].lower()
    length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(received.split(b"\r\n\r\n", 1)[1]) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def _frontends(triton: Triton) -> int:
    """How many processes serve the ports: with one, which connection is reclaimed first is known."""
    return 1 if triton._runtime._pool is None else 2
