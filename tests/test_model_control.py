"""Live model control: a load with a config override binds a model again, as Triton's model repository API does.

The first two tests do what Triton's own simple_http_model_control.py and simple_grpc_model_control.py do (and
assert what they assert), against a stand-in "simple" model bound with the API.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.decorators import batch, get_model_config
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, EnsembleStep, ModelConfig, SequenceBatcher, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.http_helpers import request
from tests.pids import alive, started_at

SIMPLE_INPUTS = [Tensor(name="INPUT0", dtype=np.int32, shape=(16,)), Tensor(name="INPUT1", dtype=np.int32, shape=(16,))]
SIMPLE_OUTPUTS = [
    Tensor(name="OUTPUT0", dtype=np.int32, shape=(16,)),
    Tensor(name="OUTPUT1", dtype=np.int32, shape=(16,)),
]
ECHO_INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
ECHO_OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


@batch
def simple(INPUT0: np.ndarray, INPUT1: np.ndarray) -> Dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


@batch
def slow_echo(x: np.ndarray) -> Dict[str, np.ndarray]:
    time.sleep(0.002)  # keeps requests in flight while the model is bound again
    return {"y": x}


def pid_echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Module level: process instances import it."""
    return [{"y": request["x"], "pid": np.array([os.getpid()], dtype=np.int64)} for request in requests]


def _bind_simple(count: int) -> Any:
    def bind(triton: Triton) -> None:
        triton.bind(
            "simple", simple, inputs=SIMPLE_INPUTS, outputs=SIMPLE_OUTPUTS, config=ModelConfig(max_batch_size=8)
        )
        for index in range(count - 1):
            triton.bind(
                f"other_{index}",
                slow_echo,
                inputs=ECHO_INPUTS,
                outputs=ECHO_OUTPUTS,
                config=ModelConfig(max_batch_size=8),
            )

    return bind


def _simple_inputs(module: Any, rows: int) -> List[Any]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(rows * 16, dtype=np.int32).reshape(rows, 16))
        tensors.append(tensor)
    return tensors


@pytest.mark.parametrize("frontends", [None, 3])
def test_http_does_what_tritons_simple_http_model_control_does(frontends: Optional[int]) -> None:
    with running_triton(_bind_simple(7), frontends=frontends) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        assert len(client.get_model_repository_index(headers=HTTP_AUTH)) == 7
        client.load_model("simple", headers=HTTP_AUTH)
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(
                "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}', headers=HTTP_AUTH
            )
        assert "failed to load" in raised.value.message()
        assert client.get_model_config("simple")["max_batch_size"] == 8  # a failed load leaves the model as it was
        client.load_model("simple", config='{"max_batch_size":"16"}', headers=HTTP_AUTH)
        assert client.get_model_config("simple")["max_batch_size"] == 16
        assert client.infer("simple", _simple_inputs(httpclient, 12)).as_numpy("OUTPUT0").shape == (12, 16)
        client.unload_model("simple", headers=HTTP_AUTH)
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("wrong_model_name", headers=HTTP_AUTH)
        assert raised.value.message() == "failed to load 'wrong_model_name', failed to poll from model repository"


@pytest.mark.parametrize("frontends", [None, 3])
def test_grpc_does_what_tritons_simple_grpc_model_control_does(frontends: Optional[int]) -> None:
    with running_triton(_bind_simple(8), frontends=frontends) as triton:
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        assert len(client.get_model_repository_index(headers=GRPC_AUTH).models) == 8
        client.load_model("simple", headers=GRPC_AUTH)
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(
                "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}', headers=GRPC_AUTH
            )
        assert "failed to load" in raised.value.message()
        client.load_model("simple", config='{"max_batch_size":"16"}', headers=GRPC_AUTH)
        assert client.get_model_config("simple").config.max_batch_size == 16
        assert client.infer("simple", _simple_inputs(grpcclient, 12)).as_numpy("OUTPUT1").shape == (12, 16)
        client.unload_model("simple", headers=GRPC_AUTH)
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"}, headers=GRPC_AUTH)
        assert raised.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in raised.value.message()
        assert "loads no model files" in raised.value.message()
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("wrong_model_name", headers=GRPC_AUTH)
        assert "failed to load" in raised.value.message()


def _load(triton: Triton, name: str, config: Any) -> Any:
    """POST .../load with a config override; (status, document)."""
    text = config if isinstance(config, str) else json.dumps(config)
    body = json.dumps({"parameters": {"config": text}}).encode()
    assert triton.http_port is not None
    status, _, answer = request(triton.http_port, "POST", f"/v2/repository/models/{name}/load", body, HTTP_AUTH)
    return status, json.loads(answer) if answer else None


def _config(triton: Triton, name: str) -> Dict[str, Any]:
    assert triton.http_port is not None
    status, _, answer = request(triton.http_port, "GET", f"/v2/models/{name}/config")
    assert status == 200
    document: Dict[str, Any] = json.loads(answer)
    return document


def _bind_echo(triton: Triton) -> None:
    batcher = DynamicBatcher(max_queue_delay_microseconds=100)
    triton.bind(
        "echo",
        [slow_echo, slow_echo],
        inputs=ECHO_INPUTS,
        outputs=ECHO_OUTPUTS,
        config=ModelConfig(max_batch_size=8, batcher=batcher),
    )


@pytest.fixture(scope="module")
def echo_server() -> Any:
    with running_triton(_bind_echo, cache_config=["local,size=1048576"]) as triton:
        yield triton


def test_an_override_changes_what_the_engine_can_change_and_a_plain_load_undoes_it(echo_server: Triton) -> None:
    override = {
        "max_batch_size": 32,
        "dynamic_batching": {"max_queue_delay_microseconds": "500", "preferred_batch_size": [4, 8]},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"mode": {"string_value": "fast"}},
        "response_cache": {"enable": True},
    }
    try:
        assert _load(echo_server, "echo", override) == (200, None)
        config = _config(echo_server, "echo")
        assert config["max_batch_size"] == 32
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
        assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
        assert config["instance_group"][0]["count"] == 1
        assert config["parameters"] == {"mode": {"string_value": "fast"}}
        assert config["response_cache"] == {"enable": True}
        client = httpclient.InferenceServerClient(http_url(echo_server))
        tensor = httpclient.InferInput("x", [20, 3], "FP32")
        tensor.set_data_from_numpy(np.ones((20, 3), np.float32))
        assert client.infer("echo", [tensor]).as_numpy("y").shape == (20, 3)
    finally:
        assert _load(echo_server, "echo", "{}") == (200, None)  # only what the override names changes
    assert _config(echo_server, "echo")["max_batch_size"] == 8
    client = httpclient.InferenceServerClient(http_url(echo_server))
    client.load_model("echo", headers=HTTP_AUTH)  # a load without an override undoes one (Triton keeps it)
    config = _config(echo_server, "echo")
    assert config["max_batch_size"] == 8 and config["instance_group"][0]["count"] == 2
    assert config["parameters"] == {} and "response_cache" not in config


def test_the_config_as_the_server_shows_it_goes_back_unchanged(echo_server: Triton) -> None:
    config = _config(echo_server, "echo")
    config["max_batch_size"] = 16
    try:
        assert _load(echo_server, "echo", config) == (200, None)
        assert _config(echo_server, "echo")["max_batch_size"] == 16
    finally:
        assert _load(echo_server, "echo", "{}")[0] == 200


def _sequence_sum(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's input added to its sequence's total so far: the total."""
    answers = []
    for one in requests:
        one.sequence_state["total"] = one.sequence_state.get("total", 0) + int(one["x"].sum())
        answers.append({"y": np.full(one["x"].shape, one.sequence_state["total"], np.float32)})
    return answers


def test_an_override_enabling_the_cache_of_a_sequence_model_is_refused_and_the_model_goes_on() -> None:
    # Triton refuses a model with a sequence batcher and the response cache (bind does too). A load's override
    # enabled it: the sequence's requests alike were then answered from the cache, its totals 5, 5, 5 for 5, 10, 15.
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher())
        triton.bind("summed", _sequence_sum, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)

    with running_triton(bind, cache_config=["local,size=1048576"]) as triton:
        status, document = _load(triton, "summed", {"response_cache": {"enable": True}})
        assert (status, document["error"]) == (
            500,
            "failed to load 'summed', failed to poll from model repository: Response Cache does not currently "
            "support model summed with sequence batching scheduler. Please disable the response cache.",
        )
        assert "response_cache" not in _config(triton, "summed")
        client = httpclient.InferenceServerClient(http_url(triton))
        totals = []
        for index in range(3):
            tensor = httpclient.InferInput("x", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), 5, np.float32))
            answer = client.infer("summed", [tensor], sequence_id=7, sequence_start=index == 0, sequence_end=index == 2)
            totals.append(answer.as_numpy("y").item())
        client.close()
    assert totals == [5, 10, 15]


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"input": [{"name": "z", "data_type": "TYPE_FP32", "dims": [-1]}]}, "'input' cannot change"),
        ({"output": []}, "'output' cannot change"),
        ({"model_transaction_policy": {"decoupled": True}}, "'model_transaction_policy' cannot change"),
        ({"max_batch_size": 0}, "'max_batch_size' cannot change from 8 to 0"),
        ({"instance_group": [{"count": 1, "kind": "KIND_GPU"}]}, "of kind KIND_GPU"),
        ({"instance_group": [{"count": 3}]}, "asks for 3 instances, but it was bound with 2 callables"),
        ({"sequence_batching": {}}, "'sequence_batching' cannot change"),
        ({"backend": "onnxruntime"}, "'backend' cannot change: pytriton cannot honour it"),
    ],
)
def test_a_field_that_cannot_change_is_refused_and_the_model_goes_on(
    echo_server: Triton, override: Dict[str, Any], words: str
) -> None:
    status, document = _load(echo_server, "echo", override)
    assert status == 400, document
    assert document["error"].startswith("failed to load 'echo' version 1: ") and words in document["error"]
    assert _config(echo_server, "echo")["max_batch_size"] == 8
    client = httpclient.InferenceServerClient(http_url(echo_server))
    assert client.is_model_ready("echo")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (
            {"max_batch_size": 2, "dynamic_batching": {"preferred_batch_size": [4]}},
            "'preferred_batch_size' 4 must be between 1 and max_batch_size (2)",
        ),
        ({"max_batch_size": -1}, "'max_batch_size' must be >= 0, got -1"),
        ({"name": "other"}, "unexpected directory name 'echo' for model 'other', directory name must equal model name"),
        ({"dynamic_batching": {"priority_levels": 2, "default_priority_level": 3}}, "default_priority_level"),
        (
            {"dynamic_batching": {"preserve_ordering": True, "priority_levels": 2, "default_priority_level": 1}},
            "Only one priority level is allowed when 'preserve_ordering' is true for echo",
        ),
        (
            {
                "dynamic_batching": {
                    "preserve_ordering": True,
                    "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 5},
                }
            },
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for echo",
        ),
    ],
)
def test_a_config_tritons_checks_refuse_fails_as_its_poll_does(
    echo_server: Triton, override: Dict[str, Any], words: str
) -> None:
    """tritonserver 2.51 refuses these as it polls the repository (measured: 500, `failed to load 'm', failed to
    poll from model repository`, the reason in its log only); the model goes on as it was."""
    status, document = _load(echo_server, "echo", override)
    assert status == 500, document
    prefix = "failed to load 'echo', failed to poll from model repository: "
    assert document["error"].startswith(prefix) and words in document["error"]
    grpc = grpcclient.InferenceServerClient(grpc_url(echo_server))
    with pytest.raises(InferenceServerException) as raised:
        grpc.load_model("echo", config=json.dumps(override), headers=GRPC_AUTH)
    assert raised.value.status() == "StatusCode.INTERNAL" and raised.value.message().startswith(prefix)
    assert _config(echo_server, "echo")["max_batch_size"] == 8
    assert httpclient.InferenceServerClient(http_url(echo_server)).is_model_ready("echo")


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"config": "{not json"}, "Invalid config override"),
        ({"config": '{"max_batch_size": "many"}'}, "Invalid config override"),
        ({"config": '{"no_such_field": 1}'}, "Invalid config override"),
        ({"file:1/model.py": "aW1wb3J0IG9z"}, "file override 'file:1/model.py' refused"),
    ],
)
def test_a_load_whose_parameters_cannot_be_read_fails_as_a_poll_does_in_triton(
    echo_server: Triton, parameters: Dict[str, Any], words: str
) -> None:
    body = json.dumps({"parameters": parameters}).encode()
    assert echo_server.http_port is not None
    status, _, answer = request(echo_server.http_port, "POST", "/v2/repository/models/echo/load", body, HTTP_AUTH)
    error = json.loads(answer)["error"]
    assert status == 500 and error.startswith("failed to load 'echo', failed to poll from model repository: ")
    assert words in error


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"parameters": {"config": 3}}, "attempt to access JSON non-string as string"),
        ({"parameters": {"other": True}}, "attempt to access JSON non-string as string"),
        ({"parameters": {"other": "x"}}, "unexpected error on creating Triton parameter"),
        ({"parameters": {"config": "{}", "other": "x"}}, "unexpected error on creating Triton parameter"),
        ({"parameters": 5}, "attempt to get members for non-object"),
        ({"parameters": None}, "attempt to get members for non-object"),
        ({"parameters": []}, "attempt to get members for non-object"),
        ([], None),  # no object, no parameters: a plain load
        ("config", None),
        ({"other": 1}, None),
    ],
)
def test_a_load_body_is_read_as_tritons_http_server_reads_it(
    echo_server: Triton, body: Any, error: Optional[str]
) -> None:
    assert echo_server.http_port is not None
    path = "/v2/repository/models/echo/load"
    status, headers, answer = request(echo_server.http_port, "POST", path, json.dumps(body), HTTP_AUTH)
    assert headers["content-type"] == "application/json"
    assert (status, json.loads(answer)["error"] if answer else None) == (500 if error else 200, error)


def test_the_response_cache_cannot_be_enabled_without_one_on_the_server() -> None:
    with running_triton(lambda triton: triton.bind("m", slow_echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS)) as triton:
        status, document = _load(triton, "m", {"response_cache": {"enable": True}})
        assert status == 400 and "the server has no response cache" in document["error"]


@pytest.mark.parametrize("frontends", [None, 3])
def test_no_request_is_lost_while_the_model_is_bound_again(frontends: Optional[int]) -> None:
    with running_triton(_bind_echo, frontends=frontends) as triton:
        stop = threading.Event()
        failures: List[str] = []
        served = [0] * 4

        def stream(worker: int) -> None:  # even workers over HTTP, odd ones over gRPC
            module: Any = httpclient if worker % 2 == 0 else grpcclient
            client = module.InferenceServerClient(http_url(triton) if worker % 2 == 0 else grpc_url(triton))
            data = np.full((2, 3), worker, np.float32)
            tensor = module.InferInput("x", [2, 3], "FP32")
            tensor.set_data_from_numpy(data)
            while not stop.is_set():
                try:
                    answer = client.infer("echo", [tensor]).as_numpy("y")
                    if not np.array_equal(answer, data):
                        failures.append(f"wrong answer {answer!r}")
                    served[worker] += 1
                except Exception as error:  # noqa: BLE001 - every failure is counted
                    failures.append(repr(error))

        threads = [threading.Thread(target=stream, args=(worker,)) for worker in range(4)]
        for thread in threads:
            thread.start()
        overrides = [
            {"instance_group": [{"count": 1}]},
            {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 2000}},
            {"instance_group": [{"count": 2}], "dynamic_batching": {}},
            {"max_batch_size": 4},
        ]
        loads = []
        try:
            before = sum(served)
            for _ in range(3):
                for override in overrides:
                    deadline = time.monotonic() + 60
                    while sum(served) < before + 5 and not failures:  # requests were served since the last load
                        assert time.monotonic() < deadline, "the model stopped answering"
                        time.sleep(0.001)
                    before = sum(served)
                    loads.append(_load(triton, "echo", override))
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert failures == []
        assert loads == [(200, None)] * 12
        assert _config(triton, "echo")["max_batch_size"] == 4


def test_statistics_start_again_with_the_new_binding_as_in_triton(echo_server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(echo_server))
    tensor = httpclient.InferInput("x", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    client.infer("echo", [tensor])
    stats = client.get_inference_statistics("echo", headers=HTTP_AUTH)["model_stats"][0]
    assert stats["inference_count"] >= 1
    try:
        assert _load(echo_server, "echo", {"max_batch_size": 4})[0] == 200
        stats = client.get_inference_statistics("echo", headers=HTTP_AUTH)["model_stats"][0]
        assert stats["inference_count"] == 0 and stats["execution_count"] == 0
    finally:
        client.load_model("echo", headers=HTTP_AUTH)


def test_unloaded_models_answer_in_tritons_words(echo_server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(echo_server))
    tensor = httpclient.InferInput("x", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    assert client.get_model_repository_index(headers=HTTP_AUTH) == [{"name": "echo", "version": "1", "state": "READY"}]
    client.unload_model("echo", headers=HTTP_AUTH)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("echo", [tensor])
        assert raised.value.message() == "Request for unknown model: 'echo' has no available versions"
        with pytest.raises(InferenceServerException) as raised:
            client.infer("echo", [tensor], model_version="1")
        assert raised.value.message() == "Request for unknown model: 'echo' version 1 is not at ready state"
        assert not client.is_model_ready("echo")
        assert (
            request(echo_server.http_port or 0, "GET", "/v2/models/echo/ready")[2]
            == b'{"error":"Model version not ready"}'
        )
        for path in ("/v2/models/echo", "/v2/models/echo/config"):
            status, _, answer = request(echo_server.http_port or 0, "GET", path)
            assert (status, json.loads(answer)) == (
                404,
                {"error": "Request for unknown model: 'echo' has no available versions"},
            )
        with pytest.raises(InferenceServerException, match="requested model 'echo' is not available"):
            client.get_inference_statistics("echo", headers=HTTP_AUTH)
        assert client.get_inference_statistics(headers=HTTP_AUTH) == {"model_stats": []}
        index = client.get_model_repository_index(headers=HTTP_AUTH)
        assert index == [{"name": "echo", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        client.unload_model("never_bound", headers=HTTP_AUTH)  # Triton answers an unknown model's unload with success
    finally:
        client.load_model("echo", headers=HTTP_AUTH)
    assert client.infer("echo", [tensor]).as_numpy("y").shape == (1, 3)


def _pids(triton: Triton, count: int) -> set:  # type: ignore[type-arg]
    """The pids that answer `count` requests sent at once."""
    client = httpclient.InferenceServerClient(http_url(triton), concurrency=count)
    tensor = httpclient.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    answers = [client.async_infer("m", [tensor]) for _ in range(count)]
    return {int(answer.get_result().as_numpy("pid")[0]) for answer in answers}


@pytest.mark.parametrize("frontends", [None, 3])
def test_process_instances_change_their_count_and_the_old_processes_stop(frontends: Optional[int]) -> None:
    outputs = [*ECHO_OUTPUTS, Tensor(name="pid", dtype=np.int64, shape=(1,))]

    def bind(triton: Triton) -> None:
        config = ModelConfig(batching=False)
        triton.bind("m", ProcessInstances(pid_echo, count=1), inputs=ECHO_INPUTS, outputs=outputs, config=config)

    with running_triton(bind, frontends=frontends) as triton:
        (old,) = _pids(triton, 1)
        old_started = started_at(old)
        assert _load(triton, "m", {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}) == (200, None)
        assert _config(triton, "m")["instance_group"][0]["count"] == 2
        new = _pids(triton, 1)
        assert old not in new
        deadline = time.monotonic() + 30
        while alive(old, old_started) and time.monotonic() < deadline:  # the old instance stops once idle
            time.sleep(0.05)
        assert not alive(old, old_started)


class Gate:
    """Echoes; a request of a negative x holds its call until the gate opens."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        if any(float(request["x"].ravel()[0]) < 0 for request in requests):
            self.entered.set()
            self.open.wait(30)
        return [{"y": request["x"]} for request in requests]


def _pending(triton: Triton) -> int:
    assert triton.metrics_port is not None
    _, _, body = request(triton.metrics_port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith('nv_inference_pending_request_count{model="m"'):
            return int(float(line.split()[-1]))
    raise AssertionError("no pending count for m")


def test_requests_held_by_the_old_binding_finish_there_while_the_new_one_serves() -> None:
    gate = Gate()
    with running_triton(
        lambda triton: triton.bind(
            "m", gate, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig(max_batch_size=8)
        )
    ) as triton:

        def send(value: float) -> Any:
            # A thread and a client of its own per call: tritonclient's async_infer sends from a greenlet that
            # runs only while this thread yields to gevent, which a threading wait does not do.
            def infer() -> Any:
                with httpclient.InferenceServerClient(http_url(triton)) as client:
                    tensor = httpclient.InferInput("x", [1, 1], "FP32")
                    tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
                    return client.infer("m", [tensor])

            return pool.submit(infer)

        pool = ThreadPoolExecutor(2)
        running = send(-1.0)  # held in the one instance of the old binding
        assert gate.entered.wait(30)
        queued = send(1.0)  # waits in the old binding's queue
        deadline = time.monotonic() + 30
        while _pending(triton) != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _pending(triton) == 1
        try:
            assert _load(triton, "m", {"max_batch_size": 4}) == (200, None)  # returns while the old one is busy
            fresh = httpclient.InferenceServerClient(http_url(triton))
            tensor = httpclient.InferInput("x", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), 2.0, np.float32))
            assert fresh.infer("m", [tensor]).as_numpy("y").tolist() == [[2.0]]  # the new binding's own instance
        finally:
            gate.open.set()
            pool.shutdown(wait=False)
        assert running.result(30).as_numpy("y").tolist() == [[-1.0]]
        assert queued.result(30).as_numpy("y").tolist() == [[1.0]]


def test_a_load_body_that_is_no_json_fails_as_in_triton(echo_server: Triton) -> None:
    assert echo_server.http_port is not None
    status, _, answer = request(echo_server.http_port, "POST", "/v2/repository/models/echo/load", b"garbage", HTTP_AUTH)
    assert status == 500 and json.loads(answer)["error"].startswith("failed to parse the request JSON buffer")


def test_the_model_config_decorators_read_follows_the_new_binding() -> None:
    def echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return [{"y": request_["x"]} for request_ in requests]

    def bind(triton: Triton) -> None:
        triton.bind("m", echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig(max_batch_size=8))

    with running_triton(bind) as triton:
        assert get_model_config(echo, None).max_batch_size == 8
        override = {"max_batch_size": 16, "parameters": {"k": {"string_value": "v"}}}
        assert _load(triton, "m", override) == (200, None)
        config = get_model_config(echo, None)
        assert config.max_batch_size == 16 and config.backend_parameters == {"k": "v"}
        assert [spec.name for spec in config.inputs or []] == ["x"]


def countdown(requests: List[Any]) -> Any:
    """A decoupled model: three responses per request."""
    for step in range(3):
        yield [{"y": request_["x"] * step} for request_ in requests]


def test_a_decoupled_model_is_bound_again_and_streams_on_the_new_binding() -> None:
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8, decoupled=True)
        triton.bind("steps", countdown, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)

    with running_triton(bind) as triton:
        assert _load(triton, "steps", {"max_batch_size": 4, "instance_group": [{"count": 1}]}) == (200, None)
        status, document = _load(triton, "steps", {"model_transaction_policy": {"decoupled": False}})
        assert status == 400 and "'model_transaction_policy' cannot change" in document["error"]
        answers: List[Any] = []
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        client.start_stream(callback=lambda result, error: answers.append(error or result.as_numpy("y")))
        tensor = grpcclient.InferInput("x", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        client.async_stream_infer("steps", [tensor])
        client.stop_stream()  # returns once the stream has ended
        assert [answer.tolist() for answer in answers] == [[[0.0, 0.0]], [[1.0, 1.0]], [[2.0, 2.0]]]
        assert _config(triton, "steps")["max_batch_size"] == 4


def test_a_model_asking_for_the_cache_shows_it_in_its_config_when_the_server_has_none() -> None:
    """tritonserver 2.51 shows `response_cache: {enable: true}` as bound, with or without a cache configured
    (measured with nvidia-pytriton 0.7); the config shown, loaded back as an override, changes nothing."""

    def bind(triton: Triton) -> None:
        tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
        triton.bind("cached", slow_echo, inputs=tensors, outputs=tensors, config=ModelConfig(response_cache=True))

    with running_triton(bind) as triton:
        config = _config(triton, "cached")
        assert config["response_cache"] == {"enable": True}
        grpc_config = grpcclient.InferenceServerClient(grpc_url(triton)).get_model_config("cached").config
        assert grpc_config.response_cache.enable
        assert _load(triton, "cached", config) == (200, None)
        assert _load(triton, "cached", {"response_cache": {"enable": True}}) == (200, None)
        assert _config(triton, "cached") == config


def _index_state(triton: Triton, name: str) -> Any:
    """The model's (state, reason) in the repository index."""
    client = httpclient.InferenceServerClient(http_url(triton))
    (entry,) = [entry for entry in client.get_model_repository_index(headers=HTTP_AUTH) if entry["name"] == name]
    return entry.get("state"), entry.get("reason")


def _until_state(triton: Triton, name: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while _index_state(triton, name)[0] != state:
        assert time.monotonic() < deadline, f"{name} never became {state}"
        time.sleep(0.02)


def test_an_unload_answers_at_once_while_its_requests_finish_and_a_load_waits_for_them() -> None:
    """As tritonserver 2.51 (measured): the unload answers at once, the model shows UNLOADING (server not ready,
    new requests refused) until the held request ends; a load sent meanwhile shows LOADING and answers after."""
    gate = Gate()
    with running_triton(
        lambda triton: triton.bind("m", gate, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig())
    ) as triton:
        pool = ThreadPoolExecutor(2)
        client = httpclient.InferenceServerClient(http_url(triton))

        def infer(value: float) -> Any:
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                tensor = httpclient.InferInput("x", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
                return own.infer("m", [tensor]).as_numpy("y").tolist()

        def load_in_thread() -> None:  # a client of its own: gevent's clients are not shared between threads
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                own.load_model("m", headers=HTTP_AUTH)

        held = pool.submit(infer, -1.0)
        try:
            assert gate.entered.wait(30)
            started = time.monotonic()
            client.unload_model("m", headers=HTTP_AUTH)
            assert time.monotonic() - started < 5 and not held.done()
            assert _index_state(triton, "m") == ("UNLOADING", None)
            assert not client.is_server_ready() and not client.is_model_ready("m")
            with pytest.raises(InferenceServerException, match="'m' has no available versions"):
                infer(1.0)
            load = pool.submit(load_in_thread)
            deadline = time.monotonic() + 30
            while _index_state(triton, "m") != ("LOADING", None):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert not load.done()
        finally:
            gate.open.set()
        assert held.result(30) == [[-1.0]]
        load.result(30)
        assert _index_state(triton, "m") == ("READY", None) and infer(2.0) == [[2.0]]
        pool.shutdown()


def test_an_unloaded_model_leaves_the_server_ready_and_keeps_only_its_failure_counters() -> None:
    """As tritonserver 2.51: once unloaded, the server is ready again and /metrics drops the model's series but
    nv_inference_request_failure; a load starts its statistics and counters again (a new model)."""
    with running_triton(
        lambda triton: triton.bind("m", slow_echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig())
    ) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        client.infer("m", [tensor])
        client.infer("m", [tensor])
        client.unload_model("m", headers=HTTP_AUTH)
        _until_state(triton, "m", "UNAVAILABLE")
        assert client.is_server_ready()
        assert triton.metrics_port is not None
        lines = request(triton.metrics_port, "GET", "/metrics")[2].decode().splitlines()
        names = {line.split("{")[0] for line in lines if 'model="m"' in line}
        assert names == {"nv_inference_request_failure"}
        client.load_model("m", headers=HTTP_AUTH)
        stats = client.get_inference_statistics("m", headers=HTTP_AUTH)["model_stats"][0]
        assert (stats["inference_count"], stats["execution_count"]) == (0, 0)
        lines = request(triton.metrics_port, "GET", "/metrics")[2].decode().splitlines()
        assert 'nv_inference_count{model="m",version="1"} 0' in lines


@batch
def echo_or_raise(x: np.ndarray) -> Dict[str, np.ndarray]:
    if (x < 0).any():
        raise ValueError("negative input")
    return {"y": x}


def _failures_and_successes(triton: Triton) -> Tuple[List[str], List[str]]:
    assert triton.metrics_port is not None
    lines = request(triton.metrics_port, "GET", "/metrics")[2].decode().splitlines()
    failures = [line for line in lines if line.startswith('nv_inference_request_failure{model="m",reason="BACKEND"')]
    successes = [line for line in lines if line.startswith('nv_inference_request_success{model="m"')]
    return failures, successes


@pytest.mark.parametrize("frontends", [None, 2])
def test_a_load_after_an_unload_goes_on_from_the_failure_counters_as_triton(frontends: Optional[int]) -> None:
    """tritonserver 2.51 (a Python-backend model that raised 6 times, unloaded and loaded): /metrics shows
    nv_inference_request_success 0 and nv_inference_request_failure{reason="BACKEND"} 6, 7 after one more failure
    (its statistics start again: fail 0). Before, the failure counters started again at 0 too."""
    bind = lambda triton: triton.bind(  # noqa: E731
        "m", echo_or_raise, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig(max_batch_size=8)
    )
    with running_triton(bind, frontends=frontends) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))

        def infer(value: float) -> None:
            tensor = httpclient.InferInput("x", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
            client.infer("m", [tensor])

        infer(1.0)
        for _ in range(2):
            with pytest.raises(InferenceServerException, match="negative input"):
                infer(-1.0)
        client.unload_model("m", headers=HTTP_AUTH)
        _until_state(triton, "m", "UNAVAILABLE")
        client.load_model("m", headers=HTTP_AUTH)
        failures, successes = _failures_and_successes(triton)
        assert failures == ['nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2']
        assert successes == ['nv_inference_request_success{model="m",version="1"} 0']
        stats = client.get_inference_statistics("m", headers=HTTP_AUTH)["model_stats"][0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (0, 0)
        with pytest.raises(InferenceServerException, match="negative input"):
            infer(-1.0)
        infer(1.0)
        failures, successes = _failures_and_successes(triton)
        assert failures == ['nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 3']
        assert successes == ['nv_inference_request_success{model="m",version="1"} 1']


@pytest.mark.parametrize("frontends", [None, 3])
def test_process_instances_stop_at_unload_and_start_again_at_load(frontends: Optional[int]) -> None:
    outputs = [*ECHO_OUTPUTS, Tensor(name="pid", dtype=np.int64, shape=(1,))]

    def bind(triton: Triton) -> None:
        config = ModelConfig(batching=False)
        triton.bind("m", ProcessInstances(pid_echo, count=2), inputs=ECHO_INPUTS, outputs=outputs, config=config)

    with running_triton(bind, frontends=frontends) as triton:
        old = _pids(triton, 2)
        started = {pid: started_at(pid) for pid in old}
        client = httpclient.InferenceServerClient(http_url(triton))
        client.unload_model("m", headers=HTTP_AUTH)
        deadline = time.monotonic() + 30
        while any(alive(pid, started[pid]) for pid in old):  # no process is left behind
            assert time.monotonic() < deadline, "an unloaded model's process still runs"
            time.sleep(0.05)
        client.load_model("m", headers=HTTP_AUTH)
        new = _pids(triton, 2)
        assert new and not new & old and all(alive(pid, started_at(pid)) for pid in new)


def slow_countdown(requests: List[Any]) -> Any:
    """A decoupled model: four responses per request, 0.3 s apart."""
    for step in range(4):
        time.sleep(0.3)
        yield [{"y": request_["x"] * step} for request_ in requests]


def test_a_stream_open_across_an_unload_ends_its_request_and_is_refused_the_next_at_once() -> None:
    """As tritonserver 2.51 (measured): the request streaming goes on to its last response; one sent on the same
    stream after the unload's answer is refused at once, before that last response (it waited for it)."""

    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8, decoupled=True)
        triton.bind("steps", slow_countdown, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)

    with running_triton(bind) as triton:
        events: List[Any] = []
        first = threading.Event()

        def callback(result: Any, error: Any) -> None:
            events.append(error.message() if error is not None else result.as_numpy("y").tolist())
            first.set()

        client = grpcclient.InferenceServerClient(grpc_url(triton))
        client.start_stream(callback=callback)
        tensor = grpcclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        client.async_stream_infer("steps", [tensor])
        assert first.wait(30)
        httpclient.InferenceServerClient(http_url(triton)).unload_model("steps", headers=HTTP_AUTH)
        client.async_stream_infer("steps", [tensor])
        client.stop_stream()  # returns once the stream has ended
        refused = "Request for unknown model: 'steps' has no available versions"
        assert [event for event in events if event != refused] == [[[0.0]], [[1.0]], [[2.0]], [[3.0]]]
        assert events.count(refused) == 1 and events.index(refused) < events.index([[3.0]])


def _send_in_two_parts(triton: Triton, path: str, document: Dict[str, Any], between: Any) -> Tuple[int, Any]:
    """POST `document` to `path`: the headers and a first part of the body, then `between()`, then the rest."""
    body = json.dumps(document).encode()
    assert triton.http_port is not None
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=60)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body[:8])
        between()
        connection.send(body[8:])
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("path", "document"),
    [
        ("/v2/models/m/infer", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}),
        ("/v2/models/m/generate", {"x": [1.0]}),
    ],
)
def test_a_request_whose_body_comes_after_an_unload_gets_tritons_words(path: str, document: Dict[str, Any]) -> None:
    """As tritonserver 2.51 (measured: it finds the model once the body is in): 404 `has no available versions`.
    The model was found as the headers came, and the stale binding answered 503 `'m' is not ready`."""
    config = ModelConfig(batching=False)
    with running_triton(
        lambda triton: triton.bind("m", slow_echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)
    ) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        answer = _send_in_two_parts(triton, path, document, lambda: client.unload_model("m", headers=HTTP_AUTH))
        assert answer == (404, {"error": "Request for unknown model: 'm' has no available versions"})
        client.load_model("m", headers=HTTP_AUTH)
        named = path.replace("/m/", "/m/versions/1/")
        answer = _send_in_two_parts(triton, named, document, lambda: client.unload_model("m", headers=HTTP_AUTH))
        assert answer == (503, {"error": "Request for unknown model: 'm' version 1 is not at ready state"})


@pytest.mark.parametrize("frontends", [None, 2])
def test_a_request_whose_body_comes_after_an_unload_and_a_load_is_served(frontends: Optional[int]) -> None:
    """As tritonserver 2.51 (measured): the model loaded again serves it; it got 503 `'m' is not ready`."""
    config = ModelConfig(batching=False)
    with running_triton(
        lambda triton: triton.bind("m", slow_echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config),
        frontends=frontends,
    ) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))

        def unload_and_load() -> None:
            client.unload_model("m", headers=HTTP_AUTH)
            _until_state(triton, "m", "UNAVAILABLE")
            client.load_model("m", headers=HTTP_AUTH)

        document = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}
        status, answer = _send_in_two_parts(triton, "/v2/models/m/infer", document, unload_and_load)
        assert (status, answer["outputs"][0]["data"]) == (200, [1.0, 2.0])


def test_a_load_body_of_whitespace_alone_fails_as_in_triton(echo_server: Triton) -> None:
    """tritonserver 2.51 (measured): 500, `failed to parse the request JSON buffer: The document is empty.`; it was
    read as no body (a plain load)."""
    assert echo_server.http_port is not None
    status, _, answer = request(echo_server.http_port, "POST", "/v2/repository/models/echo/load", b" \n", HTTP_AUTH)
    assert status == 500 and json.loads(answer)["error"].startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize("count", [0, -1, -5])
def test_an_instance_count_below_one_is_taken_as_one_as_in_triton(echo_server: Triton, count: int) -> None:
    """tritonserver 2.51 (measured): a load asking for 0 or -1 instances loads 1 (a negative count was refused)."""
    try:
        assert _load(echo_server, "echo", {"instance_group": [{"count": count, "kind": "KIND_CPU"}]}) == (200, None)
        assert _config(echo_server, "echo")["instance_group"][0]["count"] == 1
    finally:
        httpclient.InferenceServerClient(http_url(echo_server)).load_model("echo", headers=HTTP_AUTH)
    assert _config(echo_server, "echo")["instance_group"][0]["count"] == 2


@pytest.mark.parametrize("loaded", ["m", "e"])
def test_a_load_waiting_for_its_models_unload_leaves_the_other_models_loads_and_unloads_alone(loaded: str) -> None:
    """It waited holding the repository's lock: every load and unload of another model waited for the held request
    too (up to the 30 s an unload waits). tritonserver 2.51 (measured) answers them at once. A load of an ensemble
    over the model (unloaded with it) waits for the model's unload alike."""
    gate = Gate()

    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=4)
        triton.bind("m", gate, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)
        triton.bind("other", slow_echo, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig())
        step = EnsembleStep("m", input_map={"x": "x"}, output_map={"y": "y"})
        triton.bind_ensemble("e", [step], inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=config)

    with running_triton(bind) as triton:
        pool = ThreadPoolExecutor(3)

        def infer(model: str, value: float) -> Any:
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                tensor = httpclient.InferInput("x", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
                return own.infer(model, [tensor]).as_numpy("y").tolist()

        def control(*steps: str) -> None:  # a client of its own: gevent's clients are not shared between threads
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                for step in steps:
                    action, name = step.split()
                    getattr(own, f"{action}_model")(name, headers=HTTP_AUTH)

        held = pool.submit(infer, "m", -1.0)
        try:
            assert gate.entered.wait(30)
            control("unload m")
            load = pool.submit(control, f"load {loaded}")
            deadline = time.monotonic() + 30
            while _index_state(triton, "m") != ("LOADING", None):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            pool.submit(control, "unload other", "load other").result(timeout=20)  # waited for the gate before
            assert not load.done() and not held.done()
            assert _index_state(triton, "other") == ("READY", None)
        finally:
            gate.open.set()
        assert held.result(30) == [[-1.0]]
        load.result(30)
        assert _index_state(triton, "m") == _index_state(triton, "e") == ("READY", None)
        assert infer("m", 2.0) == [[2.0]] and infer("e", 3.0) == [[3.0]]
        pool.shutdown()


def refusing_factory() -> Any:
    """Module level, for process instances: pid_echo, unless the file $FACTORY_REFUSES names exists."""
    if os.path.exists(os.environ["FACTORY_REFUSES"]):
        raise RuntimeError("this factory refuses to start now")
    return pid_echo


def test_a_load_that_fails_after_an_unload_gives_its_reason_and_the_server_is_not_ready(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """As tritonserver 2.51 (measured): the reason the load failed, and a strict server not ready until a load
    succeeds; the index said `unloaded`, as if no load was tried, and the server was ready."""
    flag = tmp_path / "refuse"
    monkeypatch.setenv("FACTORY_REFUSES", str(flag))
    outputs = [*ECHO_OUTPUTS, Tensor(name="pid", dtype=np.int64, shape=(1,))]

    def bind(triton: Triton) -> None:
        instances = ProcessInstances(factory=refusing_factory, count=1)
        triton.bind("m", instances, inputs=ECHO_INPUTS, outputs=outputs, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        client.unload_model("m", headers=HTTP_AUTH)
        _until_state(triton, "m", "UNAVAILABLE")
        flag.touch()
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("m", headers=HTTP_AUTH)
        state, reason = _index_state(triton, "m")
        assert state == "UNAVAILABLE" and reason == raised.value.message()
        assert "this factory refuses to start now" in reason
        assert not client.is_server_ready()  # 2.51: a strict server is not ready while a model failed to load
        client.unload_model("m", headers=HTTP_AUTH)  # changes neither, in 2.51
        assert _index_state(triton, "m") == (state, reason) and not client.is_server_ready()
        flag.unlink()
        client.load_model("m", headers=HTTP_AUTH)
        assert _index_state(triton, "m") == ("READY", None) and client.is_server_ready()
        client.unload_model("m", headers=HTTP_AUTH)
        _until_state(triton, "m", "UNAVAILABLE")
        assert _index_state(triton, "m") == ("UNAVAILABLE", "unloaded")


def test_an_unload_asked_while_a_load_waits_for_the_models_requests_is_the_last_word() -> None:
    """unload, load (waiting for the held request), unload: the model ends unloaded, as the last call asked (the
    load waiting outside the repository lock must not win over the unload answered after it was sent); the load
    answers as if it ran first: an override that cannot apply is refused all the same."""
    gate = Gate()
    with running_triton(
        lambda triton: triton.bind("m", gate, inputs=ECHO_INPUTS, outputs=ECHO_OUTPUTS, config=ModelConfig())
    ) as triton:
        pool = ThreadPoolExecutor(3)

        def infer(value: float) -> Any:
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                tensor = httpclient.InferInput("x", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
                return own.infer("m", [tensor]).as_numpy("y").tolist()

        def load_in_thread() -> None:  # a client of its own: gevent's clients are not shared between threads
            with httpclient.InferenceServerClient(http_url(triton)) as own:
                own.load_model("m", headers=HTTP_AUTH)

        client = httpclient.InferenceServerClient(http_url(triton))
        held = pool.submit(infer, -1.0)
        try:
            assert gate.entered.wait(30)
            client.unload_model("m", headers=HTTP_AUTH)
            load = pool.submit(load_in_thread)
            refused = pool.submit(_load, triton, "m", {"max_batch_size": 0})
            # Both loads wait for the held request (Engine._after_unload counts them): the index reads LOADING
            # once the first arrives, and an unload asked before the second arrived would not be the last word.
            deadline = time.monotonic() + 30
            while triton._runtime.engine._loading.get("m") != 2:
                assert time.monotonic() < deadline, "the two loads never both waited"
                time.sleep(0.01)
            assert _index_state(triton, "m") == ("LOADING", None)
            client.unload_model("m", headers=HTTP_AUTH)
        finally:
            gate.open.set()
        assert held.result(30) == [[-1.0]]
        load.result(30)
        status, document = refused.result(30)
        assert status == 400 and "'max_batch_size' cannot change" in document["error"]
        _until_state(triton, "m", "UNAVAILABLE")
        assert _index_state(triton, "m") == ("UNAVAILABLE", "unloaded")
        with pytest.raises(InferenceServerException, match="'m' has no available versions"):
            infer(1.0)
        client.load_model("m", headers=HTTP_AUTH)
        assert infer(2.0) == [[2.0]]
        pool.shutdown()
