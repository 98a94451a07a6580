"""RemoteTriton: models bound into a running server from another process, served there, unloaded when it goes."""

from __future__ import annotations

import logging
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton import __version__, remote_triton
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.core.engine import Phase
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonUnrecoverableError
from pytriton.ipc.channel import BlockingChannel
from pytriton.model_config import ModelConfig, Tensor
from pytriton.models import build_model
from pytriton.remote_triton import RemoteTriton
from pytriton.runtime.attach import ACCEPTED, ATTACH_BIND, AttachBind, attach_address
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.inner_calls import pending, running
from tests.server_process import namespaces, wait_handles_signals

REPO = pathlib.Path(__file__).resolve().parents[1]
IO = {
    "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
    "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
}

REMOTE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import RemoteTriton

    def triple(requests):
        return [{"y": request["x"] * 3, "pid": np.array([os.getpid()], dtype=np.int64)} for request in requests]

    with RemoteTriton(url=sys.argv[1]) as triton:
        triton.bind(
            "triple",
            triple,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,)), Tensor(name="pid", dtype=np.int64, shape=(1,))],
            config=ModelConfig(batching=False),
        )
        print("BOUND", flush=True)
        triton.serve()
    """
)


UNBATCHED = ModelConfig(batching=False)


def echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"]} for request in requests]


def doubled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"] * 2} for request in requests]


def plus_one(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"] + 1} for request in requests]


def _own_model(triton: Triton) -> None:
    triton.bind("own", echo, **IO, config=UNBATCHED)


@pytest.fixture
def server() -> Iterator[Triton]:
    with running_triton(_own_model) as triton:
        yield triton


def _infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer(model, [tensor]).as_numpy("y")  # type: ignore[no-any-return]


_REPO_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _start_remote(tmp_path: pathlib.Path, url: str) -> subprocess.Popen[str]:
    script = tmp_path / "remote.py"
    script.write_text(REMOTE_SCRIPT)
    remote = subprocess.Popen(
        [sys.executable, str(script), url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert remote.stdout is not None
    assert remote.stdout.readline().strip() == "BOUND"
    return remote


def _finish(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _wait_until(condition, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_model_bound_remotely_is_served_over_both_protocols(server: Triton) -> None:
    with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
        remote.bind(
            "double", lambda requests: [{"y": r["x"] * 2} for r in requests], **IO, config=ModelConfig(batching=False)
        )
        assert remote.is_connected() and remote.is_alive()
        assert _infer(http_url(server), "double", np.array([1.0, 2.0], np.float32)).tolist() == [2.0, 4.0]
        with grpcclient.InferenceServerClient(grpc_url(server)) as client:
            tensor = grpcclient.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([5.0], np.float32))
            assert client.infer("double", [tensor]).as_numpy("y").tolist() == [10.0]
    with httpclient.InferenceServerClient(http_url(server)) as client:
        assert not client.is_model_ready("double")
        assert client.is_model_ready("own")
        index = {entry["name"]: entry for entry in client.get_model_repository_index(headers=HTTP_AUTH)}
        assert index["double"] == {"name": "double", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        assert index["own"] == {"name": "own", "version": "1", "state": "READY"}
    with pytest.raises(
        httpclient.InferenceServerException, match="Request for unknown model: 'double' has no available"
    ):
        _infer(http_url(server), "double", np.array([1.0], np.float32))


def _calls_own_big(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Sends 6 MiB made of its input through the server's `own` model (in shared memory) and returns the answer."""
    from pytriton.compose import call_model

    return [call_model("own", {"x": np.arange(3 << 19, dtype=np.float32) * r["x"][0]}) for r in requests]


def _calls_own_small(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    from pytriton.compose import call_model

    return [call_model("own", {"x": r["x"] + 1}) for r in requests]


def _calls_own_with_a_lambda(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Calls `own` with 6 MiB (in the call arena) times x; for x 0, beside an object array holding a lambda."""
    from pytriton.compose import call_model

    responses = []
    for request in requests:
        value = request["x"][0]
        inputs = {"x": np.arange(3 << 19, dtype=np.float32) * value}
        if value == 0:
            inputs["z"] = np.array([lambda: 1], dtype=object)
        responses.append(call_model("own", inputs))
    return responses


def test_a_remote_callables_call_whose_inputs_do_not_pickle_fails_in_the_models_words(server: Triton) -> None:
    # Its pickle error (500 `Can't pickle local object`) failed the request, and the arena the call grew never
    # reached the server: each later large call failed too ("the call's inputs did not arrive").
    with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
        remote.bind("lambda_caller", _calls_own_with_a_lambda, **IO, config=UNBATCHED)
        url = http_url(server)
        with pytest.raises(httpclient.InferenceServerException) as refused:
            _infer(url, "lambda_caller", np.array([0.0], np.float32))
        assert refused.value.status() == "400"
        assert refused.value.message() == (  # what the model's checks say of a thread instance's same call
            "expected 1 inputs but got 2 inputs for model 'own'. Got input(s) ['z','x'], but missing required "
            "input(s) ]. Please provide all required input(s)."
        )
        expected = np.arange(3 << 19, dtype=np.float32) * 2.0
        assert np.array_equal(_infer(url, "lambda_caller", np.array([2.0], np.float32)), expected)


def test_remotely_bound_callables_call_models_of_the_server(server: Triton) -> None:
    with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
        remote.bind("big_caller", _calls_own_big, **IO, config=UNBATCHED)
        remote.bind("small_caller", _calls_own_small, **IO, config=UNBATCHED)
        url = http_url(server)
        for value in (2.0, 3.0):  # each through its own instance's channel, whichever bound last
            expected = np.arange(3 << 19, dtype=np.float32) * value
            assert np.array_equal(_infer(url, "big_caller", np.array([value], np.float32)), expected)
            assert _infer(url, "small_caller", np.array([value], np.float32)).tolist() == [value + 1]


def test_a_model_bound_again_under_a_closed_ones_name_never_gets_its_cached_answers() -> None:
    """The response cache is keyed by model name and version: a removed model's entries must go with it."""
    with running_triton(_own_model, cache_config=["local,size=1048576"]) as server:
        x = np.array([1.0, 2.0], np.float32)
        cached = ModelConfig(batching=False, response_cache=True)
        for callable_, expected in ((doubled, [2.0, 4.0]), (plus_one, [2.0, 3.0])):
            with RemoteTriton(url=f"localhost:{server.http_port}") as remote:
                remote.bind("cached", callable_, **IO, config=cached)
                assert _infer(http_url(server), "cached", x).tolist() == expected
                assert _infer(http_url(server), "cached", x).tolist() == expected  # a cache hit


def test_grpc_url_attaches_too_and_binding_before_connect_waits_for_it(server: Triton) -> None:
    remote = RemoteTriton(url=f"grpc://localhost:{server.grpc_port}")
    remote.bind(
        "later", lambda requests: [{"y": r["x"] + 1} for r in requests], **IO, config=ModelConfig(batching=False)
    )
    assert not remote.is_connected()
    remote.connect()
    try:
        assert _infer(http_url(server), "later", np.array([1.0], np.float32)).tolist() == [2.0]
    finally:
        assert remote.stop() is True
    assert remote.stop() is False


def test_a_killed_remote_process_takes_its_model_and_leaves_the_server(server: Triton, tmp_path: pathlib.Path) -> None:
    remote = _start_remote(tmp_path, f"127.0.0.1:{server.http_port}")
    try:
        assert _infer(http_url(server), "triple", np.array([2.0], np.float32)).tolist() == [6.0]
        remote.kill()
        remote.wait()
        with httpclient.InferenceServerClient(http_url(server)) as client:
            assert _wait_until(lambda: not client.is_model_ready("triple"))
            assert client.is_model_ready("own")
        assert _infer(http_url(server), "own", np.array([1.0], np.float32)).tolist() == [1.0]
    finally:
        _finish(remote)
    again = _start_remote(tmp_path, f"127.0.0.1:{server.http_port}")  # the name is free again
    try:
        assert _infer(http_url(server), "triple", np.array([1.0], np.float32)).tolist() == [3.0]
        wait_handles_signals(again)  # BOUND is printed before serve(): a SIGINT sooner is a KeyboardInterrupt
    finally:
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=30) == 0
        _finish(again)


FORKED_REMOTE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import RemoteTriton  # imports the instance hosts, and their handler of os.fork

    if os.fork():
        os._exit(0)  # the child serves, as a process that multiprocessing's fork (or a preloading server) started

    def triple(requests):
        return [{"y": request["x"] * 3} for request in requests]

    x, y = Tensor(name="x", dtype=np.float32, shape=(-1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))
    with RemoteTriton(url=sys.argv[1]) as triton:
        triton.bind("triple", triple, inputs=[x], outputs=[y], config=ModelConfig(batching=False))
        print(os.getpid(), flush=True)
        triton.serve()
    """
)


def test_a_remote_forked_from_the_process_that_imported_pytriton_serves(server: Triton, tmp_path: pathlib.Path) -> None:
    """A forked child that returns from a process instance's callable ends there (host.py): the process that serves
    RemoteTriton's models, forked after the import, is no such child, and must not end at its first call."""
    script = tmp_path / "forked_remote.py"
    script.write_text(FORKED_REMOTE_SCRIPT)
    parent = subprocess.Popen(
        [sys.executable, str(script), f"127.0.0.1:{server.http_port}"], stdout=subprocess.PIPE, text=True, env=_REPO_ENV
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())  # the child's, once its model is bound
    try:
        for x in (1.0, 2.0):
            assert _infer(http_url(server), "triple", np.array([x], np.float32)).tolist() == [3 * x]
    finally:
        os.kill(pid, signal.SIGKILL)
        _finish(parent)


HELD_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import RemoteTriton

    def held(requests):
        print("RUNNING", flush=True)
        time.sleep(600)

    x, y = Tensor(name="x", dtype=np.float32, shape=(-1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))
    with RemoteTriton(url=sys.argv[1]) as triton:
        triton.bind("held", held, inputs=[x], outputs=[y], config=ModelConfig(batching=False))
        print("BOUND", flush=True)
        triton.serve()
    """
)


def test_requests_queued_for_a_killed_remote_fail_at_once_and_its_name_binds_again() -> None:
    """Nothing is left to run them: they waited out the server's exit timeout, and the name stayed taken as long."""
    with running_triton(_own_model, exit_timeout_secs=600) as server:
        url = http_url(server)
        script = ["-c", HELD_SCRIPT, url]
        remote = subprocess.Popen([sys.executable, *script], stdout=subprocess.PIPE, text=True, env=_REPO_ENV)
        answers: List[str] = []
        clients = [threading.Thread(target=lambda: answers.append(_error_of(url, "held"))) for _ in range(4)]
        try:
            assert remote.stdout is not None and remote.stdout.readline().strip() == "BOUND"
            for client in clients:
                client.start()
            assert remote.stdout.readline().strip() == "RUNNING"
            assert _wait_until(lambda: pending(server, "held") == 3)
            remote.kill()
            for client in clients:
                client.join(timeout=20)
            assert not any(client.is_alive() for client in clients)
        finally:
            _finish(remote)
        assert sorted(answers) == [
            f"[500] InstanceDied: model 'held' instance 0 (pid {remote.pid}) closed its connection",
            *["[503] model 'held' stopped before the request was served"] * 3,
        ]
        with RemoteTriton(url=url) as again:
            again.bind("held", echo, **IO, config=UNBATCHED)
            assert _infer(url, "held", np.array([5.0], np.float32)).tolist() == [5.0]


def test_a_binding_while_the_server_stops_is_refused_in_words_that_say_so() -> None:
    """It was bound into the draining server (and, past the attach socket's close, refused for want of a token)."""
    release = threading.Event()

    def held(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        release.wait(30)
        return echo(requests)

    server = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=60))
    server.bind("held", held, **IO, config=UNBATCHED)
    server.run()
    url = http_url(server)
    client = threading.Thread(target=_error_of, args=(url, "held"))
    stopper = threading.Thread(target=server.stop)
    try:
        client.start()
        assert _wait_until(lambda: running(server, "held"))
        with RemoteTriton(url=url) as remote:
            remote.connect()
            stopper.start()
            assert _wait_until(lambda: server._runtime.engine.phase is Phase.DRAINING)
            with pytest.raises(PyTritonInvalidOperationError, match="the server refused model 'late': the server is "):
                remote.bind("late", echo, **IO, config=UNBATCHED)
    finally:
        release.set()
        client.join(30)
        if stopper.ident is None:
            server.stop()
        else:
            stopper.join(30)


def test_a_remote_call_that_never_returns_holds_its_stop_only_as_long_as_the_servers_drain() -> None:
    """The server cut the call off at its exit timeout; the stop then waited for the call up to 120 s more."""
    release = threading.Event()

    def hangs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        release.wait(300)
        return echo(requests)

    with running_triton(_own_model, exit_timeout_secs=1) as server:
        url = http_url(server)
        remote = RemoteTriton(url=url)
        client = threading.Thread(target=_error_of, args=(url, "hangs"))
        stopper = threading.Thread(target=remote.stop)
        try:
            remote.bind("hangs", hangs, **IO, config=UNBATCHED)
            remote.connect()
            client.start()
            assert _wait_until(lambda: running(server, "hangs"))
            stopper.start()
            stopper.join(30)
            assert not stopper.is_alive()
        finally:
            release.set()
            client.join(30)
            if stopper.ident is not None:
                stopper.join(30)
            remote.stop()


def test_a_name_whose_binding_was_left_before_its_instances_attached_is_free_at_once(server: Triton) -> None:
    """A RemoteTriton that died mid-bind held the name until the instances' 30 s attach timeout."""
    spec, _ = build_model(
        model_name="left", model_version=1, **IO, config=UNBATCHED, instance_count=1, strict=False, openai=None
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(attach_address(server.http_port))
    channel = BlockingChannel(sock)
    try:
        channel.send((ATTACH_BIND, AttachBind(__version__, spec, 1, ACCESS_TOKEN, 0, ())))
        assert channel.receive().head[0] == ACCEPTED
    finally:
        channel.close()
    with RemoteTriton(url=f"localhost:{server.http_port}") as remote:
        assert _wait_until(lambda: _binds(remote, "left"))
        assert _infer(http_url(server), "left", np.array([4.0], np.float32)).tolist() == [4.0]


def _binds(remote: RemoteTriton, name: str) -> bool:
    """Whether `remote` binds `name` now (it tries once, refused while the server holds the name)."""
    try:
        remote.bind(name, echo, **IO, config=UNBATCHED)
    except PyTritonInvalidOperationError as refused:
        assert "is being bound already" in str(refused)
        remote._models.clear()  # the refused model: connect() would try it again
        return False
    return True


def _error_of(url: str, model: str) -> str:
    try:
        _infer(url, model, np.array([1.0], np.float32))
    except Exception as error:  # noqa: BLE001 - what the client says is the answer
        return str(error)
    return "answered"


def test_a_name_the_server_serves_is_refused(server: Triton) -> None:
    with RemoteTriton(url=f"localhost:{server.http_port}") as remote:
        with pytest.raises(PyTritonInvalidOperationError, match="already bound"):
            remote.bind("own", lambda requests: requests, **IO)
    assert _infer(http_url(server), "own", np.array([1.0], np.float32)).tolist() == [1.0]


def test_a_second_version_of_a_name_another_remote_serves_is_refused_in_words_that_say_so(server: Triton) -> None:
    url = f"localhost:{server.http_port}"
    with RemoteTriton(url=url) as first, RemoteTriton(url=url) as second:
        first.bind("twin", echo, **IO, config=UNBATCHED)
        with pytest.raises(PyTritonInvalidOperationError) as refused:
            second.bind("twin", echo, **IO, config=UNBATCHED, model_version=2)
        assert "model 'twin' version 1 is bound already through another RemoteTriton" in str(refused.value)
        assert _infer(http_url(server), "twin", np.array([3.0], np.float32)).tolist() == [3.0]


def _unrecoverable(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise PyTritonUnrecoverableError("the device is lost")


def test_an_unrecoverable_error_of_a_remote_callable_ends_its_binding_not_the_server(server: Triton) -> None:
    """As nvidia-pytriton 0.7: that RemoteTriton stops serving, the server and its other models go on."""
    with RemoteTriton(url=f"localhost:{server.http_port}") as remote:
        remote.bind("lost", _unrecoverable, **IO, config=UNBATCHED)
        with pytest.raises(Exception, match="PyTritonUnrecoverableError: the device is lost"):
            _infer(http_url(server), "lost", np.array([1.0], np.float32))
        assert _wait_until(lambda: not remote.is_alive())
        remote.serve(monitoring_period_s=0.1)  # returns: its binding is over
        with httpclient.InferenceServerClient(http_url(server)) as client:
            assert _wait_until(lambda: not client.is_model_ready("lost"))
        assert server.is_alive()
        assert _infer(http_url(server), "own", np.array([2.0], np.float32)).tolist() == [2.0]


def test_a_wrong_access_token_is_refused(server: Triton) -> None:
    def bind(triton: Triton) -> None:
        _own_model(triton)

    with running_triton(bind, http_restricted_api="model-repository:triton-access-token=s3cret") as guarded:
        url = f"localhost:{guarded.http_port}"
        with RemoteTriton(url=url, access_token="wrong") as remote:
            with pytest.raises(PyTritonInvalidOperationError, match="token"):
                remote.bind("m", lambda requests: requests, **IO)
        with RemoteTriton(url=url, access_token="s3cret") as remote:
            remote.bind(
                "m", lambda requests: [{"y": r["x"]} for r in requests], **IO, config=ModelConfig(batching=False)
            )
            assert _infer(http_url(guarded), "m", np.array([4.0], np.float32)).tolist() == [4.0]


OTHER_NAMESPACE_REMOTE = textwrap.dedent(
    """
    import sys
    import numpy as np
    from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonUnrecoverableError
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import RemoteTriton

    token = sys.argv[2] if len(sys.argv) > 2 else None
    with RemoteTriton(url=sys.argv[1], access_token=token) as triton:
        try:
            triton.bind(
                "neighbour",
                lambda requests: [{"y": request["x"]} for request in requests],
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(batching=False),
            )
            print("BOUND", flush=True)
        except PyTritonInvalidOperationError as error:
            print("REFUSED", error, flush=True)
    """
)


def _bind_from_another_pid_namespace(url: str, *token: str) -> str:
    """What a RemoteTriton says that shares the server's network namespace and user but not its PID namespace.

    As a sidecar container of the server's Kubernetes pod: it reaches the abstract socket, passes the
    credentials check (same uid), and cannot read the server's /proc entry.
    """
    unshare = shutil.which("unshare")
    assert unshare, "this test needs util-linux's unshare: apt-get install util-linux"
    result = subprocess.run(
        [
            *namespaces(unshare, "--pid", "--fork", "--mount-proc", root=False),
            sys.executable,
            "-c",
            OTHER_NAMESPACE_REMOTE,
            url,
            *token,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return result.stdout.strip() or result.stderr


def test_a_remote_that_cannot_read_the_servers_token_must_be_given_it(server: Triton) -> None:
    url = f"localhost:{server.http_port}"
    refused = _bind_from_another_pid_namespace(url)
    assert refused.startswith("REFUSED"), refused
    assert "restricts its model repository to an access token" in refused
    assert "RemoteTriton(access_token=...)" in refused
    assert _bind_from_another_pid_namespace(url, "not-the-token").endswith(
        "the access token does not match the server's"
    )
    assert _bind_from_another_pid_namespace(url, ACCESS_TOKEN) == "BOUND"


def test_a_server_whose_model_repository_is_open_takes_bindings_without_a_token() -> None:
    with running_triton(_own_model, TritonSecurityConfig(restricted_endpoints=[])) as open_server:
        assert _bind_from_another_pid_namespace(f"localhost:{open_server.http_port}") == "BOUND"


def test_the_token_is_read_from_the_server_by_a_process_of_its_user(server: Triton, tmp_path: pathlib.Path) -> None:
    """No access_token in the remote process: it finds the server's (a default server makes one)."""
    remote = _start_remote(tmp_path, f"127.0.0.1:{server.http_port}")
    try:
        assert _infer(http_url(server), "triple", np.array([1.0], np.float32)).tolist() == [3.0]
    finally:
        _finish(remote)


def test_workspace_is_accepted_and_said_once_to_be_unused(
    server: Triton, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote_triton._workspace_warned.clear()
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        for _ in range(2):
            with RemoteTriton(url=f"localhost:{server.http_port}", workspace=tmp_path) as remote:
                remote.bind("ws", echo, **IO, config=UNBATCHED)
                assert _infer(http_url(server), "ws", np.array([1.0], np.float32)).tolist() == [1.0]
    said = [record.getMessage() for record in caplog.records if "workspace is not used" in record.getMessage()]
    assert len(said) == 1, said
    assert list(tmp_path.iterdir()) == []


def test_no_server_to_attach_to_is_a_clear_error() -> None:
    remote = RemoteTriton(url="localhost:1")
    remote.bind("m", lambda requests: requests, **IO)
    import pytriton.remote_triton as module

    original = module._STARTUP_TIMEOUT_S
    module._STARTUP_TIMEOUT_S = 0.2
    try:
        with pytest.raises(PyTritonInvalidOperationError, match="no pytriton server to attach to"):
            remote.connect()
    finally:
        module._STARTUP_TIMEOUT_S = original
        remote.stop()


def test_no_server_is_also_the_timeout_that_nvidia_pytriton_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.7's connect() raises PyTritonClientTimeoutError there (its docstring says TimeoutError): code catching either
    must catch ours."""
    monkeypatch.setattr(remote_triton, "_STARTUP_TIMEOUT_S", 0.2)
    remote = RemoteTriton(url="localhost:1")
    remote.bind("m", lambda requests: requests, **IO)
    try:
        for expected in (PyTritonClientTimeoutError, TimeoutError, PyTritonInvalidOperationError):
            with pytest.raises(expected, match="no pytriton server to attach to at http://localhost:1"):
                remote.connect()
    finally:
        remote.stop()


def test_the_remote_serve_returns_when_the_server_stops(tmp_path: pathlib.Path) -> None:
    triton = Triton(
        config=__import__("pytriton.triton", fromlist=["TritonConfig"]).TritonConfig(
            http_port=0, grpc_port=0, metrics_port=0
        )
    )
    triton.run()
    remote = RemoteTriton(url=f"localhost:{triton.http_port}")
    remote.bind("m", lambda requests: [{"y": r["x"]} for r in requests], **IO, config=ModelConfig(batching=False))
    served = threading.Thread(target=remote.serve, kwargs={"monitoring_period_s": 0.1})
    served.start()
    try:
        assert _wait_until(remote.is_connected)
    finally:
        triton.stop()
    served.join(timeout=30)
    assert not served.is_alive()
    assert not remote.is_alive()


def test_a_process_of_another_user_cannot_attach(server: Triton) -> None:
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    assert system_python, "this test runs /usr/bin/python3 as user nobody: apt-get install python3"
    assert os.geteuid() == 0, "this test switches to user nobody: run it as root"
    probe = textwrap.dedent(
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect({attach_address(server.http_port)!r})
        print("closed" if s.recv(1) == b"" else "open")
        """
    )
    as_nobody = subprocess.run(
        [system_python, "-c", probe], user=65534, group=65534, capture_output=True, text=True, timeout=30
    )
    assert as_nobody.stdout.strip() == "closed", as_nobody.stderr


NVIDIA_STYLE_EXAMPLE = textwrap.dedent(
    """
    import numpy as np

    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import RemoteTriton, TritonConfig

    triton_config = TritonConfig(
        cache_config=[f"local,size={1024 * 1024}"],  # 1MB
    )

    @batch
    def _add_sub(**inputs):
        a_batch, b_batch = inputs.values()
        add_batch = a_batch + b_batch
        sub_batch = a_batch - b_batch
        return {"add": add_batch, "sub": sub_batch}

    with RemoteTriton(url='localhost') as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=_add_sub,
            inputs=[Tensor(shape=(1,), dtype=np.float32), Tensor(shape=(1,), dtype=np.float32)],
            outputs=[Tensor(shape=(1,), dtype=np.float32), Tensor(shape=(1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=8, response_cache=True)
        )
        triton.serve()
    """
)

DRIVER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    import numpy as np
    import tritonclient.http as httpclient

    def handles_sigterm(pid):  # as tests.server_process.handles_sigterm: serve() handles SIGINT and SIGTERM
        with open(f"/proc/{pid}/status") as status:
            return any(line.startswith("SigCgt:") and int(line.split()[1], 16) >> 14 & 1 for line in status)

    server = subprocess.Popen([sys.executable, "-m", "pytriton", "serve", sys.argv[1] + ":bind"])
    client = httpclient.InferenceServerClient("localhost:8000")
    for _ in range(600):
        try:
            if client.is_server_ready():
                break
        except Exception:
            pass
        time.sleep(0.05)
    example = subprocess.Popen([sys.executable, sys.argv[2]])
    for _ in range(600):
        if client.is_model_ready("AddSub"):
            break
        time.sleep(0.05)
    inputs = []
    for name, value in (("INPUT_1", 5.0), ("INPUT_2", 3.0)):
        tensor = httpclient.InferInput(name, [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        inputs.append(tensor)
    client.infer("AddSub", inputs)
    for _ in range(600):  # the model is ready before serve() handles SIGINT
        if handles_sigterm(example.pid) or example.poll() is not None:
            break
        time.sleep(0.05)
    example.send_signal(signal.SIGINT)
    example_code = example.wait(timeout=60)
    for _ in range(200):
        if not client.is_model_ready("AddSub"):
            break
        time.sleep(0.05)
    unloaded = not client.is_model_ready("AddSub")
    own = client.is_model_ready("own")
    server.send_signal(signal.SIGINT)
    server_code = server.wait(timeout=60)
    print(f"example={example_code} unloaded={unloaded} own={own} server={server_code}")
    """
)

BIND_FILE = textwrap.dedent(
    """
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor

    def bind(triton):
        triton.bind(
            "own",
            lambda requests: [{"y": r["x"]} for r in requests],
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(batching=False),
        )
    """
)


def test_nvidia_pytritons_remote_example_runs_unchanged_against_pytriton_serve(tmp_path: pathlib.Path) -> None:
    """The documented example attaches to localhost:8000: it runs in a network namespace where 8000 is free."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare and ip, "this test needs unshare (util-linux) and ip (iproute2): apt-get install util-linux iproute2"
    (tmp_path / "models.py").write_text(BIND_FILE)
    (tmp_path / "example.py").write_text(NVIDIA_STYLE_EXAMPLE)
    (tmp_path / "driver.py").write_text(DRIVER)
    command = f"{ip} link set lo up && exec {sys.executable} driver.py models.py example.py"
    result = subprocess.run(
        [*namespaces(unshare, "--net"), "sh", "-c", command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines: List[str] = result.stdout.strip().splitlines()
    assert lines and lines[-1] == "example=0 unloaded=True own=True server=0", result.stdout + result.stderr


UPSTREAM_EXAMPLE = pathlib.Path(__file__).parent / "data" / "simple_python_remote_mode"

UPSTREAM_DRIVER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    import tritonclient.http as httpclient

    folder = sys.argv[1]
    client = httpclient.InferenceServerClient("localhost:8000")

    def start(name):
        return subprocess.Popen([sys.executable, os.path.join(folder, name)])

    def ready(model):
        try:
            return client.is_model_ready(model)
        except Exception:
            return False

    def wait_until(condition):
        deadline = time.monotonic() + 60
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        return condition()

    def handles_sigterm(process):  # as tests.server_process.handles_sigterm: in serve(), SIGINT stops it
        with open(f"/proc/{process.pid}/status") as status:
            return any(line.startswith("SigCgt:") and int(line.split()[1], 16) >> 14 & 1 for line in status)

    server = start("server_starting_triton.py")
    assert wait_until(lambda: ready("AddSub")), "the server did not serve AddSub"
    remotes = [start("server_remote_mul.py"), start("server_remote_power.py")]
    bound = wait_until(lambda: ready("Mul") and ready("Power") or any(r.poll() is not None for r in remotes))
    client_py = os.path.join(folder, "client.py")
    ran = subprocess.run([sys.executable, client_py], capture_output=True, text=True, timeout=60)
    sys.stdout.write(ran.stderr)
    wait_until(lambda: all(handles_sigterm(remote) for remote in remotes))  # models are ready before serve()
    for remote in remotes:
        remote.send_signal(signal.SIGINT)
    codes = [remote.wait(timeout=60) for remote in remotes]
    unloaded = wait_until(lambda: not ready("Mul") and not ready("Power"))
    own = ready("AddSub")
    wait_until(lambda: handles_sigterm(server))
    server.send_signal(signal.SIGINT)
    code = server.wait(60)
    print(f"bound={bound} client={ran.returncode} remotes={codes} unloaded={unloaded} own={own} server={code}")
    """
)


@pytest.mark.parametrize("token", ["TRITON_ACCESS_TOKEN set", "TRITON_ACCESS_TOKEN unset"])
def test_nvidia_pytritons_simple_python_remote_mode_example_runs_unchanged(token: str) -> None:
    """Its scripts (tests/data/simple_python_remote_mode) hardcode localhost:8000: they run in a network namespace.

    `unshare --net` gives them a loopback of their own, on which 8000-8002 are free whatever runs beside.

    Upstream runs it with TRITON_ACCESS_TOKEN set (the server and both remotes pass it); unset, the server
    makes a token and each RemoteTriton reads it from the server (same user, same PID namespace).
    """
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare and ip, "this test needs unshare (util-linux) and ip (iproute2): apt-get install util-linux iproute2"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_ACCESS_TOKEN", None)
    if token.endswith(" set"):
        env["TRITON_ACCESS_TOKEN"] = "test-access-token-12345"
    command = f"{ip} link set lo up && exec {sys.executable} -c {shlex.quote(UPSTREAM_DRIVER)} {UPSTREAM_EXAMPLE}"
    result = subprocess.run(
        [*namespaces(unshare, "--net"), "sh", "-c", command], capture_output=True, text=True, timeout=110, env=env
    )
    output = result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    expected = "bound=True client=0 remotes=[0, 0] unloaded=True own=True server=0"
    assert lines and lines[-1] == expected, output
    for line in ("add: [[3.0], [5.0]]", "sub: [[-1.0], [-1.0]]", "mul: [[2.0], [6.0]]", "power: [[1.0], [8.0]]"):
        assert line in result.stdout, output


def test_a_remote_model_unloaded_and_loaded_again_serves_on_its_process_with_fresh_statistics(server: Triton) -> None:
    """Its instances live in the RemoteTriton's process, which an unload does not stop; a load then serves it
    there again, its statistics started again as Triton's for a model loaded anew."""
    with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
        remote.bind("double", doubled, **IO, config=UNBATCHED)
        assert _infer(http_url(server), "double", np.array([1.0], np.float32)).tolist() == [2.0]
        with httpclient.InferenceServerClient(http_url(server)) as client:
            client.unload_model("double", headers=HTTP_AUTH)

            def states() -> List[str]:
                index = client.get_model_repository_index(headers=HTTP_AUTH)
                return [entry["state"] for entry in index if entry["name"] == "double"]

            assert _wait_until(lambda: states() == ["UNAVAILABLE"])
            client.load_model("double", headers=HTTP_AUTH)
            stats = client.get_inference_statistics("double", headers=HTTP_AUTH)["model_stats"][0]
            assert stats["inference_count"] == 0
            assert _infer(http_url(server), "double", np.array([3.0], np.float32)).tolist() == [6.0]
