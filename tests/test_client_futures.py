"""FuturesModelClient against a real server of this project, over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import threading

import numpy as np
import pytest

from pytriton.client import FuturesModelClient
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from tests.test_client_support import WAIT_S, Gate, floats

pytest_plugins = ["tests.test_client_support"]


def test_results_come_back_in_futures(client_url: str) -> None:
    with FuturesModelClient(client_url, "add_sub", max_workers=3) as client:
        assert client.wait_for_model(WAIT_S).result(WAIT_S) is None
        config = client.model_config().result(WAIT_S)
        samples = [client.infer_sample(floats(i), floats(1)) for i in range(12)]
        batch = client.infer_batch(a=np.ones((3, 1), np.float32), b=np.ones((3, 1), np.float32))
        assert all(isinstance(future, concurrent.futures.Future) for future in samples)
        assert [future.result(WAIT_S)["sum"].tolist() for future in samples] == [[i + 1.0] for i in range(12)]
        assert batch.result(WAIT_S)["sum"].tolist() == [[2.0], [2.0], [2.0]]
    assert config.max_batch_size == 8


def test_bytes_parameters_and_headers(client_url: str) -> None:
    with FuturesModelClient(client_url, "params") as client:
        future = client.infer_sample(floats(1), parameters={"k": "v"}, headers={"x-test-k": "h"})
        assert json.loads(future.result(WAIT_S)["params"][0]) == {"k": "v", "x-test-k": "h"}
    with FuturesModelClient(client_url, "shout") as client:
        assert client.infer_sample(text=np.array([b"a"], dtype=object)).result(WAIT_S)["text"].tolist() == [b"A!"]


def test_errors_come_back_in_futures(client_url: str, slow_gate: Gate) -> None:
    with FuturesModelClient(client_url, "fail") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="the model says no"):
            client.infer_sample(x=floats(1)).result(WAIT_S)
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample(floats(1), x=floats(1)).result(WAIT_S)
    with FuturesModelClient(client_url, "slow", inference_timeout_s=0.3) as client:
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(x=floats(1)).result(WAIT_S)
        slow_gate.release()
    with FuturesModelClient(client_url, "missing", init_timeout_s=0.3) as client:
        with pytest.raises(PyTritonClientTimeoutError):
            client.wait_for_model(0.2).result(WAIT_S)


def test_queue_full(client_url: str, queue_gate: Gate) -> None:
    with FuturesModelClient(client_url, "queue", max_workers=5) as client:
        first = client.infer_sample(x=floats(0))
        assert queue_gate.entered.wait(WAIT_S)
        others = [client.infer_sample(x=floats(i)) for i in range(1, 5)]
        refused = []
        for future in concurrent.futures.as_completed(others, timeout=WAIT_S):
            refused.append(future.exception())
            if len(refused) == 3:
                break
        queue_gate.release()
        assert first.result(WAIT_S)["y"].tolist() == [0]
        concurrent.futures.wait(others, timeout=WAIT_S)
    assert all(isinstance(error, PyTritonClientQueueFullError) for error in refused)
    assert sum(future.exception() is None for future in others) == 1


def test_close_refuses_new_calls_and_finishes_queued_ones(client_url: str, slow_gate: Gate) -> None:
    client = FuturesModelClient(client_url, "slow")
    pending = client.infer_sample(x=floats(7))
    assert slow_gate.entered.wait(WAIT_S)
    client.close(wait=False)
    with pytest.raises(PyTritonClientClosedError, match=r"^FutureModelClient is already closed$"):  # 0.7's words
        client.infer_sample(x=floats(1))
    with pytest.raises(PyTritonClientClosedError):
        client.model_config()
    assert not pending.done()
    slow_gate.release()
    assert pending.result(WAIT_S)["y"].tolist() == [7]


def test_close_waits_for_running_calls(client_url: str, slow_gate: Gate) -> None:
    client = FuturesModelClient(client_url, "slow")
    pending = client.infer_sample(x=floats(3))
    assert slow_gate.entered.wait(WAIT_S)
    closing = threading.Thread(target=client.close)
    closing.start()
    closing.join(0.1)
    assert closing.is_alive(), "close() returned while a call was running"
    slow_gate.release()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    assert pending.done()
    assert pending.result(0)["y"].tolist() == [3]


def test_max_workers_must_be_positive(client_url: str) -> None:
    with pytest.raises(ValueError):
        FuturesModelClient(client_url, "add_sub", max_workers=0)
