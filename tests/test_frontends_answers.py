"""The same request gets the same answer from every frontend process as from a server of one process (issue 35).

Each test sends its requests over several connections of a server with two frontend processes (frontends=3: the
hub serves none), checks that the connections reached both, and that each answered as the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
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


def _bind(triton: Triton) -> None:
    triton.mount("/events", _events)
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
