"""What a RemoteTriton's process adds to the server besides models: custom metrics and custom routes.

The RemoteTriton runs in a process of its own (tests/remote_extensions.py): in the server's own process the
registry of custom metrics is the server's, and nothing would have to travel.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import socket
import subprocess
import sys
import threading
from typing import Any, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.remote_triton import RemoteTriton
from pytriton.triton import Triton, TritonSecurityConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, running_triton
from tests.fleet import wait_until
from tests.server_process import ROOT
from tests.test_custom_metrics import VALUES, assert_counted, scrape, send_all, value
from tests.test_custom_routes import _Held, _metric_lines, _request

WAIT_S = 30.0
IO = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
HELD = _Held()


def _models(triton: Triton) -> None:
    unbatched = ModelConfig(batching=False)
    triton.bind("doubled", lambda requests: [{"x": r["x"] * 2} for r in requests], IO, IO, config=unbatched)
    triton.bind("same", lambda requests: [{"x": r["x"]} for r in requests], IO, IO, config=unbatched)
    triton.bind("held", HELD, IO, [Tensor(name="y", dtype=np.float32, shape=(-1,))], config=unbatched)


class Remote:
    """The RemoteTriton process and its commands (tests/remote_extensions.py); `name`: its model and route prefix."""

    def __init__(self, url: str, name: str, marks: pathlib.Path) -> None:
        self.marks = marks
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.remote_extensions", url, name, str(marks)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.read() == "BOUND"

    def read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def command(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def marked(self, name: str) -> bool:
        return (self.marks / name).exists()

    def close(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it was killed
        if self.process.poll() is None:
            try:
                self.process.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_models) as triton:
        yield triton


@pytest.fixture(scope="module")
def remote(server: Triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    process = Remote(f"127.0.0.1:{server.http_port}", "remote", tmp_path_factory.mktemp("marks"))
    try:
        yield process
    finally:
        process.close()


def _port(triton: Triton) -> int:
    assert triton.http_port is not None
    return triton.http_port


def _json(answer: Tuple[int, bytes]) -> Tuple[int, Any]:
    return answer[0], json.loads(answer[1])


def test_each_remote_model_calls_models_through_its_own_instance(server: Triton, remote: Remote) -> None:
    """Two models in one RemoteTriton process: the first one's model calls go over its own connection."""
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
        tensor = httpclient.InferInput("x", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 4.0], np.float32))
        assert client.infer("remote_composed", [tensor]).as_numpy("x").tolist() == [2.0, 8.0]


# -- custom metrics ------------------------------------------------------------------------------------------


def test_metrics_of_a_remote_callable_are_exact_on_the_servers_metrics_port(server: Triton, remote: Remote) -> None:
    values: List[float] = VALUES * 3
    send_all(server, "remote", values, parallel=4)
    assert_counted(scrape(server), "test_remote", "remote", values)
    send_all(server, "remote", [1.0])
    assert_counted(scrape(server), "test_remote", "remote", [*values, 1.0])


def test_metrics_made_outside_remote_callables_reach_the_server_with_the_next_answer(
    server: Triton, remote: Remote
) -> None:
    before = value(scrape(server), "test_remote_outside", "test_remote_outside")
    assert before >= 1  # the update made before binding came with the binding
    assert remote.command("bump") == "DONE"
    send_all(server, "remote", [1.0])
    assert value(scrape(server), "test_remote_outside", "test_remote_outside") == before + 1


# -- custom routes -------------------------------------------------------------------------------------------


def test_a_remote_route_runs_in_the_remote_process(server: Triton, remote: Remote) -> None:
    port = _port(server)
    status, answer = _json(_request(port, "/remote/echo/abc?k=v", {"a": 1}, headers={"x-test": "yes"}))
    assert status == 200
    assert answer == {"name": "abc", "query": {"k": "v"}, "body": {"a": 1}, "header": "yes", "pid": remote.process.pid}
    assert _request(port, "/remote/echo/abc")[0] == 405  # GET: POST and PUT only
    assert _request(port, "/remote/nowhere")[0] == 404


def test_a_remote_routes_handler_calls_the_servers_models(server: Triton, remote: Remote) -> None:
    port = _port(server)
    assert _request(port, "/remote/doubled", {"x": [1.0, 2.5]}) == (201, b"[2.0, 5.0]")
    assert _json(_request(port, "/remote/doubled_async", {"x": [3.0]})) == (200, {"x": [6.0], "counted": [[1.0]]})
    status, answer = _json(_request(port, "/remote/wrong_dtype", {}))
    assert status == 400 and "FP64" in answer["error"]
    assert _json(_request(port, "/remote/failing", {})) == (500, {"error": "ValueError: no luck"})
    assert server.metrics_port is not None
    lines = _metric_lines(server.metrics_port)
    assert 'pytriton_custom_route_requests{route="/remote/doubled",method="POST",status="201"} 1' in lines


def test_a_remote_handlers_own_cancel_and_str_body_are_answered(server: Triton, remote: Remote) -> None:
    port = _port(server)
    assert _json(_request(port, "/remote/cancelled_itself", {})) == (500, {"error": "CancelledError"})
    assert _request(port, "/remote/text", {}) == (200, "é".encode())


def _post_and_leave(port: int, path: str) -> None:
    body = b"{}"
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        assert HELD.entered.wait(WAIT_S), "the remote handler's model call did not start"


def test_a_remote_async_handler_is_cancelled_when_its_client_leaves(server: Triton, remote: Remote) -> None:
    HELD.reset()
    _post_and_leave(_port(server), "/remote/held")
    assert HELD.inner_cancelled.wait(WAIT_S), "the model call was not cancelled"
    wait_until(lambda: remote.marked("held-cancelled"), WAIT_S, "the remote handler is cancelled")


def test_a_remote_sync_handlers_model_calls_fail_once_its_client_leaves(server: Triton, remote: Remote) -> None:
    HELD.reset()
    _post_and_leave(_port(server), "/remote/held_sync")
    assert HELD.inner_cancelled.wait(WAIT_S), "the model call was not cancelled"
    wait_until(lambda: remote.marked("held_sync-CANCELLED-CANCELLED"), WAIT_S, "both calls fail as CANCELLED")
    assert HELD.calls == 1  # the call made after the client left never reached the model


def _memfds(pid: int) -> Set[int]:
    """pytriton's shared-memory segments (memfds) process `pid` holds a descriptor or a mapping of, by inode."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:pytriton"):
                held.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue  # closed meanwhile
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "/memfd:pytriton" in line:
                held.add(int(line.split()[4]))
    return held


def _dev_shm(pids: Sequence[int]) -> Set[str]:
    """The named shared memory of processes `pids` (pytriton names it so only where memfd is missing, and unlinks it
    at once there). Not every name with "pytriton" in it: the suite's other worker makes and destroys such regions."""
    ours = tuple(f"pytriton-{pid}-" for pid in pids)
    return {name for name in os.listdir("/dev/shm") if name.startswith(ours)}


def _all_checked(answer: Tuple[int, bytes], calls: int) -> bool:
    """Whether a /big answer says every call was answered right, its outputs read in place (shared memory)."""
    status, body = _json(answer)
    return status == 200 and body["checked"] == [[True, True]] * calls


def test_a_remote_routes_model_calls_pass_large_tensors_through_shared_memory_and_let_go_of_it(
    server: Triton, remote: Remote
) -> None:
    port = _port(server)
    for path in ("/remote/big", "/remote/big_async"):  # 6 MiB each way; `same` answers with its input, in place
        assert _all_checked(_request(port, path, {"mib": 6, "calls": 4}), 4)
    pids: Sequence[int] = (os.getpid(), remote.process.pid)
    shm = _dev_shm(pids)
    for path in ("/remote/big", "/remote/big_async"):
        assert _all_checked(_request(port, path, {"mib": 1, "calls": 10}), 10)
    held = [_memfds(pid) for pid in pids]
    assert all(held)  # each side maps the other's arena
    for _ in range(3):  # many calls, one at a time and two at once: neither side holds more segments as they go
        for path in ("/remote/big", "/remote/big_async"):
            assert _all_checked(_request(port, path, {"mib": 1, "calls": 10}), 10)
    assert [_memfds(pid) for pid in pids] == held
    assert _dev_shm(pids) == shm


def test_a_remote_killed_in_a_large_model_call_leaves_no_shared_memory_behind(
    server: Triton, tmp_path: pathlib.Path
) -> None:
    port = _port(server)
    before, shm = _memfds(os.getpid()), _dev_shm([os.getpid()])
    killed = Remote(f"127.0.0.1:{server.http_port}", "killed", tmp_path)
    try:
        HELD.reset()
        answers: queue.Queue[Tuple[int, bytes]] = queue.Queue()
        client = threading.Thread(target=lambda: answers.put(_request(port, "/killed/held_big", {})))
        client.start()
        assert HELD.entered.wait(WAIT_S), "the remote handler's model call did not start"
        assert _memfds(os.getpid()) - before  # the held call's 4 MiB input: the server views the remote's arena
        killed.process.kill()
        client.join(WAIT_S)
        assert _json(answers.get_nowait()) == (
            503,
            {"error": "the RemoteTriton that served route '/killed/held_big' is gone"},
        )
        assert HELD.inner_cancelled.wait(WAIT_S), "the model call was not cancelled"
        wait_until(lambda: _memfds(os.getpid()) == before, WAIT_S, "the server lets go of the remote's shared memory")
        assert _dev_shm([os.getpid(), killed.process.pid]) == shm
    finally:
        killed.close()


def test_a_path_taken_is_refused_and_mount_names_the_alternative(server: Triton, remote: Remote) -> None:
    with RemoteTriton(url=f"127.0.0.1:{server.http_port}") as other:
        with pytest.raises(PyTritonValidationError, match="'/remote/doubled' is already served for POST"):
            other.add_route("/remote/doubled", lambda request: {})
        with pytest.raises(PyTritonValidationError, match="under /v2/"):
            other.add_route("/v2/mine", lambda request: {})
        with pytest.raises(PyTritonInvalidOperationError, match=r"Triton\.mount in the server's own process"):
            other.mount("/app", lambda scope, receive, send: None)
        other.add_route("/remote/doubled", lambda request: {"get": True}, methods=["GET"])  # another method is free
        assert _json(_request(_port(server), "/remote/doubled")) == (200, {"get": True})
    assert _request(_port(server), "/remote/doubled")[0] == 405  # gone with the RemoteTriton that added it


def test_a_route_added_before_connect_is_added_at_connect(server: Triton) -> None:
    remote = RemoteTriton(url=f"http://127.0.0.1:{server.http_port}")
    remote.add_route("/early/{item}", lambda request: {"item": request.path_params["item"]}, methods=["GET"])
    assert _request(_port(server), "/early/a")[0] == 404
    remote.connect()
    try:
        assert _json(_request(_port(server), "/early/a")) == (200, {"item": "a"})
        assert remote.is_alive()
    finally:
        remote.stop()
    assert _request(_port(server), "/early/a")[0] == 404


def test_a_remote_route_goes_when_its_remote_closes_or_dies(server: Triton, tmp_path: pathlib.Path) -> None:
    port = _port(server)
    closing = Remote(f"127.0.0.1:{server.http_port}", "closing", tmp_path)
    try:
        before = value(scrape(server), "test_remote_outside", "test_remote_outside")
        assert _request(port, "/closing/echo/x", {})[0] == 200
        assert closing.command("bump") == "DONE"
        assert closing.command("close") == "CLOSED"
        assert _request(port, "/closing/echo/x", {})[0] == 404
        # what it counted outside its callables since its last answer came as it closed
        assert value(scrape(server), "test_remote_outside", "test_remote_outside") == before + 1
    finally:
        closing.close()
    dying = Remote(f"127.0.0.1:{server.http_port}", "dying", tmp_path)
    try:
        answers: queue.Queue[Tuple[int, bytes]] = queue.Queue()
        client = threading.Thread(target=lambda: answers.put(_request(port, "/dying/hang", {})))
        client.start()
        wait_until(lambda: dying.marked("hang-entered"), WAIT_S, "the handler runs")
        dying.process.kill()
        client.join(WAIT_S)
        status, answer = _json(answers.get_nowait())
        assert (status, answer) == (503, {"error": "the RemoteTriton that served route '/dying/hang' is gone"})
        wait_until(lambda: _request(port, "/dying/hang", {})[0] == 404, WAIT_S, "the route is removed")
    finally:
        dying.close()


def test_a_remote_whose_plain_handler_hangs_still_exits_once_it_closed(server: Triton, tmp_path: pathlib.Path) -> None:
    port = _port(server)
    hanging = Remote(f"127.0.0.1:{server.http_port}", "hanging", tmp_path)
    try:
        answers: queue.Queue[Tuple[int, bytes]] = queue.Queue()
        client = threading.Thread(target=lambda: answers.put(_request(port, "/hanging/hang", {})))
        client.start()
        wait_until(lambda: hanging.marked("hang-entered"), WAIT_S, "the handler runs")
        assert hanging.process.stdin is not None
        hanging.process.stdin.close()  # its main() stops the RemoteTriton and returns
        assert hanging.process.wait(WAIT_S) == 0  # its handler's thread, still sleeping, holds no exit
        client.join(WAIT_S)
        status, answer = _json(answers.get_nowait())
        assert (status, answer) == (503, {"error": "the RemoteTriton that served route '/hanging/hang' is gone"})
    finally:
        hanging.close()


def _restricted(triton: Triton) -> None:
    _models(triton)


@pytest.mark.parametrize("frontends", [2])
def test_remote_routes_follow_the_servers_access_rules_with_frontend_processes(
    frontends: Optional[int], tmp_path: pathlib.Path
) -> None:
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, restricted_endpoints=["custom", "model-repository"])
    with running_triton(_restricted, security_config=security, frontends=frontends) as triton:
        port = _port(triton)
        with RemoteTriton(url=f"127.0.0.1:{port}", access_token="wrong") as wrong:
            with pytest.raises(PyTritonInvalidOperationError, match="does not match"):
                wrong.add_route("/wrong", lambda request: {})
        remote = Remote(f"127.0.0.1:{port}", "guarded", tmp_path)
        try:
            status, answer = _json(_request(port, "/guarded/doubled", {"x": [1.0]}))
            assert (status, answer) == (
                403,
                {"error": "This API is restricted, expecting header 'triton-access-token'"},
            )
            assert _request(port, "/guarded/doubled", {"x": [1.0]}, headers=HTTP_AUTH) == (201, b"[2.0]")
            assert _all_checked(_request(port, "/guarded/big", {"mib": 3, "calls": 4}, headers=HTTP_AUTH), 4)
        finally:
            remote.close()
        assert _request(port, "/guarded/doubled", {"x": [1.0]}, headers=HTTP_AUTH)[0] == 404
