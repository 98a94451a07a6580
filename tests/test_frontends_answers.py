"""The same request gets the same answer from every frontend process as from a server of one process (issue 35).

Each test sends its requests over several connections of a server with two frontend processes (frontends=3: the
hub serves none), checks that the connections reached both, and that each answered as the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Set

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.frontend_processes import frontend_pids
from tests.tcp_table import established

CONNECTIONS = 4  # handed to the two frontends in turn: each gets two


def _parameters(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Answers the names of its request's parameters, in the order the callable sees them."""
    return [
        {"NAMES": np.array([[json.dumps(list(request.parameters)).encode()]] * request["INPUT_1"].shape[0], object)}
        for request in requests
    ]


# The mounted app's stream waits here after its first part: the test reads that part before it sets it.
STREAM_GATE = threading.Event()


async def _events(scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """A mounted ASGI app streaming server-sent events: one, then another once STREAM_GATE is set."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    await asyncio.get_running_loop().run_in_executor(None, STREAM_GATE.wait, 120)
    await send({"type": "http.response.body", "body": b"data: second\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


# The flood: a mounted app streaming numbered parts as fast as its send() lets it, far more than any buffer between
# it and a client holds. What a client that reads nothing lets it send is bounded: the socket buffers, the server's
# write buffer and, with frontend processes, what crosses from the hub unacknowledged (ipc/calls.py).
PART_BYTES = 16 * 1024
FLOOD_PARTS = 3 * 1024  # 48 MiB
BOUND_BYTES = 12 * 1024 * 1024  # a few MiB of kernel buffers (tcp_wmem's 4 MiB), a window, and room to spare
CLIENT_BUFFER = 64 * 1024  # the client's SO_RCVBUF, set before it connects (else autotuned to tcp_rmem's max)


class Flood:
    """What the flood app did in its latest request: the parts it sent, whether it finished or saw its client go."""

    sent = 0
    finished = threading.Event()
    cancelled = threading.Event()


def _flood_part(index: int) -> bytes:
    """Part `index` of the flood: its number, then filler, PART_BYTES in all (a client checks the order by them)."""
    return (b"%08d" % index).ljust(PART_BYTES, b".")


async def _flood(scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """Streams FLOOD_PARTS parts, cancelled when its client leaves (as Starlette's StreamingResponse is).

    Once its client has left, send() drops what comes (one process's connection, and the hub's for a frontend's
    client that left). Under /eager, the stream awaits nothing but send(), as an async generator of parts made at
    once does under Starlette's StreamingResponse.
    """
    eager = scope["root_path"].endswith("/eager")
    Flood.sent = 0
    Flood.finished.clear()
    Flood.cancelled.clear()

    async def stream() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for index in range(FLOOD_PARTS):
            await send({"type": "http.response.body", "body": _flood_part(index), "more_body": True})
            Flood.sent = index + 1
            if not eager:
                await asyncio.sleep(0)  # as a stream that awaits what it sends does: its client's leaving is heard
        await send({"type": "http.response.body", "body": b""})
        Flood.finished.set()

    async def until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming, watching = asyncio.ensure_future(stream()), asyncio.ensure_future(until_disconnect())
    await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
    if not streaming.done():
        streaming.cancel()
        Flood.cancelled.set()
    watching.cancel()


def _bind(triton: Triton) -> None:
    triton.mount("/events", _events)
    triton.mount("/flood", _flood)
    triton.mount("/eager", _flood)
    triton.bind(
        "parameters",
        _parameters,
        inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="NAMES", dtype=bytes, shape=(1,))],
        config=ModelConfig(max_batch_size=4),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_bind, frontends=3) as triton:
        yield triton


@pytest.fixture(scope="module")
def one_process() -> Iterator[Triton]:
    with running_triton(_bind) as triton:
        yield triton


@contextlib.contextmanager
def _stubs(triton: Triton) -> Iterator[List[service_pb2_grpc.GRPCInferenceServiceStub]]:
    """A stub on a connection of its own for each of CONNECTIONS channels (no subchannel shared between them)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(grpc_url(triton), options=options) for _ in range(CONNECTIONS)]
    try:
        yield [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
    finally:
        for channel in channels:
            channel.close()


def _frontends_serving(port: int) -> Set[int]:
    """The frontend processes of this server that hold a connection to `port`."""
    return {pid for pid in frontend_pids() if established(pid, port, served=True)}


def _request(names: List[str], valueless: bool = False) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="parameters")
    for name in names:
        if valueless:
            request.parameters[name].SetInParent()  # a parameter with no value: refused, naming it
        else:
            request.parameters[name].string_param = name
    request.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    return request


NAMES = [f"p{index:02d}" for index in (7, 3, 11, 0, 9, 5, 1, 10, 4, 8, 2, 6)]


def test_a_callable_sees_grpc_parameters_in_one_order_whichever_frontend_took_them(server: Triton) -> None:
    seen = []
    with _stubs(server) as stubs:
        for stub in stubs:
            response = stub.ModelInfer(_request(NAMES), timeout=30)
            seen.append(json.loads(response.raw_output_contents[0][4:]))
        assert len(_frontends_serving(server.grpc_port)) == 2
    assert seen == [sorted(NAMES)] * CONNECTIONS


def test_a_grpc_request_with_several_bad_parameters_is_refused_for_the_same_one_by_every_frontend(
    server: Triton,
) -> None:
    refusals = []
    with _stubs(server) as stubs:
        for stub in stubs:
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(_request(NAMES, valueless=True), timeout=30)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            refusals.append(raised.value.details())
        assert len(_frontends_serving(server.grpc_port)) == 2
    first = sorted(NAMES)[0]
    expected = f"invalid value type for '{first}' parameter, expected int64_param, bool_param, or string_param."
    assert refusals == [expected] * CONNECTIONS


def test_a_mounted_app_s_response_in_parts_reaches_its_client_part_by_part(server: Triton) -> None:
    # Forwarded to the hub's app, the response crossed back whole: the client heard nothing of the stream until it
    # ended (here: never, its first part waiting for the second to be let go).
    STREAM_GATE.clear()
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)  # the first part: at once
    try:
        connection.request("GET", "/events/")
        response = connection.getresponse()
        assert (response.status, response.getheader("content-type")) == (200, "text/event-stream")
        assert _frontends_serving(server.http_port) != set()
        assert response.read1(4096) == b"data: first\n\n"
        STREAM_GATE.set()
        assert response.read() == b"data: second\n\n"
    finally:
        STREAM_GATE.set()
        connection.close()


@contextlib.contextmanager
def _flooded(triton: Triton, path: str = "/flood/") -> Iterator[http.client.HTTPResponse]:
    """The flood's response, its head read, on a connection whose client buffers little."""
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=60)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_BUFFER)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", triton.http_port))
    connection.sock = sock
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == 200
        yield response
    finally:
        connection.close()


def _settled() -> int:
    """The flood's count of sent parts once it has stopped moving (or the flood finished)."""
    last, still, deadline = -1, 0, time.monotonic() + 60
    while still < 10 and not Flood.finished.is_set() and time.monotonic() < deadline:
        time.sleep(0.1)
        still = still + 1 if Flood.sent == last else 0
        last = Flood.sent
    return Flood.sent


def _read_in_order(response: http.client.HTTPResponse, first: int, piece: int, watch: bool = False) -> None:
    """Read the flood from part `first` to its end, `piece` bytes at a time, checking each byte's place.

    With `watch`, check at every read that the app is no more than BOUND_BYTES ahead of what the client has read.
    """
    expected = b"".join(_flood_part(index) for index in range(first, FLOOD_PARTS))
    received = 0
    while received < len(expected):
        if watch:
            assert Flood.sent * PART_BYTES - (first * PART_BYTES + received) <= BOUND_BYTES
        chunk = response.read(min(piece, len(expected) - received))
        assert chunk == expected[received : received + len(chunk)], f"byte {received} of part {first} on"
        received += len(chunk)
    assert response.read() == b""


@pytest.mark.parametrize("served_by", ["one_process", "server"])
def test_a_client_that_reads_nothing_holds_a_mounted_app_s_stream_and_lets_it_go_when_it_reads(
    served_by: str, request: pytest.FixtureRequest
) -> None:
    # Forwarded to the hub's app, each part the app sent was queued for the frontend at once: the app's send never
    # waited, and the whole stream sat in the hub's outbox and the frontend's memory for a client that read none.
    triton = request.getfixturevalue(served_by)
    with _flooded(triton) as response:
        held = _settled()
        assert not Flood.finished.is_set()
        assert 0 < held * PART_BYTES <= BOUND_BYTES
        first = response.read(PART_BYTES)  # the client reads: the app goes on
        assert first == _flood_part(0)
        _read_in_order(response, 1, 256 * 1024)
        assert Flood.finished.wait(30)
    assert not Flood.cancelled.is_set()


@pytest.mark.parametrize("served_by", ["one_process", "server"])
def test_a_client_that_reads_slowly_gets_a_mounted_app_s_whole_stream_in_order_the_app_never_far_ahead(
    served_by: str, request: pytest.FixtureRequest
) -> None:
    triton = request.getfixturevalue(served_by)
    with _flooded(triton) as response:
        _read_in_order(response, 0, 4096, watch=True)
        assert Flood.finished.wait(30)


@pytest.mark.parametrize("served_by", ["one_process", "server"])
def test_a_client_leaving_a_mounted_app_s_held_stream_stops_the_app(
    served_by: str, request: pytest.FixtureRequest
) -> None:
    # The app waits in send() for a client that reads nothing; the client leaving ends that wait, and the app's
    # receive() says so, as one process's connection says it.
    triton = request.getfixturevalue(served_by)
    with _flooded(triton):
        _settled()
        assert not Flood.finished.is_set()
    assert Flood.cancelled.wait(30)
    assert not Flood.finished.is_set()


@pytest.mark.parametrize("served_by", ["one_process", "server"])
def test_a_client_leaving_stops_a_mounted_app_whose_stream_awaits_nothing_but_send(
    served_by: str, request: pytest.FixtureRequest
) -> None:
    # Once its client had left, send() returned without a loop turn: a stream awaiting nothing else ran on to its
    # end (an endless one held the event loop, and with it every client and the server's stop, for ever), and the
    # task watching for the client's leaving never ran.
    triton = request.getfixturevalue(served_by)
    with _flooded(triton, "/eager/"):
        _settled()
        assert not Flood.finished.is_set()
    assert Flood.cancelled.wait(30)
    assert not Flood.finished.is_set()
