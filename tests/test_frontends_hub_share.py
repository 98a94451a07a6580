"""frontends=2: one frontend process, and the server's own process serving 1 in 4 of each port's open connections,
and at least two HTTP ones."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from pytriton.options.frontends import HUB_KEEPS, HUB_SHARE
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.frontend_processes import frontend_pids, serving_pid
from tests.test_frontends import PAIRS, _bind, _identity_in_region, _infer_json, _register_region

HERE = os.getpid()  # the tests' servers run in this process: the hub
KEEPS = HUB_KEEPS["http"]


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_bind, frontends=2) as triton:
        yield triton


def _landed_here(triton: Triton, kind: str, connect: Callable[[], Any]) -> Tuple[Any, bool]:
    """What `connect()` opened, and whether the hub gave it to its own server (it counts it when it hands it over)."""
    pool = triton._runtime._pool
    assert pool is not None
    accepted, served_here = pool.accepted[kind], pool.served_here[kind]
    opened = connect()
    deadline = time.monotonic() + 30
    while pool.accepted[kind] == accepted:
        assert time.monotonic() < deadline, "the connection was not handed over"
        time.sleep(0.005)
    assert pool.accepted[kind] == accepted + 1
    return opened, pool.served_here[kind] > served_here


def _none_open(triton: Triton, kind: str) -> None:
    """Wait until earlier tests' connections are counted closed: the hub places the next connection by the count."""
    pool = triton._runtime._pool
    assert pool is not None
    deadline = time.monotonic() + 30
    while pool._open(kind):
        assert time.monotonic() < deadline, f"{pool._open(kind)} {kind} connections still counted open"
        time.sleep(0.005)


@contextlib.contextmanager
def _http_connections(triton: Triton, count: int) -> Iterator[List[Tuple[http.client.HTTPConnection, bool]]]:
    """`count` HTTP connections opened one after the other, each with whether this process serves it; closed after."""
    opened: List[Tuple[http.client.HTTPConnection, bool]] = []

    def connect() -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
        connection.connect()
        return connection

    _none_open(triton, "http")
    try:
        for _ in range(count):
            opened.append(_landed_here(triton, "http", connect))
        yield opened
    finally:
        for connection, _ in opened:
            connection.close()


@contextlib.contextmanager
def _pick(triton: Triton) -> Iterator[Tuple[http.client.HTTPConnection, http.client.HTTPConnection]]:
    """Of KEEPS + 1 connections opened, one this process serves (the first ones) and the frontend's (the last)."""
    with _http_connections(triton, KEEPS + 1) as opened:
        assert [served_here for _, served_here in opened] == [True] * KEEPS + [False]
        yield opened[0][0], opened[-1][0]


def test_the_server_runs_one_frontend_process_and_serves_a_quarter_of_the_http_connections_itself(
    server: Triton,
) -> None:
    (frontend,) = frontend_pids()  # the first test of the module: its server is the only one
    with _http_connections(server, 3 * HUB_SHARE) as opened:
        served_here = [here for _, here in opened]
        assert served_here.count(True) == 3, served_here
        assert served_here[:KEEPS] == [True] * KEEPS, served_here  # the first ones: a client alone's
        for connection, here in opened:  # what is not served here is served by the frontend process
            assert serving_pid(connection.sock, [HERE if here else frontend]) == (HERE if here else frontend)
        for index, (connection, _) in enumerate(opened):
            status, document = _infer_json(connection, "identity", [float(index)])
            assert status == 200 and document["outputs"][0]["data"] == [float(index)]


def test_a_client_alone_is_served_here_each_time_it_connects_again(server: Triton) -> None:
    for value in range(3):
        with _http_connections(server, 1) as ((connection, here),):
            assert here
            assert _infer_json(connection, "identity", [float(value)])[0] == 200


def test_a_client_alone_infers_here_on_a_second_connection_opened_while_its_first_is_open(server: Triton) -> None:
    """perf_analyzer's way: its inference connection opens before its last metadata connection has closed."""
    with _http_connections(server, 2) as ((metadata, first_here), (inference, second_here)):
        metadata.request("GET", "/v2/models/identity/config", headers=HTTP_AUTH)
        assert metadata.getresponse().read()
        assert (first_here, second_here) == (True, True)
        assert serving_pid(inference.sock, [HERE, *frontend_pids()]) == HERE
        status, document = _infer_json(inference, "identity", [5.0])
        assert status == 200 and document["outputs"][0]["data"] == [5.0]


def test_one_grpc_connection_in_four_is_served_here_too(server: Triton) -> None:
    assert server.grpc_port is not None
    port = server.grpc_port
    _none_open(server, "grpc")
    opened = [
        _landed_here(server, "grpc", lambda: socket.create_connection(("127.0.0.1", port), timeout=30))
        for _ in range(3 * HUB_SHARE)
    ]
    try:
        served_here = [here for _, here in opened]
        assert HUB_KEEPS["grpc"] == 1  # the share alone places gRPC connections: each carries any number of calls
        assert served_here == ([True] + [False] * (HUB_SHARE - 1)) * 3, served_here
    finally:
        for sock, _ in opened:
            sock.close()
    for _ in range(HUB_SHARE):  # tritonclient's connections, wherever each lands
        with grpcclient.InferenceServerClient(grpc_url(server)) as client:
            assert client.is_model_ready("identity", headers=GRPC_AUTH)


def test_requests_served_here_and_by_the_frontend_form_one_batch_counted_once(server: Triton) -> None:
    assert server.http_port is not None
    with httpclient.InferenceServerClient(http_url(server)) as client:
        counted = int(client.get_inference_statistics("pairs", headers=HTTP_AUTH)["model_stats"][0]["inference_count"])
    before = len(PAIRS.batches)
    answers: List[Tuple[int, Any]] = []
    with _pick(server) as pair:
        threads = [threading.Thread(target=lambda c=c: answers.append(_infer_json(c, "pairs", [1.0]))) for c in pair]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert [(status, document["outputs"][0]["data"]) for status, document in answers] == [(200, [2.0])] * 2
    assert PAIRS.batches[before:] == [2]
    with httpclient.InferenceServerClient(http_url(server)) as client:
        assert (
            int(client.get_inference_statistics("pairs", headers=HTTP_AUTH)["model_stats"][0]["inference_count"])
            == counted + 2
        )


def test_the_connection_cap_counts_the_connections_served_here_and_by_the_frontend() -> None:
    # Over the cap means that every connection served is busy: an idle one would make room for the new one.
    body = json.dumps({"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()

    def busy() -> socket.socket:
        """A connection whose request body the server waits for."""
        sock = socket.create_connection(("127.0.0.1", triton.http_port), timeout=30)
        sock.sendall(
            b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")
        return sock

    with running_triton(_bind, frontends=2, limits=ServerLimits(max_connections=HUB_SHARE - 1)) as triton:
        assert triton.http_port is not None
        opened: List[Tuple[socket.socket, bool]] = []
        try:
            for _ in range(HUB_SHARE - 1):
                opened.append(_landed_here(triton, "http", busy))
            assert [here for _, here in opened].count(True) == KEEPS

            def connect() -> http.client.HTTPConnection:
                connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
                connection.connect()
                return connection

            over, here = _landed_here(triton, "http", connect)
            with contextlib.closing(over):
                assert not here  # the frontend's, which serves one connection itself: over by the hub's count
                assert _infer_json(over, "identity", [1.0])[0] == 503
            for sock, _ in opened:
                sock.sendall(body)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        finally:
            for sock, _ in opened:
                sock.close()


def test_sigkill_of_the_frontend_process_leaves_the_connections_served_here(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pytriton")
    others = set(frontend_pids())  # the module's server's
    with running_triton(_bind, frontends=2) as triton:
        assert triton.http_port is not None
        (victim,) = set(frontend_pids()) - others
        with _pick(triton) as (here, there):
            os.kill(victim, signal.SIGKILL)
            with pytest.raises((OSError, http.client.HTTPException)):
                _infer_json(there, "identity", [1.0])
            assert _infer_json(here, "identity", [2.0])[0] == 200
        deadline = time.monotonic() + 60
        while not any("is serving again" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "the frontend was not started again"
            time.sleep(0.05)
        (again,) = set(frontend_pids()) - others
        assert again != victim
        with _pick(triton) as pair:
            assert [_infer_json(connection, "identity", [3.0])[0] for connection in pair] == [200, 200]
        with httpclient.InferenceServerClient(http_url(triton)) as client:
            assert client.is_model_ready("identity")


def test_a_region_registered_on_a_connection_served_here_serves_the_frontend_s_next_request(server: Triton) -> None:
    """What the hub's own servers change reaches the frontend before their answer, as what it forwards does."""
    key = f"/pytriton-hub-share-{os.getpid()}"
    handle = shm.create_shared_memory_region("region", key, 64)
    try:
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        with _pick(server) as (here, there):
            _register_region(here, "r", key)
            there.request("POST", "/v2/models/identity/infer", _identity_in_region("r"))
            response = there.getresponse()
            assert response.status == 200, response.read()
            response.read()
            assert shm.get_contents_as_numpy(handle, np.float32, [12])[8:].tolist() == [0.0, 1.0, 2.0, 3.0]
            here.request("POST", "/v2/systemsharedmemory/region/r/unregister", b"", HTTP_AUTH)
            assert here.getresponse().read() == b""
            there.request("POST", "/v2/models/identity/infer", _identity_in_region("r"))
            response = there.getresponse()
            assert response.status == 404
            assert json.loads(response.read()) == {"error": "Unable to find shared memory region: 'r'"}
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_region_registered_over_grpc_served_here_serves_the_frontend_s_next_request() -> None:
    key = f"/pytriton-hub-share-grpc-{os.getpid()}"
    handle = shm.create_shared_memory_region("region", key, 64)
    with running_triton(_bind, frontends=2) as triton, contextlib.ExitStack() as stack:
        stack.callback(shm.destroy_shared_memory_region, handle)
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])

        def connect() -> grpcclient.InferenceServerClient:
            client = stack.enter_context(grpcclient.InferenceServerClient(grpc_url(triton)))
            client.is_server_live()  # connects
            return client

        client, here = _landed_here(triton, "grpc", connect)
        assert here  # a client alone
        client.register_system_shared_memory("r", key, 64, headers=GRPC_AUTH)
        with _pick(triton) as (_, there):
            there.request("POST", "/v2/models/identity/infer", _identity_in_region("r"))
            response = there.getresponse()
            assert response.status == 200, response.read()


def _verbose_lines(triton: Triton, caplog: pytest.LogCaptureFixture) -> Tuple[bool, bool]:
    """Whether this process and the frontend process log the verbose line of a connection closed on a bad request."""
    caplog.clear()
    with _http_connections(triton, KEEPS + 2) as opened:
        # Usually [True] * KEEPS + [False, False]; once in a quiet fresh-venv run [True, False, True, False] (the
        # hub's count of its own closed connections still catching up). Either serves: one of each side, and a
        # second of the frontend's last.
        ours = [connection for connection, served_here in opened if served_here]
        theirs = [connection for connection, served_here in opened if not served_here]
        assert ours and len(theirs) == 2, [served_here for _, served_here in opened]
        here, (there, after) = ours[0], theirs
        ports = [connection.sock.getsockname()[1] for connection in (here, there)]
        for connection in (here, there):
            connection.sock.sendall(b"NOT A REQUEST\r\n\r\n")
            assert connection.sock.recv(4096).startswith(b"HTTP/1.1 400")
        # Answered by the hub after the frontend's records made before it: they came first on its channel.
        assert _infer_json(after, "identity", [1.0])[0] == 200
    here_logged, there_logged = (
        f"closing HTTP connection from ('127.0.0.1', {port}): 400" in caplog.text for port in ports
    )
    return here_logged, there_logged


def test_a_log_level_changed_at_runtime_applies_to_the_frontend_process_as_here(
    start_triton: Callable[..., Triton], caplog: pytest.LogCaptureFixture, pytriton_logger: logging.Logger
) -> None:
    # pytriton_logger: the log changes set the `pytriton` logger's level in this process; restored after.
    # The frontend followed the hub's log settings, but not a level the application set in the hub after the
    # start: its verbose lines stayed off where the hub's were on.
    triton = start_triton(_bind, frontends=2)
    pool = triton._runtime._pool
    assert pool is not None
    (frontend,) = pool._frontends
    assert _verbose_lines(triton, caplog) == (False, False)

    def set_level(level: int) -> None:
        """Set the `pytriton` logger's level here, as an application may; return once the frontend has it."""
        told = frontend.mirror
        pytriton_logger.setLevel(level)
        deadline = time.monotonic() + 30
        while frontend.mirror == told:  # the hub looks every PING_PERIOD_S
            assert time.monotonic() < deadline, "the frontend was not told the new level"
            time.sleep(0.01)

    for level, logged in ((logging.DEBUG, True), (logging.INFO, False)):
        set_level(level)
        assert _verbose_lines(triton, caplog) == (logged, logged)

    with _http_connections(triton, 1) as ((here, served_here),):  # the hub's own server tells the frontend too
        assert served_here
        here.request("POST", "/v2/logging", json.dumps({"log_verbose_level": 1}), HTTP_AUTH)
        assert json.loads(here.getresponse().read())["log_verbose_level"] == 1
    assert _verbose_lines(triton, caplog) == (True, True)
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        assert client.update_log_settings({"log_verbose_level": 0}, headers=GRPC_AUTH, as_json=True)
    assert _verbose_lines(triton, caplog) == (False, False)
    set_level(logging.DEBUG)  # the runtime settings' severities hold over a level set since, here and there
    assert _verbose_lines(triton, caplog) == (False, False)
