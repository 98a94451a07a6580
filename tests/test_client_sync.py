"""ModelClient against a real server of this project, over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np
import pytest

from pytriton.client import ModelClient
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from tests.server_process import ServerProcess, free_port_env
from tests.tcp_table import established
from tests.test_client_support import HELD_TIMEOUT_S, WAIT_S, ClientServer, Gate, floats

pytest_plugins = ["tests.test_client_support"]


def test_infer_sample_adds_and_strips_the_batch_axis(client_url: str) -> None:
    with ModelClient(client_url, "add_sub") as client:
        positional = client.infer_sample(floats(1, 2, 3), floats(1, 1, 1))
        named = client.infer_sample(b=floats(1, 1, 1), a=floats(1, 2, 3))
    for result in (positional, named):
        np.testing.assert_array_equal(result["sum"], floats(2, 3, 4))
        np.testing.assert_array_equal(result["diff"], floats(0, 1, 2))
        assert result["sum"].shape == (3,)


def test_infer_batch_keeps_the_batch_axis(client_url: str) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ModelClient(client_url, "add_sub") as client:
        result = client.infer_batch(a=a, b=np.ones_like(a))
    np.testing.assert_array_equal(result["sum"], a + 1)
    np.testing.assert_array_equal(result["diff"], a - 1)


def test_bytes_and_object_arrays(client_url: str) -> None:
    with ModelClient(client_url, "shout") as client:
        from_objects = client.infer_sample(text=np.array([b"hi", b"there"], dtype=object))
        from_bytes = client.infer_batch(text=np.array([[b"a"], [b"bc"]], dtype=np.bytes_))
    assert from_objects["text"].tolist() == [b"HI!", b"THERE!"]
    assert from_bytes["text"].tolist() == [[b"A!"], [b"BC!"]]


def test_parameters_and_matching_headers_reach_the_model(client_url: str) -> None:
    parameters: Dict[str, object] = {"text": "value", "number": 7, "flag": True}
    headers: Dict[str, object] = {"x-test-header": "forwarded", "other-header": "not forwarded"}
    with ModelClient(client_url, "params") as client:
        result = client.infer_sample(floats(1), parameters=parameters, headers=headers)  # type: ignore[arg-type]
    received = json.loads(result["params"][0])
    assert received == {"text": "value", "number": 7, "flag": True, "x-test-header": "forwarded"}


def test_model_without_batching(client_url: str) -> None:
    with ModelClient(client_url, "double") as client:
        assert not client.is_batching_supported
        result = client.infer_sample(x=floats(1, 2))
        np.testing.assert_array_equal(result["y"], floats(2, 4))
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(x=floats(1, 2))


def test_model_config(client_url: str) -> None:
    with ModelClient(client_url, "add_sub", lazy_init=False) as client:
        config = client.model_config
        assert client.is_batching_supported
    assert config.max_batch_size == 8
    assert not config.decoupled
    assert config.inputs is not None and config.outputs is not None
    assert [(spec.name, spec.shape, spec.dtype) for spec in config.inputs] == [
        ("a", (-1,), np.float32),
        ("b", (-1,), np.float32),
    ]
    assert [spec.name for spec in config.outputs] == ["sum", "diff"]
    with ModelClient(client_url, "stream") as client:
        assert client.model_config.decoupled


def test_wait_for_server_and_model(client_url: str) -> None:
    with ModelClient(client_url, "add_sub") as client:
        client.wait_for_server(WAIT_S)
        client.wait_for_model(WAIT_S)


def test_inference_timeout_then_the_client_recovers(client_url: str, slow_gate: Gate) -> None:
    with ModelClient(client_url, "slow", inference_timeout_s=HELD_TIMEOUT_S) as client:
        with pytest.raises(PyTritonClientTimeoutError) as timed_out:
            client.infer_sample(x=floats(1))
        # nvidia-pytriton 0.7's words: over HTTP the socket's "timed out" follows the timeout with no full stop
        said = "s. Message: Deadline Exceeded" if client_url.startswith("grpc") else "s Message: timed out"
        assert str(timed_out.value) == f"Timeout occurred during inference request. Timeout: {HELD_TIMEOUT_S} {said}"
        slow_gate.release()
        np.testing.assert_array_equal(client.infer_sample(x=floats(5))["y"], floats(5))


def test_unknown_model_times_out(client_url: str) -> None:
    not_ready = r"^Waiting for model missing/<latest> to be ready timed out\.$"  # 0.7's words
    with ModelClient(client_url, "missing", init_timeout_s=0.3) as client:
        with pytest.raises(PyTritonClientTimeoutError, match=not_ready):
            client.infer_sample(x=floats(1))
        with pytest.raises(PyTritonClientTimeoutError, match=not_ready):
            client.wait_for_model(0.2)
    with pytest.raises(PyTritonClientTimeoutError):
        ModelClient(client_url, "missing", lazy_init=False, init_timeout_s=0.2)


def test_model_error_keeps_the_message(client_url: str) -> None:
    with ModelClient(client_url, "fail") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="the model says no"):
            client.infer_sample(x=floats(1))


def test_queue_full(client_url: str, queue_gate: Gate) -> None:
    def infer(value: float) -> Dict[str, np.ndarray]:
        with ModelClient(client_url, "queue") as client:
            return client.infer_sample(x=floats(value))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        first = pool.submit(infer, 0)
        assert queue_gate.entered.wait(WAIT_S)
        others = [pool.submit(infer, value) for value in range(1, 5)]
        outcomes = _first_failures(others, count=3)
        queue_gate.release()
        assert first.result(WAIT_S)["y"].tolist() == [0]
        errors = [future.exception(WAIT_S) for future in others]
    assert all(isinstance(error, PyTritonClientQueueFullError) for error in outcomes)
    assert sum(isinstance(error, PyTritonClientQueueFullError) for error in errors) == 3
    # 0.7 raises every error the server answers as PyTritonClientInferenceServerError, this one too, in its words
    assert all(isinstance(error, PyTritonClientInferenceServerError) for error in outcomes)
    worded = re.compile(
        r"Error occurred during inference request\. Message: (\[request id: \d+\] )?Exceeds maximum queue size"
    )
    assert all(worded.fullmatch(str(error)) for error in outcomes)
    assert sum(error is None for error in errors) == 1


def _first_failures(futures: Sequence[concurrent.futures.Future[Any]], count: int) -> List[BaseException]:
    """The errors of the first `count` futures to finish (the refused ones, while the model is held)."""
    finished = []
    for future in concurrent.futures.as_completed(futures, timeout=WAIT_S):
        error = future.exception()
        assert error is not None, "a request finished while the model was held"
        finished.append(error)
        if len(finished) == count:
            return finished
    raise AssertionError("not enough requests were refused")


def test_use_after_close(client_url: str) -> None:
    client = ModelClient(client_url, "add_sub")
    client.close()
    client.close()
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(floats(1), floats(1))
    with pytest.raises(PyTritonClientClosedError):
        _ = client.model_config
    with pytest.raises(PyTritonClientClosedError):
        client.wait_for_model(1.0)
    with ModelClient(client_url, "add_sub") as used:
        used.infer_sample(floats(1), floats(1))
    with pytest.raises(PyTritonClientClosedError):
        used.infer_batch(floats(1)[None], floats(1)[None])


def test_argument_errors(client_url: str) -> None:
    with ModelClient(client_url, "add_sub") as client:
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample(floats(1), b=floats(1))
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample()
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample(floats(1), floats(1), parameters={"bad": 1.5})  # type: ignore[dict-item]
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample(floats(1), floats(1), headers={"bad": None})  # type: ignore[dict-item]
        with pytest.raises(PyTritonClientValueError, match="Unicode"):
            client.infer_sample(np.array(["a"]), np.array(["b"]))
        # An extra positional input is dropped (with a warning), as nvidia-pytriton drops it.
        assert set(client.infer_sample(floats(1), floats(1), floats(1))) == {"sum", "diff"}


def test_decoupled_model_is_refused(client_url: str) -> None:
    with ModelClient(client_url, "stream") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="DecoupledModelClient"):
            client.infer_sample(x=floats(1))


def test_url_without_scheme_means_http(client_server: ClientServer) -> None:
    with ModelClient(f"127.0.0.1:{client_server.triton.http_port}", "double") as client:
        np.testing.assert_array_equal(client.infer_sample(x=floats(3))["y"], floats(6))


def test_errors_are_client_errors(client_url: str) -> None:
    with ModelClient(client_url, "fail") as client:
        with pytest.raises(PyTritonClientError):
            client.infer_sample(x=floats(1))


def test_threads_may_share_a_client(client_url: str) -> None:
    # Over HTTP, tritonclient's sockets belong to the thread that opened them: a client used by one thread,
    # then by others, failed with greenlet.error ("Cannot switch to a different thread") or hung.
    results: Dict[int, Any] = {}

    def infer(first: int) -> None:
        for n in range(first, first + 10):
            try:
                results[n] = client.infer_sample(floats(n), floats(1))["sum"].tolist()
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                results[n] = repr(error)

    with ModelClient(client_url, "add_sub") as client:
        assert client.infer_sample(floats(1), floats(2))["sum"].tolist() == [3.0]
        threads = [threading.Thread(target=infer, args=(first,), daemon=True) for first in range(0, 40, 10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert not any(thread.is_alive() for thread in threads), "calls from other threads hung"
        assert results == {n: [n + 1.0] for n in range(40)}
        assert client.infer_sample(floats(1), floats(2))["sum"].tolist() == [3.0]  # the first thread's again


# argv[1]: the server's HTTP URL. The parent calls the server, then forks two children which call it with a
# client they inherited (a module-level client under gunicorn --preload) and one which makes a client of its
# own; each child's exit status is its number of wrong answers (99: a call failed, 1: it hung).
FORKING_CLIENT = """
    import faulthandler, os, sys
    import numpy as np
    from pytriton.client import ModelClient

    url = sys.argv[1]
    inherited = ModelClient(url, "add_sub")

    def child(index, make_client):
        faulthandler.dump_traceback_later(20, exit=True)
        try:
            client = make_client()
            values = np.arange(200, dtype=np.float32) + 1000 * index
            wrong = sum(client.infer_sample(np.array([v]), np.array([1.0], np.float32))["sum"][0] != v + 1
                        for v in values)
        except BaseException as error:
            print("child failed:", repr(error), flush=True)
            os._exit(99)
        os._exit(min(int(wrong), 97))

    assert inherited.infer_sample(np.array([1.0], np.float32), np.array([2.0], np.float32))["sum"].tolist() == [3.0]
    children = []
    for index, make_client in enumerate((lambda: inherited, lambda: inherited, lambda: ModelClient(url, "add_sub"))):
        pid = os.fork()
        if pid == 0:
            child(index, make_client)
        children.append(pid)
    print("STATUSES", [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children], flush=True)
    assert inherited.infer_sample(np.array([1.0], np.float32), np.array([2.0], np.float32))["sum"].tolist() == [3.0]
    inherited.close()
"""


def test_forked_children_call_over_connections_of_their_own(client_server: ClientServer, tmp_path: Path) -> None:
    # A child forked after its parent used a ModelClient over HTTP (gunicorn --preload, multiprocessing's fork
    # start method) sent over the parent's connections: two such children read each other's answers (a result for
    # another input, nothing raised), and a client made in the child waited forever on gevent's resolver, whose
    # threads were the parent's. nvidia-pytriton 0.7 does both.
    with ServerProcess.script(tmp_path, FORKING_CLIENT, client_server.url("http"), env=free_port_env()) as process:
        assert process.wait(timeout=WAIT_S * 2) == 0, process.output()
    assert process.wait_for("^STATUSES ").string == "STATUSES [0, 0, 0]", process.output()


def test_a_thread_that_ends_closes_its_connections(client_server: ClientServer) -> None:
    # Each thread sharing a ModelClient over HTTP gets tritonclient clients of its own; they were kept until the
    # ModelClient closed, so a program that started a thread per call (a threaded web server) held a connection
    # per thread it ever ran, until it ran out of descriptors.
    port = client_server.triton.http_port
    assert port is not None
    answers: List[Any] = []
    with ModelClient(client_server.url("http"), "add_sub") as client:
        client.infer_sample(floats(1), floats(2))
        before = established("self", port, served=False)
        for n in range(20):
            thread = threading.Thread(target=lambda n=n: answers.append(client.infer_sample(floats(n), floats(1))))
            thread.start()
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert [answer["sum"].tolist() for answer in answers] == [[n + 1.0] for n in range(20)]
        assert established("self", port, served=False) <= before + 2
        assert client.infer_sample(floats(1), floats(2))["sum"].tolist() == [3.0]
