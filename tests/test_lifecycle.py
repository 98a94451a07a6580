"""Triton's lifecycle: run/stop, serve() with signals, unrecoverable errors, config resolution."""

from __future__ import annotations

import gc
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonValidationError,
)
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.models import MAX_ARRAY_DIMS
from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy
from tests.fleet import free_ports
from tests.http_helpers import post_json, request
from tests.server_process import ServerProcess

SERVER = textwrap.dedent(
    """
    import signal, sys, threading, time
    import numpy as np
    from pytriton.exceptions import PyTritonUnrecoverableError
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy

    def infer(requests):
        value = float(requests[0]["x"].ravel()[0])
        if value < 0:
            raise PyTritonUnrecoverableError("cannot go on")
        open(sys.argv[1], "w").close()  # the test knows the request is inside the model
        time.sleep(value)
        return [{"y": r["x"]} for r in requests]

    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, exit_timeout_secs=10))
    triton.bind("m", infer, inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(max_batch_size=1))
    triton.run()

    def announce():  # only once serve() handles SIGTERM, so the test's signal cannot come too early
        while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            time.sleep(0.01)
        print(triton.http_port, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    triton.serve()
    print(f"serve returned; failure: {triton.failure}", flush=True)
    """
)


def _start_server(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "in_model")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parent.parent),
    )
    port = int(process.stdout.readline())
    return process, port


def _body(value: float):
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def test_sigterm_finishes_in_flight_requests_then_exits(tmp_path):
    process, port = _start_server(tmp_path)
    try:
        results = []
        worker = threading.Thread(target=lambda: results.append(post_json(port, "/v2/models/m/infer", _body(0.5))))
        worker.start()
        deadline = time.monotonic() + 10
        while not (tmp_path / "in_model").exists():
            assert time.monotonic() < deadline, "the request did not reach the model"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        worker.join(10)
        assert results and results[0][0] == 200
        assert process.wait(10) == 0
        assert process.stdout.read().strip() == "serve returned; failure: None"  # stopped, not failed
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def test_unrecoverable_error_stops_serve(tmp_path):
    process, port = _start_server(tmp_path)
    try:
        status, document = post_json(port, "/v2/models/m/infer", _body(-1))
        assert status == 500 and "cannot go on" in document["error"]
        assert process.wait(15) == 0  # the script exits as it likes: `triton.failure` says why serve() returned
        assert process.stdout.read().strip() == (
            "serve returned; failure: model 'm' raised PyTritonUnrecoverableError: cannot go on"
        )
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def _identity(requests):
    return [{"OUTPUT_1": r["INPUT_1"]} for r in requests]


def _bind_identity(triton: Triton, name: str = "identity") -> None:
    triton.bind(
        name, _identity, inputs=[Tensor(dtype=np.float32, shape=(-1,))], outputs=[Tensor(dtype=np.float32, shape=(-1,))]
    )


def test_bind_after_run_and_several_models():
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        _bind_identity(triton, "first")
        triton.run()
        assert triton.is_alive()
        _bind_identity(triton, "second")
        for name in ("first", "second"):
            status, document = post_json(
                triton.http_port,
                f"/v2/models/{name}/infer",
                {"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [3]}]},
            )
            assert status == 200 and document["outputs"][0]["data"] == [3]
    assert not triton.is_alive()


def test_stop_closes_the_port_and_is_idempotent():
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    _bind_identity(triton)
    triton.run()
    port = triton.http_port
    assert request(port, "GET", "/v2/health/ready")[0] == 200
    triton.stop()
    triton.stop()
    with pytest.raises(OSError):
        request(port, "GET", "/v2/health/ready")
    with pytest.raises(PyTritonInvalidOperationError):
        triton.run()


def test_readiness_says_ready_only_once_the_grpc_port_listens():
    """A balancer that checks readiness on the HTTP port and sends gRPC to the gRPC port (HAProxy's `check port`)
    must find the gRPC port listening once readiness is 200: else it answers its client 503 (connect failure)."""
    http_port, grpc_port = free_ports(2)
    first_ready: list = []  # what a connection to the gRPC port did right after the first 200

    def poll() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
            try:
                connection.request("GET", "/v2/health/ready")
                ready = connection.getresponse().status == 200
            except OSError:
                continue  # not listening yet: ask again at once, so that the first 200 is seen as it comes
            finally:
                connection.close()
            if ready:
                try:
                    socket.create_connection(("127.0.0.1", grpc_port), timeout=5).close()
                    first_ready.append("gRPC port listening")
                except OSError as error:
                    first_ready.append(f"gRPC port: {error}")
                return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, allow_metrics=False))
    try:
        _bind_identity(triton)
        triton.run()
        poller.join(60)
    finally:
        triton.stop()
    assert first_ready == ["gRPC port listening"]


def test_model_name_validation_and_duplicates():
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        for bad in ("", "has space", "slash/name"):
            with pytest.raises(PyTritonValidationError):
                _bind_identity(triton, bad)
        _bind_identity(triton, "ok.name-1_x")
        with pytest.raises(PyTritonInvalidOperationError):
            _bind_identity(triton, "ok.name-1_x")


def test_bind_rejects_bad_configs():
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        tensor = [Tensor(dtype=np.float32, shape=(-1,))]
        # tritonserver 2.51 refuses to load it in these words (0.7's bind: "failed to load 'a', failed to poll from
        # model repository", the words in tritonserver's log)
        refused = "Response Cache does not currently support model a with 'decoupled' transaction policy. Please"
        with pytest.raises(PyTritonModelConfigError, match=refused):
            triton.bind("a", _identity, tensor, tensor, config=ModelConfig(decoupled=True, response_cache=True))
        with pytest.raises(PyTritonModelConfigError):
            triton.bind("b", _identity, [Tensor(dtype=np.complex64, shape=(1,))], tensor)
        with pytest.raises(PyTritonBadParameterError):
            triton.bind("c", [], tensor, tensor)
        with pytest.raises(PyTritonModelConfigError):
            triton.bind("d", _identity, [Tensor(name="x", dtype=np.float32, shape=(1,))] * 2, tensor)
        # Bound, it answered every request 500 (numpy refuses arrays of that many dimensions)
        most = MAX_ARRAY_DIMS
        too_deep = [Tensor(dtype=np.float32, shape=(1,) * most)]  # one more with the batch axis
        with pytest.raises(PyTritonModelConfigError, match=f"has {most + 1} dims with the batch axis, more than"):
            triton.bind("e", _identity, too_deep, tensor, config=ModelConfig(max_batch_size=4))
        triton.bind("f", _identity, too_deep, tensor, config=ModelConfig(batching=False))  # as deep as may be


def test_default_tensor_names_and_dtype_forms():
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        triton.bind(
            "forms",
            lambda requests: [{"OUTPUT_1": r["INPUT_1"], "OUTPUT_2": r["INPUT_2"]} for r in requests],
            inputs=[Tensor(dtype=np.float32().dtype, shape=(-1,)), Tensor(dtype="int16", shape=(-1,))],
            outputs=[Tensor(dtype=np.dtype("float32"), shape=(-1,)), Tensor(dtype=np.int16, shape=(-1,))],
        )
        triton.run()
        from tests.http_helpers import get_json

        _, metadata = get_json(triton.http_port, "/v2/models/forms")
    assert [(t["name"], t["datatype"]) for t in metadata["inputs"]] == [("INPUT_1", "FP32"), ("INPUT_2", "INT16")]
    assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [("OUTPUT_1", "FP32"), ("OUTPUT_2", "INT16")]


def test_config_from_env_casts_and_warns(monkeypatch, caplog):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "45436")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_LOG_VERBOSE", "4")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "false")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0", "local,size=100")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_NO_SUCH_OPTION", "1")
    config = TritonConfig.from_env()
    assert config.grpc_port == 45436 and config.log_verbose == 4 and config.allow_metrics is False
    assert config.cache_config == ["local,size=100"]
    assert "Ignoring no_such_option=1" in caplog.text
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_HTTP", "maybe")
    with pytest.raises(PyTritonValidationError):
        TritonConfig.from_env()


def test_config_precedence_explicit_over_env_over_defaults(monkeypatch):
    from pytriton.triton_config import resolve_config

    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", "9100")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "9101")
    resolved = resolve_config(TritonConfig(http_port=9200))
    assert resolved.http_port == 9200 and resolved.grpc_port == 9101 and resolved.metrics_port is None
    assert TritonConfig(http_port=1).to_dict()["http_port"] == 1


def test_http_and_grpc_cannot_both_be_disabled():
    with pytest.raises(PyTritonValidationError, match="has to be allowed"):
        TritonConfig(allow_http=False, allow_grpc=False)


def test_options_without_effect_warn_and_invalid_ones_fail(caplog):
    Triton(config=TritonConfig(http_thread_count=4, http_port=0)).stop()
    assert "http_thread_count has no effect" in caplog.text
    with pytest.raises(PyTritonValidationError, match="unknown restricted api 'nope'"):
        Triton(config=TritonConfig(http_restricted_api="nope:key=value"))


def test_options_of_an_endpoint_not_served_are_warned_of(caplog, monkeypatch):
    # tritonserver ignores --grpc-port with --allow-grpc=false without a word; the user who set one hears why
    monkeypatch.delenv("AIP_MODE", raising=False)
    unserved = {"allow_grpc": False, "allow_metrics": False, "allow_sagemaker": None, "allow_vertex_ai": None}
    options = {"grpc_port": 0, "grpc_use_ssl": False, "metrics_port": 0, "metrics_interval_ms": 100}
    options.update({"allow_cpu_metrics": False, "sagemaker_port": 0, "vertex_ai_port": 0})
    Triton(config=TritonConfig(http_port=0, **unserved, **options)).stop()
    assert "TritonConfig.grpc_port has no effect: gRPC is not served (allow_grpc=False)" in caplog.text
    assert "TritonConfig.metrics_interval_ms, metrics_port have no effect: metrics are not served" in caplog.text
    assert "TritonConfig.sagemaker_port has no effect: the SageMaker frontend is not served" in caplog.text
    assert "TritonConfig.vertex_ai_port has no effect: the Vertex AI frontend is not served" in caplog.text
    assert "grpc_use_ssl" not in caplog.text and "allow_cpu_metrics" not in caplog.text  # False asks for nothing
    caplog.clear()
    # the metrics port listens on http_address, HTTP served or not: only HTTP's own options are reported
    Triton(config=TritonConfig(allow_http=False, grpc_port=0, http_port=0, http_address="127.0.0.1")).stop()
    assert "TritonConfig.http_port has no effect: HTTP is not served (allow_http=False)" in caplog.text
    assert "http_address" not in caplog.text
    caplog.clear()
    served = {"allow_grpc": True, "allow_metrics": True, "allow_sagemaker": True, "allow_vertex_ai": True}
    Triton(config=TritonConfig(http_port=0, **served, **options)).stop()
    assert "no effect" not in caplog.text


def test_config_values_given_as_text_in_code_are_cast_as_0_7s_command_line_took_them():
    # 0.7 passed TritonConfig's values to tritonserver's command line as text: http_port="8000" (read from the
    # environment, say) served on 8000 and allow_grpc="false" turned gRPC off. Here the first was a TypeError and
    # the second served gRPC, as a non-empty string is true.
    config = TritonConfig(http_port="0", allow_grpc="false", allow_metrics="0", allow_vertex_ai="false")
    assert TritonConfig(allow_http="true", allow_grpc="false").allow_http == "true"  # one endpoint: accepted
    with Triton(config=config) as triton:  # allow_vertex_ai "false" keeps the default policy: serving on enter
        assert triton.is_connected() and isinstance(triton.http_port, int)
        assert triton.grpc_port is None and triton.metrics_port is None
        assert request(triton.http_port, "GET", "/v2/health/ready")[0] == 200
    with pytest.raises(PyTritonValidationError, match=r"TritonConfig\.http_port must be an integer, got 'eighty'"):
        Triton(config=TritonConfig(http_port="eighty"))
    with pytest.raises(PyTritonValidationError, match=r"TritonConfig\.exit_timeout_secs must be an integer, got 2\.5"):
        Triton(config=TritonConfig(exit_timeout_secs=2.5))


def test_entering_the_context_starts_the_server_as_0_7_does():
    """nvidia-pytriton 0.7 launches tritonserver in __enter__ (it printed its startup log before any bind)."""
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        assert triton.is_connected() and triton.is_alive()
        assert request(triton.http_port, "GET", "/v2/health/ready")[0] == 200
        _bind_identity(triton)  # models bound while serving are served at once
        assert request(triton.http_port, "GET", "/v2/models/identity/ready")[0] == 200
        triton.run()  # already serving: nothing changes
        triton.connect()
    assert not triton.is_connected() and not triton.is_alive()


def test_launch_on_startup_false_waits_for_run():
    policy = TritonLifecyclePolicy(launch_triton_on_startup=False)
    config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)
    with Triton(config=config, triton_lifecycle_policy=policy) as triton:
        assert triton.http_port is None and not triton.is_connected() and not triton.is_alive()
        with pytest.raises(TimeoutError, match="not running"):
            triton.connect()
        _bind_identity(triton)
        triton.run()
        assert triton.is_connected() and request(triton.http_port, "GET", "/v2/models/identity/ready")[0] == 200
    assert triton.stop() is False  # __exit__ stopped it already


def test_vertex_ai_servers_wait_for_run_by_default(monkeypatch):
    monkeypatch.delenv("AIP_MODE", raising=False)
    config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, allow_vertex_ai=True, vertex_ai_port=0)
    with Triton(config=config) as triton:
        assert triton.http_port is None and not triton.is_connected()


def test_stop_says_whether_it_stopped_a_running_server():
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    triton.run()
    assert triton.stop() is True and triton.stop() is False
    with pytest.raises(PyTritonInvalidOperationError):
        triton.connect()


def test_stop_before_run_changes_nothing():
    """0.7's stop() of a server never started returns False and does nothing: it can still bind and run."""
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    assert triton.stop() is False
    with pytest.raises(TimeoutError):
        triton.connect()
    _bind_identity(triton)
    triton.run()
    try:
        status, document = post_json(
            triton.http_port,
            "/v2/models/identity/infer",
            {"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [3]}]},
        )
        assert status == 200 and document["outputs"][0]["data"] == [3]
    finally:
        assert triton.stop() is True


def test_a_stop_asked_while_another_drains_returns_once_the_server_stopped() -> None:
    # It returned False at once, while the first stop still waited for the request: serve() returned with it (a
    # stop() from a watchdog thread), and a program that then exited cut the drain off.
    entered, gate = threading.Event(), threading.Event()

    def held(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        entered.set()
        gate.wait(30)
        return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]

    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, exit_timeout_secs=60))
    triton.bind("held", held, [Tensor(dtype=np.float32, shape=(-1,))], [Tensor(dtype=np.float32, shape=(-1,))])
    triton.run()
    port = triton.http_port
    assert port is not None
    answers: List[Any] = []
    body = {"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [3]}]}
    client = threading.Thread(target=lambda: answers.append(post_json(port, "/v2/models/held/infer", body)))
    client.start()
    assert entered.wait(30)
    first = threading.Thread(target=triton.stop)
    first.start()
    while triton.is_alive():  # the first stop has begun
        time.sleep(0.01)
    threading.Timer(1.0, gate.set).start()
    assert triton.stop() is False
    # It returned once the drain had ended, which the held request's release (the timer's) comes before.
    assert gate.is_set() and triton._finished.is_set()
    first.join(30)
    client.join(30)
    assert answers and answers[0][0] == 200


def test_a_server_never_started_lets_its_loop_go_with_it() -> None:
    # stop() before run() leaves it runnable (0.7), so it no longer ends the loop's thread: the object's end does.
    def loops() -> int:
        return sum(thread.name == "pytriton-loop" for thread in threading.enumerate())

    before = loops()
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    assert loops() == before + 1
    assert triton.stop() is False
    del triton
    gc.collect()
    assert loops() == before


@pytest.mark.parametrize("caller", ["callable", "async callable", "route", "async route"])
def test_stop_called_while_serving_a_request_answers_it_then_stops(caller: str) -> None:
    # stop() waits for the requests in flight: called from a callable or a route handler it waited for its own
    # request until exit_timeout_secs cut it off (503), and from an async one it held the event loop itself
    # until the stop's own deadline. It now returns at once; the request is answered, then the server stops.
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, exit_timeout_secs=300))
    returned: List[bool] = []

    def stop_then(answer: Any) -> Any:
        returned.append(triton.stop())
        return answer

    def stops(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return stop_then([{"OUTPUT_1": request["INPUT_1"]} for request in requests])

    async def stops_async(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return stops(requests)

    async def route_async(request: Any) -> Any:
        return stop_then("bye")

    io = {"inputs": [Tensor(dtype=np.float32, shape=(-1,))], "outputs": [Tensor(dtype=np.float32, shape=(-1,))]}
    triton.bind("stops", stops if caller == "callable" else stops_async, **io)
    triton.add_route("/stop", (lambda request: stop_then("bye")) if caller == "route" else route_async, ["GET"])
    triton.run()
    port = triton.http_port
    assert port is not None
    if caller.endswith("route"):
        assert request(port, "GET", "/stop")[::2] == (200, b"bye")
    else:
        body = {"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [3]}]}
        status, document = post_json(port, "/v2/models/stops/infer", body)
        assert status == 200 and document["outputs"][0]["data"] == [3]
    assert returned == [True]
    assert triton._finished.wait(30), "the server did not stop"
    assert not triton.is_alive() and triton.stop() is False


@pytest.mark.parametrize("period", [{"monitoring_period_s": 0.05}, {"monitoring_period_sec": 0.05}, {}])
def test_serve_takes_0_7s_and_the_seeds_period_names(period):
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    thread = threading.Thread(target=triton.serve, kwargs=period)
    thread.start()
    deadline = time.monotonic() + 10
    while not triton.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert triton.is_connected()
    assert triton.stop() is True
    thread.join(10)
    assert not thread.is_alive()


def test_serve_in_a_thread_returns_on_stop():
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    _bind_identity(triton)
    thread = threading.Thread(target=triton.serve, kwargs={"monitoring_period_sec": 0.05})
    thread.start()
    deadline = time.monotonic() + 10
    while triton.http_port is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert request(triton.http_port, "GET", "/v2/health/live")[0] == 200
    triton._runtime.stopped.set()
    thread.join(10)
    assert not thread.is_alive() and not triton.is_alive()


def test_no_thread_keeps_the_process_alive(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading, numpy as np
            from pytriton.model_config import Tensor
            from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy
            never = threading.Event()
            def hang(requests):
                never.wait()
            config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, exit_timeout_secs=1)
            triton = Triton(config=config)
            tensor = [Tensor(dtype=np.float32, shape=(1,))]
            triton.bind("m", hang, inputs=tensor, outputs=tensor)
            triton.run()
            import http.client, json
            c = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=0.5)
            try:
                one = {"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]}
                c.request("POST", "/v2/models/m/infer", json.dumps({"inputs": [one]}))
                c.getresponse()
            except Exception:
                pass
            triton.stop()
            print("stopped")
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    finished = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30, env=env)
    assert finished.returncode == 0 and finished.stdout.strip() == "stopped"


EXIT_HEAP = """
    import atexit, gc, signal, sys
    import numpy as np
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    # Registered before the server's own handlers, so it runs after them: what the interpreter's last
    # collections will find.
    atexit.register(lambda: print(f"at exit: {gc.get_freeze_count()} frozen, {len(gc.get_objects())} not", flush=True))
    tensor = [Tensor(dtype=np.float32, shape=(1,))]
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        triton.bind("m", lambda requests: requests, inputs=tensor, outputs=tensor)
        if sys.argv[1] == "serve":
            triton.serve()
        else:
            triton.run()
            triton.stop()
"""


@pytest.mark.parametrize("how", ["serve", "stop"])
def test_the_heap_is_frozen_again_when_the_process_exits_after_the_stop(tmp_path, how):
    # stop() gives the heap frozen at start back to the collector; a process that then exits paid for it:
    # the interpreter's last collections walked all of it (with torch imported the process lingered 1.2-1.8 s
    # after "stopped"). At exit the heap is frozen again, and they skip it.
    with ServerProcess.script(tmp_path, EXIT_HEAP, how) as server:
        server.wait_started()
        if how == "serve":
            server.signal(signal.SIGINT)
        server.wait_for(r"INFO pytriton: stopped \(")
        frozen, not_frozen = map(int, server.wait_for(r"^at exit: (\d+) frozen, (\d+) not$").groups())
        assert server.wait() == 0
    assert frozen > 10_000 and not_frozen < frozen / 10  # numpy and pytriton alone: ~40,000 objects


def test_server_id_names_the_server_and_readiness_is_strict_by_default():
    from tests.http_helpers import get_json

    with Triton(config=TritonConfig(id="my-server", http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        _bind_identity(triton)
        triton.run()
        assert get_json(triton.http_port, "/v2")[1]["name"] == "my-server"
        token = {"triton-access-token": triton.get_access_token() or ""}
        # Strict: not ready while a model is (tests/test_model_control.py holds one UNLOADING); an unloaded one
        # counts no more, as in tritonserver 2.51, once its unload has ended.
        assert request(triton.http_port, "POST", "/v2/repository/models/identity/unload", headers=token)[0] == 200
        deadline = time.monotonic() + 10
        while request(triton.http_port, "GET", "/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert request(triton.http_port, "POST", "/v2/repository/models/identity/load", headers=token)[0] == 200
        assert request(triton.http_port, "GET", "/v2/health/ready")[0] == 200


def test_list_option_from_one_environment_variable_is_one_entry(monkeypatch):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG", "local,size=1048576")
    assert TritonConfig.from_env().cache_config == ["local,size=1048576"]


def test_response_cache_without_cache_config_warns(caplog):
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        tensor = [Tensor(dtype=np.float32, shape=(-1,))]
        triton.bind("cached", _identity, tensor, tensor, config=ModelConfig(response_cache=True))
    assert "no cache is configured" in caplog.text


def test_a_batcher_on_a_model_that_does_not_batch_is_warned_of(caplog):
    # 0.7 writes no dynamic_batching for batching=False: the batcher's settings are dropped, here with a warning
    batcher = DynamicBatcher(
        priority_levels=2, default_priority_level=1, default_queue_policy=QueuePolicy(max_queue_size=1)
    )
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
        tensor = [Tensor(dtype=np.float32, shape=(-1,))]
        triton.bind("plain", _identity, tensor, tensor, config=ModelConfig(batching=False))
        triton.bind("no_batcher", _identity, tensor, tensor, config=ModelConfig(batching=False, batcher=None))
        assert "ModelConfig.batcher" not in caplog.text
        triton.bind("queued", _identity, tensor, tensor, config=ModelConfig(batching=False, batcher=batcher))
        status, _, body = request(triton.http_port, "GET", "/v2/models/queued/config")
    assert "model 'queued': ModelConfig.batcher has no effect because batching=False" in caplog.text
    assert status == 200 and b"dynamic_batching" not in body


def test_triton_config_takes_keywords_only_as_0_7s_does():
    with pytest.raises(TypeError, match="TritonConfig initialization can't be used with positional arguments"):
        TritonConfig(None)  # type: ignore[misc]
    assert TritonConfig(http_port=5).http_port == 5


class _Holder:
    """A model object that holds something large (weights, inputs it keeps)."""

    def __call__(self, requests):
        return [{"y": r["x"]} for r in requests]


def test_a_stopped_server_lets_its_models_go_though_one_of_them_is_a_module_function():
    # Binding gives each callable the server's context (decorators read their model config from it), and the
    # context held every callable bound to the server: a module-level function bound beside a model object kept
    # the object, and what it held (its weights, the shared memory of inputs it kept), until the process ended.
    holder = _Holder()
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    _bind_identity(triton)  # a module-level function: alive as long as the module
    triton.bind(
        "held",
        holder,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
    )
    triton.run()
    assert post_json(triton.http_port, "/v2/models/held/infer", _body(1.0))[0] == 200
    triton.stop()
    gone = weakref.ref(holder)
    del holder, triton
    gc.collect()
    assert gone() is None


EXIT_WITH_A_REQUEST_IN_FLIGHT = """
    import os, sys, threading, time
    import numpy as np
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    called = threading.Event()

    def slow(requests):
        called.set()
        time.sleep(2)  # main returns meanwhile
        return [{"y": request["x"] * 3} for request in requests]

    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    tensor = [Tensor(name="x", dtype=np.float32, shape=(1,))]
    triton.bind("m", slow, inputs=tensor, outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))])
    triton.run()
    if os.fork() == 0:  # a worker forked from the server's process (gunicorn --preload) exits: not the server's end
        sys.exit(0)
    os.wait()
    print("PORT", triton.http_port, flush=True)
    called.wait()
    print("MAIN RETURNS", flush=True)
"""


def test_a_server_running_at_exit_answers_its_requests_in_flight(tmp_path: Path) -> None:
    # A script that returned with the server running (run(), no stop()) ended it with the process: the requests in
    # flight were cut off (the client's connection closed unanswered). As nvidia-pytriton 0.7, the server stops at
    # exit as stop() stops it; a forked child's exit does not stop it.
    answers: List[Any] = []
    with ServerProcess.script(tmp_path, EXIT_WITH_A_REQUEST_IN_FLIGHT) as server:
        port = int(server.wait_for(r"^PORT (\d+)$").group(1))
        one = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [2]}
        client = threading.Thread(
            target=lambda: answers.append(post_json(port, "/v2/models/m/infer", {"inputs": [one]}))
        )
        client.start()
        server.wait_for("^MAIN RETURNS$")
        client.join(30)
        assert server.wait() == 0, server.output()
    assert answers and answers[0][0] == 200, (answers, server.output())
    assert answers[0][1]["outputs"][0]["data"] == [6.0]
    assert sum(" INFO pytriton: stopped (" in line for line in server.lines) == 1, server.output()


FORKED_CHILD_BINDS = """
    import faulthandler, os, warnings
    import numpy as np
    from pytriton.exceptions import PyTritonInvalidOperationError
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    tensor = [Tensor(name="x", dtype=np.float32, shape=(1,))]
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    triton.bind("m", lambda requests: requests, inputs=tensor, outputs=tensor)
    triton.run()
    # Python 3.12+ warns of fork() in a threaded process, on stderr: into the middle of the child's lines at times.
    warnings.simplefilter("ignore", DeprecationWarning)
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(20, exit=True)  # a bind that waits for good: status 1
        print("CHILD ALIVE", triton.is_alive(), flush=True)
        try:
            triton.bind("n", lambda requests: requests, inputs=tensor, outputs=tensor)
        except PyTritonInvalidOperationError as error:
            print("CHILD REFUSED", error, flush=True)
        os._exit(0)
    print("CHILD STATUS", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    print("PARENT ALIVE", triton.is_alive(), flush=True)
    triton.stop()
"""


def test_a_forked_child_is_told_the_server_is_its_parents(tmp_path: Path) -> None:
    # In a process forked from the server's (gunicorn --preload, multiprocessing's fork), the server's event loop
    # is not there: is_alive() said True, and bind() waited for that loop for good.
    with ServerProcess.script(tmp_path, FORKED_CHILD_BINDS) as server:
        assert server.wait() == 0, server.output()
    output = server.output()
    assert "CHILD ALIVE False" in output and "CHILD STATUS 0" in output and "PARENT ALIVE True" in output, output
    assert re.search(
        r"CHILD REFUSED The Triton server runs in process \d+, and this process \(\d+\) was forked", output
    )


STOP_FROM_A_SIGNAL_HANDLER_DURING_STOP = """
    import http.client, json, os, signal, sys, threading, time
    import numpy as np
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    called = threading.Event()

    def stops_the_server(requests):
        called.set()
        while triton.is_alive():  # until main's stop() is under way
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread, in that stop()
        return requests

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", triton.http_port)
        one = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [2]}
        connection.request("POST", "/v2/models/m/infer", json.dumps({"inputs": [one]}))
        sys.stdout.write(f"CLIENT {connection.getresponse().status}\\n")  # one write: the log shares the pipe

    tensor = [Tensor(name="x", dtype=np.float32, shape=(1,))]
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))
    triton.bind("m", stops_the_server, inputs=tensor, outputs=tensor)
    triton.run()
    signal.signal(signal.SIGTERM, lambda *_: sys.stdout.write(f"HANDLER STOP {triton.stop()}\\n"))
    thread = threading.Thread(target=client)
    thread.start()
    called.wait()
    sys.stdout.write(f"MAIN STOP {triton.stop()}\\n")
    thread.join()
"""


def test_stop_from_a_signal_handler_that_interrupted_a_stop(tmp_path: Path) -> None:
    # A SIGTERM handler of the application's that calls stop() (run() serves, the main thread goes on), run while
    # the main thread was in stop() draining: the handler's stop() waited for that stop, which could not go on
    # until the handler returned, and the process hung for good. nvidia-pytriton 0.7 returns False there.
    with ServerProcess.script(tmp_path, STOP_FROM_A_SIGNAL_HANDLER_DURING_STOP) as server:
        assert server.wait() == 0, server.output()
    said = sorted(line for line in server.lines if line.startswith(("HANDLER", "CLIENT", "MAIN")))
    assert said == ["CLIENT 200", "HANDLER STOP False", "MAIN STOP True"], server.output()
