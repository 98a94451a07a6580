"""Ensembles (Triton's `ensemble_scheduling`): `Triton.bind_ensemble`, served, configured and counted as Triton does.

The expected documents are what nvidia-pytriton 0.7.0's tritonserver 2.51 answered on this machine for the same
ensemble (a python-backend `pre` then `cls`, loaded from a model repository next to them); comments quote it.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.decorators import batch
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonModelConfigError
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, EnsembleStep, ModelConfig, QueuePolicy, SequenceBatcher, Tensor
from pytriton.proxy.types import Request
from pytriton.remote_triton import RemoteTriton
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.http_helpers import post_json
from tests.waiting import wait_until

LABELS = ["zero", "one", "two"]


@batch
def _double(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
    return {"PRE_OUT": INPUT * 2}


@batch
def _classify(X: np.ndarray) -> Dict[str, np.ndarray]:
    if (X < 0).any():
        raise ValueError("negative input")
    return {"SCORES": X[:, :3].copy()}


@batch
def _negate(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
    return {"NEG": -INPUT}


@batch
def _add(A: np.ndarray, B: np.ndarray) -> Dict[str, np.ndarray]:
    return {"SUM": A + B}


def _tensor(name: str, dims: int, **options: Any) -> Tensor:
    return Tensor(name=name, dtype=np.float32, shape=(dims,), **options)


def _bind_steps(triton: Triton, pre: Any = _double) -> None:
    """The step models `pre` (INPUT -> PRE_OUT) and `cls` (X -> SCORES), and the ensemble `ens` over them."""
    config = ModelConfig(max_batch_size=8)
    triton.bind("pre", pre, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
    triton.bind("cls", _classify, [_tensor("X", 4)], [_tensor("SCORES", 3)], config=config)
    triton.bind_ensemble(
        "ens",
        steps=[
            EnsembleStep("pre", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "mid"}),
            EnsembleStep("cls", input_map={"X": "mid"}, output_map={"SCORES": "OUT"}),
        ],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 3, labels=LABELS)],
        config=config,
    )


class Gated:
    """A step model whose calls wait at a gate, and the batch sizes it ran."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.sizes: List[int] = []

    @property
    def callable(self) -> Any:
        @batch
        def gated(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
            assert self.gate.wait(10)
            self.sizes.append(len(INPUT))
            return {"PRE_OUT": INPUT * 2}

        return gated


class Meeting:
    """Two step models that each wait for the other to have started: they finish only when run at once."""

    def __init__(self) -> None:
        self.left = threading.Event()
        self.right = threading.Event()

    def callables(self) -> List[Callable[..., Any]]:
        @batch
        def left(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
            self.left.set()
            assert self.right.wait(10), "the right step never ran while the left one did"
            return {"PRE_OUT": INPUT * 2}

        @batch
        def right(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
            self.right.set()
            assert self.left.wait(10), "the left step never ran while the right one did"
            return {"NEG": -INPUT}

        return [left, right]


GATED = Gated()
MEETING = Meeting()


def _bind_all(triton: Triton) -> None:
    _bind_steps(triton)
    config = ModelConfig(max_batch_size=8)
    # A diamond: `left` and `right` both read IN; `add` reads what both wrote.
    left, right = MEETING.callables()
    triton.bind("left", left, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
    triton.bind("right", right, [_tensor("INPUT", 4)], [_tensor("NEG", 4)], config=config)
    triton.bind("add", _add, [_tensor("A", 4), _tensor("B", 4)], [_tensor("SUM", 4)], config=config)
    triton.bind_ensemble(
        "diamond",
        steps=[
            EnsembleStep("add", input_map={"A": "doubled", "B": "negated"}, output_map={"SUM": "OUT"}),
            EnsembleStep("left", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "doubled"}),
            EnsembleStep("right", input_map={"INPUT": "IN"}, output_map={"NEG": "negated"}),
        ],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=config,
    )
    # A step model with a batcher that waits, whose calls can be held at a gate.
    triton.bind(
        "gated",
        GATED.callable,
        [_tensor("INPUT", 4)],
        [_tensor("PRE_OUT", 4)],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=100_000)),
    )
    triton.bind_ensemble(
        "gated_ens",
        steps=[EnsembleStep("gated", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "OUT"})],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=config,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_bind_all) as triton:
        yield triton


def _http_infer(url: str, model: str, array: np.ndarray, **output: Any) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url)
    given = httpclient.InferInput("IN", list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    outputs = [httpclient.InferRequestedOutput("OUT", **output)] if output else None
    return client.infer(model, [given], outputs=outputs)


def _grpc_infer(url: str, model: str, array: np.ndarray, **output: Any) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(url)
    given = grpcclient.InferInput("IN", list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    outputs = [grpcclient.InferRequestedOutput("OUT", **output)] if output else None
    return client.infer(model, [given], outputs=outputs)


ROWS = np.arange(8, dtype=np.float32).reshape(2, 4)


# GET /v2/models/ens/config from tritonserver 2.51 (`parameters` empty, as no workspace is involved).
def _tensor_config(name: str, dims: int, output: bool) -> Dict[str, Any]:
    if output:
        return {
            "name": name,
            "data_type": "TYPE_FP32",
            "dims": [dims],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        }
    return {
        "name": name,
        "data_type": "TYPE_FP32",
        "format": "FORMAT_NONE",
        "dims": [dims],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }


TRITON_HTTP_CONFIG = {
    "name": "ens",
    "platform": "ensemble",
    "backend": "",
    "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 8,
    "input": [_tensor_config("IN", 4, False)],
    "output": [_tensor_config("OUT", 3, True)],
    "batch_input": [],
    "batch_output": [],
    "ensemble_scheduling": {
        "step": [
            {
                "model_name": "pre",
                "model_version": -1,
                "input_map": {"INPUT": "IN"},
                "output_map": {"PRE_OUT": "mid"},
                "model_namespace": "",
            },
            {
                "model_name": "cls",
                "model_version": -1,
                "input_map": {"X": "mid"},
                "output_map": {"SCORES": "OUT"},
                "model_namespace": "",
            },
        ]
    },
    "instance_group": [],
    "default_model_filename": "",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {},
    "model_warmup": [],
    "model_transaction_policy": {"decoupled": False},
}
# The same over gRPC, as tritonclient's get_model_config(as_json=True) printed it.
TRITON_GRPC_CONFIG = {
    "config": {
        "name": "ens",
        "platform": "ensemble",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 8,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": ["4"]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": ["3"]}],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "pre",
                    "model_version": "-1",
                    "input_map": {"INPUT": "IN"},
                    "output_map": {"PRE_OUT": "mid"},
                },
                {
                    "model_name": "cls",
                    "model_version": "-1",
                    "input_map": {"X": "mid"},
                    "output_map": {"SCORES": "OUT"},
                },
            ]
        },
        "model_transaction_policy": {},
    }
}


def test_config_and_metadata_are_tritons_over_http_and_grpc(server: Triton) -> None:
    http = httpclient.InferenceServerClient(http_url(server))
    grpc = grpcclient.InferenceServerClient(grpc_url(server))
    assert http.get_model_config("ens") == TRITON_HTTP_CONFIG  # labels given as a list show no label_filename
    assert grpc.get_model_config("ens", as_json=True) == TRITON_GRPC_CONFIG
    assert http.get_model_metadata("ens") == {
        "name": "ens",
        "versions": ["1"],
        "platform": "ensemble",
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [-1, 3]}],
    }
    assert grpc.get_model_metadata("ens", as_json=True)["platform"] == "ensemble"
    index = {entry["name"]: entry["state"] for entry in http.get_model_repository_index(headers=HTTP_AUTH)}
    assert index["ens"] == "READY" and index["pre"] == "READY"


def test_an_ensemble_answers_with_its_steps_outputs_and_tritons_response_parameters(server: Triton) -> None:
    result = _http_infer(http_url(server), "ens", ROWS)
    assert result.as_numpy("OUT").tolist() == [[0.0, 2.0, 4.0], [8.0, 10.0, 12.0]]
    # tritonserver 2.51: "parameters": {"sequence_id": 0, "sequence_start": false, "sequence_end": false}
    assert result.get_response()["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    grpc_result = _grpc_infer(grpc_url(server), "ens", ROWS)
    assert grpc_result.as_numpy("OUT").tolist() == [[0.0, 2.0, 4.0], [8.0, 10.0, 12.0]]
    parameters = grpc_result.get_response(as_json=True)["parameters"]
    assert parameters == {
        "sequence_id": {"int64_param": "0"},
        "sequence_start": {"bool_param": False},
        "sequence_end": {"bool_param": False},
    }


def test_independent_steps_run_at_once_and_a_step_waits_for_all_its_inputs(server: Triton) -> None:
    # `left` and `right` each wait for the other to have started; `add` needs both their outputs.
    array = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    assert _http_infer(http_url(server), "diamond", array).as_numpy("OUT").tolist() == [[1.0, 2.0, 3.0, 4.0]]


def _bind_branches(triton: Triton) -> None:
    """`branches`: `a` writes OA from IN; `b` then `c` write OC from IN, through `mid`."""
    config = ModelConfig(max_batch_size=8)
    triton.bind("a", _double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
    triton.bind("b", _negate, [_tensor("INPUT", 4)], [_tensor("NEG", 4)], config=config)
    triton.bind("c", _double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
    triton.bind_ensemble(
        "branches",
        steps=[
            _step("a", {"INPUT": "IN"}, {"PRE_OUT": "OA"}),
            _step("b", {"INPUT": "IN"}, {"NEG": "mid"}),
            _step("c", {"INPUT": "mid"}, {"PRE_OUT": "OC"}),
        ],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OA", 4), _tensor("OC", 4)],
        config=config,
    )


def test_a_request_runs_only_the_steps_its_requested_outputs_need(start_triton: Any) -> None:
    # What tritonserver 2.51 counted for the same graph of python-backend steps: asked for OA only, a=1, b=0, c=0;
    # then for OC only, b and c ran and a did not; then for both, each ran once more.
    triton = start_triton(_bind_branches)
    client = httpclient.InferenceServerClient(http_url(triton))
    given = httpclient.InferInput("IN", [1, 4], "FP32")
    given.set_data_from_numpy(np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32))

    def successes() -> Dict[str, int]:
        stats = client.get_inference_statistics("", headers=HTTP_AUTH)["model_stats"]
        return {entry["name"]: int(entry["inference_stats"]["success"]["count"]) for entry in stats}

    only_a = client.infer("branches", [given], outputs=[httpclient.InferRequestedOutput("OA")])
    assert only_a.as_numpy("OA").tolist() == [[2.0, 4.0, 6.0, 8.0]] and only_a.as_numpy("OC") is None
    assert successes() == {"a": 1, "b": 0, "c": 0, "branches": 1}
    only_c = client.infer("branches", [given], outputs=[httpclient.InferRequestedOutput("OC")])
    assert only_c.as_numpy("OC").tolist() == [[-2.0, -4.0, -6.0, -8.0]]
    assert successes() == {"a": 1, "b": 1, "c": 1, "branches": 2}
    both = client.infer("branches", [given])
    assert both.as_numpy("OA").tolist() == [[2.0, 4.0, 6.0, 8.0]]
    assert both.as_numpy("OC").tolist() == [[-2.0, -4.0, -6.0, -8.0]]
    assert successes() == {"a": 2, "b": 2, "c": 2, "branches": 3}


def test_a_step_error_fails_the_request_with_the_step_models_message(server: Triton) -> None:
    negative = -np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as http_error:
        _http_infer(http_url(server), "ens", negative)
    # tritonserver 2.51: "in ensemble 'ens', " then the step model's message, with its status.
    assert http_error.value.status() == "500"
    assert http_error.value.message() == "in ensemble 'ens', ValueError: negative input"
    with pytest.raises(InferenceServerException) as grpc_error:
        _grpc_infer(grpc_url(server), "ens", negative)
    assert grpc_error.value.status() == "StatusCode.INTERNAL"
    assert grpc_error.value.message() == "in ensemble 'ens', ValueError: negative input"


def test_the_image_client_flow_classes_of_an_ensemble_output(server: Triton) -> None:
    # What Triton's ensemble_image_client.py does: metadata, config, one input, then OUTPUT with class_count.
    http = httpclient.InferenceServerClient(http_url(server))
    metadata, config = http.get_model_metadata("ens"), http.get_model_config("ens")
    assert len(metadata["inputs"]) == 1 and len(config["input"]) == 1 and config["max_batch_size"] == 8
    result = _http_infer(http_url(server), "ens", ROWS, binary_data=True, class_count=2)
    assert result.as_numpy("OUT").tolist() == [
        [b"4.000000:2:two", b"2.000000:1:one"],
        [b"12.000000:2:two", b"10.000000:1:one"],
    ]
    grpc = grpcclient.InferenceServerClient(grpc_url(server))
    assert grpc.get_model_config("ens").config.platform == "ensemble"
    top = _grpc_infer(grpc_url(server), "ens", ROWS[:1], class_count=1).as_numpy("OUT")
    assert top.tolist() == [[b"4.000000:2:two"]]


def _model(triton: Triton, name: str) -> Any:
    return triton._runtime.engine.model(name)


def test_steps_batch_with_client_requests_to_the_step_model(server: Triton) -> None:
    url = http_url(server)
    stats = httpclient.InferenceServerClient(url)
    GATED.sizes.clear()
    GATED.gate.clear()
    one = np.ones((1, 4), dtype=np.float32)
    given = httpclient.InferInput("INPUT", [1, 4], "FP32")
    given.set_data_from_numpy(one)

    def infer_step() -> Any:  # a client of its own: one connection each
        return httpclient.InferenceServerClient(url).infer("gated", [given])

    blocker = threading.Thread(target=infer_step)
    blocker.start()
    wait_until(lambda: bool(_model(server, "gated").scheduler.open_requests[1]))
    results: Dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("client", infer_step())),
        threading.Thread(target=lambda: results.__setitem__("ensemble", _http_infer(url, "gated_ens", one * 3))),
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: _model(server, "gated").scheduler.pending == 2)  # a client's request and the ensemble's step
    GATED.gate.set()
    for thread in [*threads, blocker]:
        thread.join(10)
    assert GATED.sizes == [1, 2]
    assert results["ensemble"].as_numpy("OUT").tolist() == [[6.0] * 4]
    step = stats.get_inference_statistics("gated", headers=HTTP_AUTH)["model_stats"][0]
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in step["batch_stats"]} == {1: 1, 2: 1}
    assert step["inference_count"] == 3
    ensemble = stats.get_inference_statistics("gated_ens", headers=HTTP_AUTH)["model_stats"][0]
    assert ensemble["inference_count"] == 1 and [b["batch_size"] for b in ensemble["batch_stats"]] == [1]


def _bind_counted(triton: Triton) -> None:
    _bind_steps(triton)


def test_statistics_are_tritons_for_an_ensemble_and_its_steps() -> None:
    with running_triton(_bind_counted) as triton:
        http = httpclient.InferenceServerClient(http_url(triton))
        _http_infer(http_url(triton), "ens", ROWS)

        def stats_of(name: str) -> Dict[str, Any]:
            return http.get_inference_statistics(name, headers=HTTP_AUTH)["model_stats"][0]  # type: ignore[no-any-return]

        ensemble, pre, cls = stats_of("ens"), stats_of("pre"), stats_of("cls")
        # tritonserver 2.51 for a batch of 2: one execution of batch size 2, two inferences, one success; the
        # ensemble's compute times are its steps' compute times added up.
        assert ensemble["inference_count"] == 2 and ensemble["execution_count"] == 1
        inference = ensemble["inference_stats"]
        assert [inference[key]["count"] for key in ("success", "fail", "queue", "compute_input")] == [1, 0, 1, 1]
        for key in ("compute_input", "compute_infer", "compute_output"):
            steps_ns = pre["inference_stats"][key]["ns"] + cls["inference_stats"][key]["ns"]
            assert inference[key]["ns"] == steps_ns, key
            assert ensemble["batch_stats"][0][key] == {"count": 1, "ns": steps_ns}
        assert [b["batch_size"] for b in ensemble["batch_stats"]] == [2]
        assert inference["success"]["ns"] >= inference["compute_infer"]["ns"]
        for step in (pre, cls):  # the steps count their own request
            assert step["inference_count"] == 2 and step["inference_stats"]["success"]["count"] == 1
        with pytest.raises(InferenceServerException):
            _http_infer(http_url(triton), "ens", -np.ones((1, 4), dtype=np.float32))
        # tritonserver 2.51 counts a failed ensemble request twice (its error response, then its release).
        assert stats_of("ens")["inference_stats"]["fail"]["count"] == 2
        assert stats_of("cls")["inference_stats"]["fail"]["count"] == 1
        assert stats_of("ens")["execution_count"] == 1
        grpc = grpcclient.InferenceServerClient(grpc_url(triton))
        over_grpc = grpc.get_inference_statistics("ens", headers=GRPC_AUTH, as_json=True)["model_stats"][0]
        assert over_grpc["inference_count"] == "2" and over_grpc["batch_stats"][0]["batch_size"] == "2"


def test_an_ensemble_goes_and_comes_back_with_its_step_models_as_in_triton() -> None:
    """tritonserver 2.51 (measured on a repository of the same shape): unloading a step model unloads the
    ensembles on it, and loading it again loads them again (unless they were unloaded on their own); loading an
    ensemble loads its unloaded step models."""
    with running_triton(_bind_counted) as triton:
        http = httpclient.InferenceServerClient(http_url(triton))
        http.unload_model("pre", headers=HTTP_AUTH)
        index = {entry["name"]: entry for entry in http.get_model_repository_index(headers=HTTP_AUTH)}
        assert index["ens"] == {"name": "ens", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        assert index["cls"]["state"] == "READY"
        with pytest.raises(InferenceServerException) as gone:
            _http_infer(http_url(triton), "ens", ROWS)
        assert gone.value.message() == "Request for unknown model: 'ens' has no available versions"
        http.load_model("pre", headers=HTTP_AUTH)
        assert http.is_model_ready("ens")
        assert _http_infer(http_url(triton), "ens", ROWS).as_numpy("OUT").shape == (2, 3)
        http.unload_model("ens", headers=HTTP_AUTH)
        http.unload_model("pre", headers=HTTP_AUTH)
        http.load_model("pre", headers=HTTP_AUTH)
        assert not http.is_model_ready("ens")  # unloaded on its own: it stays so
        http.unload_model("pre", headers=HTTP_AUTH)
        http.load_model("ens", headers=HTTP_AUTH)
        assert http.is_model_ready("pre") and http.is_model_ready("ens")
        assert _http_infer(http_url(triton), "ens", ROWS).as_numpy("OUT").shape == (2, 3)


class _HeldDouble:
    """`pre`'s double, held until released once `hold` is set; `entered` is set when a held call starts."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        if self.hold.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


@pytest.mark.parametrize("frontends", [None, 2])
def test_unloading_a_later_step_answers_at_once_and_the_runs_under_way_finish_on_it(frontends: Any) -> None:
    """tritonserver 2.51 (measured: an ensemble slow -> dbl, dbl unloaded while slow ran): the unload answers at
    once; the step and the ensemble show UNLOADING, refuse their clients (404) and take no new run, while the run
    under way still calls the step and is answered; then both are UNAVAILABLE."""
    held = _HeldDouble()

    def bind(triton: Triton) -> None:
        _bind_steps(triton, pre=held)

    with running_triton(bind, frontends=frontends) as triton, ThreadPoolExecutor(1) as pool:
        http = httpclient.InferenceServerClient(http_url(triton), network_timeout=30.0)
        held.hold.set()
        running = pool.submit(_http_infer, http_url(triton), "ens", ROWS)
        assert held.entered.wait(30), "the first step never ran"
        try:
            http.unload_model("cls", headers=HTTP_AUTH)  # was answered only once the run had ended
            index = {entry["name"]: entry["state"] for entry in http.get_model_repository_index(headers=HTTP_AUTH)}
            assert (index["ens"], index["cls"], index["pre"]) == ("UNLOADING", "UNLOADING", "READY")
            for model, array in (("cls", ROWS), ("ens", ROWS)):
                with pytest.raises(InferenceServerException) as refused:
                    _http_infer_named(http_url(triton), model, "X" if model == "cls" else "IN", array)
                assert refused.value.message() == f"Request for unknown model: '{model}' has no available versions"
        finally:
            held.release.set()
        assert running.result(30).as_numpy("OUT").tolist() == (ROWS * 2)[:, :3].tolist()
        wait_until(
            lambda: (
                {entry["name"]: entry["state"] for entry in http.get_model_repository_index(headers=HTTP_AUTH)}.get(
                    "cls"
                )
                == "UNAVAILABLE"
            ),
            "the step's unload to end",
        )
        assert not http.is_model_ready("ens")


def _http_infer_named(url: str, model: str, name: str, array: np.ndarray) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url)
    given = httpclient.InferInput(name, list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    return client.infer(model, [given])


STEPS = [
    EnsembleStep("pre", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "mid"}),
    EnsembleStep("cls", input_map={"X": "mid"}, output_map={"SCORES": "OUT"}),
]


def _step(model: str, inputs: Dict[str, str], outputs: Dict[str, str]) -> EnsembleStep:
    return EnsembleStep(model, input_map=inputs, output_map=outputs)


# Triton's words (model_config_utils.cc, ensemble_utils.cc, model_repository_manager.cc; the dependency errors as
# tritonserver 2.51 answered a repository load of such an ensemble).
BIND_ERRORS = [
    pytest.param([], "must specify 'step' for ensemble 'bad'", id="no-steps"),
    pytest.param(
        [_step("missing", {"INPUT": "IN"}, {"PRE_OUT": "OUT"})],
        "ensemble bad contains models that are not available or ambiguous: missing",
        id="unbound-step-model",
    ),
    pytest.param(  # a step model Triton cannot find is reported before the mapping errors of the steps before it
        [_step("pre", {"WRONG": "IN"}, {"PRE_OUT": "mid"}), _step("missing", {"X": "mid"}, {"SCORES": "OUT"})],
        "ensemble bad contains models that are not available or ambiguous: missing",
        id="unbound-step-model-after-a-bad-step",
    ),
    pytest.param(
        [EnsembleStep("pre", model_version=3, input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "mid"}), STEPS[1]],
        "ensemble 'bad' depends on 'pre' whose required version 3 is not loaded.",
        id="unbound-step-model-version",
    ),
    pytest.param(
        [_step("bad", {"IN": "IN"}, {"OUT": "OUT"})],
        "circular dependency between ensembles: bad -> ... -> bad -> bad",
        id="ensemble-runs-itself",
    ),
    pytest.param(
        [_step("pre", {"WRONG": "IN"}, {"PRE_OUT": "mid"}), STEPS[1]],
        "in ensemble bad, ensemble tensor IN is mapping to non-existing input WRONG in model pre",
        id="unknown-step-input",
    ),
    pytest.param(
        [STEPS[0], _step("cls", {"X": "mid"}, {"NOPE": "OUT"})],
        "in ensemble bad, ensemble tensor OUT is mapped from non-existing output NOPE in model cls",
        id="unknown-step-output",
    ),
    pytest.param(
        [STEPS[0], _step("cls", {"X": "mid"}, {"SCORES": "other"})],
        "ensemble output 'OUT' for ensemble bad' is not used",  # sic: Triton's quotes
        id="output-written-by-no-step",
    ),
    pytest.param(
        [STEPS[0], _step("cls", {"X": "mid"}, {"SCORES": "mid"})],
        "ensemble tensor 'mid' can appear in an output map only once for ensemble 'bad' step 1",
        id="tensor-written-twice",
    ),
    pytest.param(
        [
            _step("pre", {"INPUT": "loop"}, {"PRE_OUT": "mid"}),
            _step("cls", {"X": "mid"}, {"SCORES": "OUT"}),
            _step("left", {"INPUT": "mid"}, {"PRE_OUT": "loop"}),
        ],
        "ensemble input 'IN' for ensemble bad' is not used",  # sic
        id="input-not-used",
    ),
    pytest.param(
        [
            _step("pre", {"INPUT": "loop"}, {"PRE_OUT": "mid"}),
            _step("cls", {"X": "mid"}, {"SCORES": "OUT"}),
            _step("left", {"INPUT": "mid"}, {"PRE_OUT": "loop"}),
            _step("right", {"INPUT": "IN"}, {"NEG": "unused"}),
        ],
        "output 'OUT' for ensemble 'bad' is not written: at least one of its depending tensors, 'loop', is not "
        "connected",
        id="cycle",
    ),
    pytest.param(
        [_step("pre", {"INPUT": "IN"}, {"PRE_OUT": "mid"}), _step("add", {"A": "mid", "B": "IN"}, {"SUM": "OUT"})],
        "in ensemble bad, ensemble tensor OUT: inconsistent shape: [-1,3] is inferred from model bad while [-1,4] is "
        "inferred from model add",
        id="inconsistent-shape",
    ),
    pytest.param(
        [_step("pre", {"INPUT": "IN"}, {"PRE_OUT": "mid"}), _step("add", {"A": "mid"}, {"SUM": "OUT"})],
        "in ensemble bad, input B in model add is not mapped to any ensemble tensors",
        id="unmapped-step-input",
    ),
]


@pytest.mark.parametrize(("steps", "message"), BIND_ERRORS)
def test_a_bad_ensemble_is_refused_at_bind_in_tritons_words(
    server: Triton, steps: List[EnsembleStep], message: str
) -> None:
    with pytest.raises(PyTritonInvalidOperationError) as refused:
        server.bind_ensemble(
            "bad", steps, [_tensor("IN", 4)], [_tensor("OUT", 3)], config=ModelConfig(max_batch_size=8)
        )
    assert str(refused.value) == message
    with pytest.raises(InferenceServerException):
        httpclient.InferenceServerClient(http_url(server)).get_model_metadata("bad")


def test_an_ensemble_refuses_what_its_steps_own_and_larger_batches_than_they_take(server: Triton) -> None:
    with pytest.raises(PyTritonModelConfigError, match="cannot have decoupled"):
        server.bind_ensemble("bad", STEPS, [_tensor("IN", 4)], [_tensor("OUT", 3)], config=ModelConfig(decoupled=True))
    with pytest.raises(PyTritonInvalidOperationError) as too_large:
        server.bind_ensemble(
            "bad", STEPS, [_tensor("IN", 4)], [_tensor("OUT", 3)], config=ModelConfig(max_batch_size=16)
        )
    assert str(too_large.value) == (
        "ensemble bad allows maximum batch size 16, but it contains model pre which only allows maximum batch size "
        "to be 8"
    )


def test_a_remote_triton_refuses_an_ensemble_clearly() -> None:
    remote = RemoteTriton(url="http://127.0.0.1:1")
    with pytest.raises(PyTritonInvalidOperationError, match="a RemoteTriton binds no ensembles"):
        remote.bind_ensemble("ens", STEPS, [_tensor("IN", 4)], [_tensor("OUT", 3)])


@batch
def _process_double(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
    return {"PRE_OUT": INPUT * 2}


def _bind_with_processes(triton: Triton) -> None:
    _bind_steps(triton, pre=ProcessInstances(_process_double))


def test_process_instance_steps_behind_two_frontend_processes() -> None:
    with running_triton(_bind_with_processes, frontends=3) as triton:
        for _ in range(2):  # two connections: each frontend process may take one
            assert _http_infer(http_url(triton), "ens", ROWS).as_numpy("OUT").tolist() == [[0, 2, 4], [8, 10, 12]]
            assert _grpc_infer(grpc_url(triton), "ens", ROWS).as_numpy("OUT").tolist() == [[0, 2, 4], [8, 10, 12]]
        http = httpclient.InferenceServerClient(http_url(triton))
        assert http.get_model_config("ens")["platform"] == "ensemble"
        with pytest.raises(InferenceServerException) as failed:
            _grpc_infer(grpc_url(triton), "ens", -np.ones((1, 4), dtype=np.float32))
        assert failed.value.message() == "in ensemble 'ens', ValueError: negative input"
        stats = http.get_inference_statistics("ens", headers=HTTP_AUTH)["model_stats"][0]
        assert stats["inference_count"] == 8 and stats["execution_count"] == 4
        assert stats["inference_stats"]["fail"]["count"] == 2


def test_a_grpc_cancel_takes_the_ensembles_step_out_of_its_models_queue(server: Triton) -> None:
    url = http_url(server)
    GATED.gate.clear()
    given = httpclient.InferInput("INPUT", [1, 4], "FP32")
    given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    blocker = threading.Thread(target=lambda: httpclient.InferenceServerClient(url).infer("gated", [given]))
    blocker.start()
    try:
        wait_until(lambda: bool(_model(server, "gated").scheduler.open_requests[1]))
        client = grpcclient.InferenceServerClient(grpc_url(server))
        ensemble_input = grpcclient.InferInput("IN", [1, 4], "FP32")
        ensemble_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        answers: List[Any] = []
        call = client.async_infer("gated_ens", [ensemble_input], callback=lambda result, error: answers.append(error))
        wait_until(lambda: _model(server, "gated").scheduler.pending == 1)  # the ensemble's step waits there
        call.cancel()
        wait_until(lambda: _model(server, "gated").scheduler.pending == 0)
        wait_until(lambda: not _model(server, "gated_ens").scheduler.open_requests[1])
    finally:
        GATED.gate.set()
        blocker.join(10)
    assert len(answers) == 1 and "CANCELLED" in str(answers[0])


def _bind_cached(triton: Triton) -> None:
    cached = ModelConfig(max_batch_size=8, response_cache=True)
    triton.bind("pre", _double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=cached)
    triton.bind("cls", _classify, [_tensor("X", 4)], [_tensor("SCORES", 3)], config=ModelConfig(max_batch_size=8))
    triton.bind_ensemble("ens", STEPS, [_tensor("IN", 4)], [_tensor("OUT", 3)], config=ModelConfig(max_batch_size=8))


def test_a_step_the_response_cache_answers_ends_as_any_step() -> None:
    with running_triton(_bind_cached, cache_config=["local,size=1048576"]) as triton:
        for _ in range(2):
            assert _http_infer(http_url(triton), "ens", ROWS).as_numpy("OUT").tolist() == [[0, 2, 4], [8, 10, 12]]
        stats = httpclient.InferenceServerClient(http_url(triton)).get_inference_statistics("pre", headers=HTTP_AUTH)
        assert stats["model_stats"][0]["inference_stats"]["cache_hit"]["count"] == 1


class Watchful:
    """A step model whose call waits until its request is cancelled or the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.saw_cancel = threading.Event()
        self.release = threading.Event()

    def callable(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.entered.set()
        deadline = time.monotonic() + 10
        while not self.release.is_set() and time.monotonic() < deadline:
            if all(request.is_cancelled() for request in requests):
                self.saw_cancel.set()
                break
            time.sleep(0.005)
        return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


def _bind_watchful(watchful: Watchful) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8)
        triton.bind("watch_step", watchful.callable, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
        triton.bind_ensemble(
            "watch_ens",
            steps=[EnsembleStep("watch_step", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "OUT"})],
            inputs=[_tensor("IN", 4)],
            outputs=[_tensor("OUT", 4)],
            config=config,
        )

    return bind


def _fail_count(url: str, model: str) -> int:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model, headers=HTTP_AUTH)
    return int(stats["model_stats"][0]["inference_stats"]["fail"]["count"])


@pytest.mark.parametrize("frontends", [None, 3], ids=["one-process", "frontends"])
def test_an_http_client_that_disconnects_cancels_the_ensembles_running_step(frontends: Any) -> None:
    watchful = Watchful()
    with running_triton(_bind_watchful(watchful), frontends=frontends) as triton:
        url = http_url(triton)
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
        head = f"POST /v2/models/watch_ens/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", triton.http_port), timeout=10) as sock:
            sock.sendall(head.encode() + body.encode())
            assert watchful.entered.wait(10), "the step never ran"
        assert watchful.saw_cancel.wait(10), "the step never saw its request cancelled"
        wait_until(lambda: _fail_count(url, "watch_ens") == 2)  # counted twice, as any failed ensemble request
        # The step's own failure is counted once its callable has returned (after it saw the cancel), which may
        # come after the ensemble's: the loop counts the step's batch when the instance thread hands it back.
        wait_until(lambda: _fail_count(url, "watch_step") == 1)
        watchful.release.set()
        answer = _http_infer(url, "watch_ens", np.ones((1, 4), dtype=np.float32))
        assert answer.as_numpy("OUT").tolist() == [[2, 2, 2, 2]]


def test_an_http_client_that_disconnects_takes_the_ensembles_step_out_of_its_models_queue(server: Triton) -> None:
    url = http_url(server)
    GATED.gate.clear()
    given = httpclient.InferInput("INPUT", [1, 4], "FP32")
    given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    blocker = threading.Thread(target=lambda: httpclient.InferenceServerClient(url).infer("gated", [given]))
    blocker.start()
    try:
        wait_until(lambda: bool(_model(server, "gated").scheduler.open_requests[1]))
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
        head = f"POST /v2/models/gated_ens/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(head.encode() + body.encode())
            wait_until(lambda: _model(server, "gated").scheduler.pending == 1)  # the ensemble's step waits there
        wait_until(lambda: _model(server, "gated").scheduler.pending == 0)
        wait_until(lambda: not _model(server, "gated_ens").scheduler.open_requests[1])
    finally:
        GATED.gate.set()
        blocker.join(10)
    assert _http_infer(url, "gated_ens", ROWS).as_numpy("OUT").tolist() == (ROWS * 2).tolist()


class Ordered:
    """A step model with two priority levels whose calls wait at a gate, and the first input value of each call."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.seen: List[float] = []

    def callable(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        assert self.gate.wait(10)
        self.seen.extend(float(request["INPUT"][0, 0]) for request in requests)
        return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


ORDERED = Ordered()


class SequenceRecorder:
    """A step model with a sequence batcher: the sequence parameters of each request it ran."""

    def __init__(self) -> None:
        self.seen: List[Any] = []

    def callable(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.seen.extend((r.sequence_id, r.sequence_start, r.sequence_end) for r in requests)
        return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


SEQUENCES = SequenceRecorder()


def _bind_priority_and_sequence(triton: Triton) -> None:
    single = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(priority_levels=2, default_priority_level=2))
    triton.bind("ordered", ORDERED.callable, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=single)
    triton.bind_ensemble(
        "ordered_ens",
        steps=[EnsembleStep("ordered", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "OUT"})],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=ModelConfig(max_batch_size=1),
    )
    sequences = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher())
    triton.bind("seq_step", SEQUENCES.callable, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=sequences)
    triton.bind_ensemble(
        "seq_ens",
        steps=[EnsembleStep("seq_step", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "OUT"})],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind(
        "plain_double", _double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=ModelConfig(max_batch_size=4)
    )
    triton.bind_ensemble(
        "fan_free_ens",
        steps=[EnsembleStep("plain_double", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "OUT"})],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind_ensemble(  # an ensemble as a step: its answer's sequence parameters reach the outer answer
        "nested_ens",
        steps=[EnsembleStep("seq_ens", input_map={"IN": "IN"}, output_map={"OUT": "OUT"})],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=ModelConfig(max_batch_size=4),
    )


def test_the_requests_priority_goes_to_its_steps() -> None:
    with running_triton(_bind_priority_and_sequence) as triton:
        url = http_url(triton)
        ordered = _model(triton, "ordered").scheduler
        ORDERED.gate.clear()
        results: List[Any] = []

        def infer(model: str, name: str, value: float, priority: int) -> None:
            given = httpclient.InferInput(name, [1, 4], "FP32")
            given.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
            results.append(httpclient.InferenceServerClient(url).infer(model, [given], priority=priority))

        threads = [threading.Thread(target=infer, args=("ordered", "INPUT", 0.0, 0))]
        try:
            threads[0].start()
            wait_until(lambda: bool(ordered.open_requests[1]))  # the first runs, held at the gate
            threads.append(threading.Thread(target=infer, args=("ordered", "INPUT", 1.0, 0)))  # level 2, the default
            threads[-1].start()
            wait_until(lambda: ordered.pending == 1)
            threads.append(threading.Thread(target=infer, args=("ordered_ens", "IN", 2.0, 1)))  # level 1
            threads[-1].start()
            wait_until(lambda: ordered.pending == 2)
        finally:
            ORDERED.gate.set()
            for thread in threads:
                thread.join(10)
        assert len(results) == 3
        assert ORDERED.seen == [0.0, 2.0, 1.0]  # the ensemble's step, at its request's priority, ran first


def test_the_requests_sequence_parameters_go_to_its_steps() -> None:
    with running_triton(_bind_priority_and_sequence) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        SEQUENCES.seen.clear()
        given = httpclient.InferInput("IN", [1, 4], "FP32")
        given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        client.infer("seq_ens", [given], sequence_id=7, sequence_start=True)
        client.infer("seq_ens", [given], sequence_id=7, sequence_end=True)
        assert SEQUENCES.seen == [(7, True, False), (7, False, True)]


def test_an_ensemble_answers_with_its_requests_sequence_parameters_over_http_and_grpc() -> None:
    # tritonserver 2.51, an ensemble of python-backend steps asked with sequence parameters:
    # {"sequence_id":42,"sequence_start":true,"sequence_end":false} over HTTP (once per output: JSON keeps one);
    # sequence_id "abc" with sequence_end: string_param "abc", bool_param false, bool_param true over gRPC.
    with running_triton(_bind_priority_and_sequence) as triton:
        http = httpclient.InferenceServerClient(http_url(triton))
        grpc = grpcclient.InferenceServerClient(grpc_url(triton))
        given = httpclient.InferInput("IN", [1, 4], "FP32")
        given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        for model in ("seq_ens", "nested_ens"):  # an ensemble step's answer carries the same parameters on
            answer = http.infer(model, [given], sequence_id=42, sequence_start=True)
            assert answer.get_response()["parameters"] == {
                "sequence_id": 42,
                "sequence_start": True,
                "sequence_end": False,
            }
            assert answer.as_numpy("OUT").tolist() == [[2, 2, 2, 2]]
            grpc_given = grpcclient.InferInput("IN", [1, 4], "FP32")
            grpc_given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            result = grpc.infer(model, [grpc_given], sequence_id="abc", sequence_start=True, sequence_end=True)
            parameters = result.get_response(as_json=True)["parameters"]
            assert parameters == {
                "sequence_id": {"string_param": "abc"},
                "sequence_start": {"bool_param": True},
                "sequence_end": {"bool_param": True},
            }
        # generate: the ensemble's parameters among the sorted keys, as tritonserver 2.51's
        # {"OUT":[2.0,2.0,2.0,2.0],"model_name":...,"sequence_end":false,"sequence_id":0,"sequence_start":false}
        # (a flat list: Triton counts a value's elements by its length, so [[1, 1, 1, 1]] fits no shape [-1, 4])
        generated = http._post("v2/models/fan_free_ens/generate", json.dumps({"IN": [1, 1, 1, 1]}), {}, None)
        document = json.loads(generated.read())
        assert list(document) == sorted(document)
        assert {key: document[key] for key in ("sequence_id", "sequence_start", "sequence_end")} == {
            "sequence_id": 0,
            "sequence_start": False,
            "sequence_end": False,
        }


def _fan(requests: List[Request]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Decoupled: as many responses as the first element of a request's INPUT, the i-th adding i."""
    for index in range(int(max(request["INPUT"][0] for request in requests))):
        yield [{"FANNED": request["INPUT"] + index} for request in requests if index < request["INPUT"][0]]


def _increment(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [{"Y": request["X"] + 1} for request in requests]


def _bind_decoupled(triton: Triton, fan: Any = _fan) -> None:
    """`fan` (decoupled) then `inc`; `fan_last`: `fan` alone; `fan_mixed`: reads `fan`'s and the request's tensors."""
    unbatched = ModelConfig(batching=False)
    triton.bind(
        "fan", fan, [_tensor("INPUT", 2)], [_tensor("FANNED", 2)], config=ModelConfig(batching=False, decoupled=True)
    )
    triton.bind("inc", _increment, [_tensor("X", 2)], [_tensor("Y", 2)], config=unbatched)
    triton.bind_ensemble(
        "fan_ens",
        steps=[
            EnsembleStep("fan", input_map={"INPUT": "IN"}, output_map={"FANNED": "mid"}),
            EnsembleStep("inc", input_map={"X": "mid"}, output_map={"Y": "OUT"}),
        ],
        inputs=[_tensor("IN", 2)],
        outputs=[_tensor("OUT", 2)],
        config=unbatched,
    )
    triton.bind_ensemble(
        "fan_last",
        steps=[EnsembleStep("fan", input_map={"INPUT": "IN"}, output_map={"FANNED": "OUT"})],
        inputs=[_tensor("IN", 2)],
        outputs=[_tensor("OUT", 2)],
        config=unbatched,
    )


class _Stream:
    """A tritonclient gRPC stream whose callbacks land in a list, read once the stream is closed."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.items: List[Any] = []
        self.client.start_stream(callback=lambda result, error: self.items.append(error if error else result))

    def ask(self, model: str, values: List[float], **options: Any) -> None:
        given = grpcclient.InferInput("IN", [len(values)], "FP32")
        given.set_data_from_numpy(np.array(values, dtype=np.float32))
        self.client.async_stream_infer(model, [given], enable_empty_final_response=True, **options)

    def close(self) -> List[Any]:
        self.client.stop_stream()  # waits until the server ended the stream
        self.client.close()
        return self.items


def _answers(items: List[Any]) -> List[Any]:
    """Each stream response as (OUT or None, whether final, sequence_id)."""
    answers = []
    for item in items:
        assert not isinstance(item, Exception), item
        parameters = item.get_response().parameters
        out = item.as_numpy("OUT").tolist() if item.get_response().outputs else None
        sequence = parameters["sequence_id"].int64_param if "sequence_id" in parameters else None
        answers.append((out, parameters["triton_final_response"].bool_param, sequence))
    return answers


@pytest.mark.parametrize("frontends", [None, 3], ids=["one-process", "frontends"])
def test_a_decoupled_step_streams_each_response_through_the_steps_after_it(frontends: Any) -> None:
    # tritonserver 2.51, the same ensembles of python-backend steps: the config says decoupled; a stream answers
    # once per response of the decoupled step, each carried through the steps after it; the last answer is final
    # when no step runs any more, else an empty final response follows (as after a decoupled step's last one).
    fan = ProcessInstances(_fan) if frontends else _fan
    with running_triton(lambda triton: _bind_decoupled(triton, fan), frontends=frontends) as triton:
        http = httpclient.InferenceServerClient(http_url(triton))
        for model in ("fan_ens", "fan_last"):
            config = http.get_model_config(model)
            assert config["model_transaction_policy"] == {"decoupled": True}
        stream = _Stream(grpc_url(triton))
        stream.ask("fan_last", [3, 10], request_id="a")
        stream.ask("fan_ens", [2, 10], request_id="b", sequence_id=9, sequence_start=True)
        stream.ask("fan_ens", [0, 10], request_id="c")
        items = stream.close()
        by_id: Dict[str, List[Any]] = {}
        for item in items:
            assert not isinstance(item, Exception), item
            by_id.setdefault(item.get_response().id, []).append(item)
        assert _answers(by_id["a"]) == [
            ([3, 10], False, 0),
            ([4, 11], False, 0),
            ([5, 12], False, 0),
            (None, True, None),
        ]
        fanned = _answers(by_id["b"])
        assert [out for out, _, _ in fanned if out is not None] == [[3, 11], [4, 12]]
        assert [final for _, final, _ in fanned] in ([False, True], [False, False, True])
        assert all(sequence == 9 for out, _, sequence in fanned if out is not None)
        assert _answers(by_id["c"]) == [(None, True, None)]  # no response from the decoupled step: the end alone
        stats = http.get_inference_statistics("fan_ens", headers=HTTP_AUTH)["model_stats"][0]
        assert stats["inference_count"] == 2 and stats["inference_stats"]["fail"]["count"] == 0


class _FanThenFail:
    """Decoupled: INPUT, then INPUT + 1, then (once `gate` is set) ValueError("fan failed")."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, requests: List[Request]) -> Iterator[List[Dict[str, np.ndarray]]]:
        for index in range(2):
            yield [{"FANNED": request["INPUT"] + index} for request in requests]
        self.gate.wait(30)
        raise ValueError("fan failed")


@pytest.mark.parametrize("frontends", [None, 3], ids=["one-process", "frontends"])
def test_a_decoupled_step_that_fails_mid_stream_ends_the_ensembles_stream_with_its_error(frontends: Any) -> None:
    # tritonserver 2.51, an ensemble of a decoupled python-backend step that sends two responses, then an error
    # response, then a plain step: the stream answers what went through the steps, then the error "in ensemble
    # 'e_err', fan failed", which ends the request (no empty final response); generate_stream answers the events,
    # then `data: {"error":"in ensemble 'e_err', fan failed"}`. The error is the ensemble's failure.
    fan = _FanThenFail()
    with running_triton(lambda triton: _bind_decoupled(triton, fan), frontends=frontends) as triton:
        stream = _Stream(grpc_url(triton))
        stream.ask("fan_ens", [5, 10], request_id="a")
        wait_until(lambda: len(stream.items) == 2, "the fanned responses through `inc`")
        fan.gate.set()
        wait_until(lambda: len(stream.items) == 3, "the step's error")
        given = grpcclient.InferInput("X", [2], "FP32")
        given.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
        stream.client.async_stream_infer("inc", [given], request_id="b")  # the stream still serves
        items = stream.close()
        assert _answers(items[:2]) == [([6, 11], False, 0), ([7, 12], False, 0)]
        assert isinstance(items[2], InferenceServerException)
        assert items[2].message() == "in ensemble 'fan_ens', ValueError: fan failed"
        assert len(items) == 4 and items[3].get_response().id == "b" and items[3].as_numpy("Y").tolist() == [2, 3]

        fan.gate.clear()
        connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
        connection.request("POST", "/v2/models/fan_ens/generate_stream", json.dumps({"IN": [5, 10]}))
        response = connection.getresponse()
        assert response.status == 200
        events = [response.readline(), response.readline(), response.readline(), response.readline()]
        fan.gate.set()
        events += [response.readline(), response.readline()]
        connection.close()
        assert [json.loads(line[len(b"data: ") :])["OUT"] for line in events[0:4:2]] == [[6, 11], [7, 12]]
        assert events[4] == b'data: {"error":"in ensemble \'fan_ens\', ValueError: fan failed"}\n'

        client = httpclient.InferenceServerClient(http_url(triton))
        statistics = {
            name: client.get_inference_statistics(name, headers=HTTP_AUTH)["model_stats"][0]
            for name in ("fan_ens", "inc")
        }
        assert statistics["fan_ens"]["inference_stats"]["success"]["count"] == 0
        # Twice a request, as tritonserver 2.51 counted it when no step was left running (its `e_err_last`: 2 for 1).
        assert statistics["fan_ens"]["inference_stats"]["fail"]["count"] == 4
        assert statistics["inc"]["inference_stats"]["success"]["count"] == 5  # 2 + 2 through the steps, 1 direct


def test_a_decoupled_ensemble_refuses_single_response_calls_in_tritons_words() -> None:
    with running_triton(_bind_decoupled) as triton:
        http = httpclient.InferenceServerClient(http_url(triton))
        given = httpclient.InferInput("IN", [2], "FP32")
        given.set_data_from_numpy(np.array([2, 10], dtype=np.float32))
        with pytest.raises(InferenceServerException, match="HTTP end point doesn't support models with decoupled"):
            http.infer("fan_ens", [given])
        grpc_given = grpcclient.InferInput("IN", [2], "FP32")
        grpc_given.set_data_from_numpy(np.array([2, 10], dtype=np.float32))
        with pytest.raises(InferenceServerException, match="ModelInfer RPC doesn't support models with decoupled"):
            grpcclient.InferenceServerClient(grpc_url(triton)).infer("fan_ens", [grpc_given])
        # generate takes one response (tritonserver 2.51's words for more), generate_stream each of them
        one = http._post("v2/models/fan_ens/generate", json.dumps({"IN": [1, 10]}), {}, None)
        assert json.loads(one.read())["OUT"] == [2, 11]
        two = http._post("v2/models/fan_ens/generate", json.dumps({"IN": [2, 10]}), {}, None)
        assert json.loads(two.read()) == {
            "error": "generate expects model to produce exactly 1 response, use generate stream for model that "
            "generates various number of responses"
        }
        streamed = http._post("v2/models/fan_ens/generate_stream", json.dumps({"IN": [2, 10]}), {}, None).read()
        events = [json.loads(line[len(b"data: ") :]) for line in streamed.split(b"\n") if line.startswith(b"data: ")]
        assert [event["OUT"] for event in events] == [[3, 11], [4, 12]]


def test_a_step_that_reads_tensors_of_two_decoupled_origins_is_refused_in_tritons_words() -> None:
    # tritonserver 2.51: "in ensemble ens_mix, step of model 'ens_mix' receives inputs originated from different
    # decoupled models" (the step's output is the ensemble's, so Triton names the ensemble).
    with running_triton(_bind_decoupled) as triton:
        mixed = [
            EnsembleStep("fan", input_map={"INPUT": "IN"}, output_map={"FANNED": "fanned"}),
            EnsembleStep("inc", input_map={"X": "IN"}, output_map={"Y": "plain"}),
            EnsembleStep("add2", input_map={"A": "fanned", "B": "plain"}, output_map={"SUM": "OUT"}),
        ]
        triton.bind(
            "add2", _add, [_tensor("A", 2), _tensor("B", 2)], [_tensor("SUM", 2)], config=ModelConfig(batching=False)
        )
        with pytest.raises(PyTritonInvalidOperationError) as refused:
            triton.bind_ensemble(
                "ens_mix", mixed, [_tensor("IN", 2)], [_tensor("OUT", 2)], config=ModelConfig(batching=False)
            )
        assert (
            "in ensemble ens_mix, step of model 'ens_mix' receives inputs originated from different decoupled models"
            in str(refused.value)
        )
        two_origins = [
            EnsembleStep("fan", input_map={"INPUT": "IN"}, output_map={"FANNED": "OUT"}),
            EnsembleStep("inc", input_map={"X": "IN"}, output_map={"Y": "OTHER"}),
        ]
        with pytest.raises(PyTritonInvalidOperationError) as refused:
            triton.bind_ensemble(
                "ens_dec2",
                two_origins,
                [_tensor("IN", 2)],
                [_tensor("OUT", 2), _tensor("OTHER", 2)],
                config=ModelConfig(batching=False),
            )
        assert (
            "in ensemble ens_dec2, step of model 'ens_dec2' receives inputs originated from different decoupled models"
            in str(refused.value)
        )


def _sleep_then_double(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    time.sleep(float(requests[0]["INPUT"][0, 0]))  # runs past the request's timeout: only a queue applies it
    return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


QUEUE_TIMEOUTS = ModelConfig(
    max_batch_size=1,
    batcher=DynamicBatcher(
        default_queue_policy=QueuePolicy(default_timeout_microseconds=100_000_000, allow_timeout_override=True)
    ),
)


def _bind_timeouts(triton: Triton) -> None:
    triton.bind("sleepy", _sleep_then_double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=QUEUE_TIMEOUTS)
    triton.bind("gated_q", GATED.callable, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=QUEUE_TIMEOUTS)
    triton.bind_ensemble(
        "timed_ens",
        steps=[
            EnsembleStep("sleepy", input_map={"INPUT": "IN"}, output_map={"PRE_OUT": "mid"}),
            EnsembleStep("gated_q", input_map={"INPUT": "mid"}, output_map={"PRE_OUT": "OUT"}),
        ],
        inputs=[_tensor("IN", 4)],
        outputs=[_tensor("OUT", 4)],
        config=ModelConfig(max_batch_size=1),
    )


def test_the_request_timeout_applies_to_each_steps_queue_not_to_the_whole_ensemble() -> None:
    # tritonserver 2.51, two steps whose queue policy allows the request's timeout: a request that runs 1.2 s with
    # timeout 0.6 s answers; one whose second step waits in its queue past the timeout fails "in ensemble
    # 'ens_slowq', Request timeout expired".
    with running_triton(_bind_timeouts) as triton:
        url = http_url(triton)
        client = httpclient.InferenceServerClient(url)
        GATED.gate.set()
        slow = httpclient.InferInput("IN", [1, 4], "FP32")
        slow.set_data_from_numpy(np.full((1, 4), 0.3, dtype=np.float32))
        answer = client.infer("timed_ens", [slow], timeout=100_000)  # the first step alone runs 0.3 s
        assert answer.as_numpy("OUT").tolist() == (np.full((1, 4), 0.3, dtype=np.float32) * 4).tolist()
        GATED.gate.clear()
        given = httpclient.InferInput("INPUT", [1, 4], "FP32")
        given.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        blocker = threading.Thread(target=lambda: httpclient.InferenceServerClient(url).infer("gated_q", [given]))
        blocker.start()
        try:
            wait_until(lambda: bool(_model(triton, "gated_q").scheduler.open_requests[1]))
            quick = httpclient.InferInput("IN", [1, 4], "FP32")
            quick.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
            with pytest.raises(InferenceServerException) as expired:
                client.infer("timed_ens", [quick], timeout=200_000)  # its second step waits behind the blocker
            assert expired.value.message() == "in ensemble 'timed_ens', Request timeout expired"
        finally:
            GATED.gate.set()
            blocker.join(10)


@batch
def _first_of_two(X: np.ndarray) -> Dict[str, np.ndarray]:
    return {"Y1": X * 2}  # Y2 is declared and left out


@batch
def _plus_hundred(X: np.ndarray) -> Dict[str, np.ndarray]:
    return {"Y": X + 100}


def _bind_partial(triton: Triton) -> None:
    """`partial` declares Y1 and Y2 and returns Y1 only: `miss_out` returns Y2, `miss_mid` feeds it to `ident`."""
    config = ModelConfig(max_batch_size=8)
    triton.bind("partial", _first_of_two, [_tensor("X", 4)], [_tensor("Y1", 4), _tensor("Y2", 4)], config=config)
    triton.bind("ident", _plus_hundred, [_tensor("X", 4)], [_tensor("Y", 4)], config=config)
    outputs = [_tensor("O1", 4), _tensor("O2", 4)]
    triton.bind_ensemble(
        "miss_out",
        [_step("partial", {"X": "IN"}, {"Y1": "O1", "Y2": "O2"})],
        [_tensor("IN", 4)],
        outputs,
        config=config,
    )
    steps = [_step("partial", {"X": "IN"}, {"Y1": "O1", "Y2": "mid"}), _step("ident", {"X": "mid"}, {"Y": "O2"})]
    triton.bind_ensemble("miss_mid", steps, [_tensor("IN", 4)], outputs, config=config)


ONE_ROW = np.arange(4, dtype=np.float32).reshape(1, 4)


def _post_infer(triton: Triton, model: str, outputs: Any = None) -> Any:
    """POST a one-row infer request; the HTTP status and the document answered."""
    body: Dict[str, Any] = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]}
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    request = urllib.request.Request(
        f"http://{http_url(triton)}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("frontends", [None, 3], ids=["one-process", "frontends"])
def test_an_output_a_step_leaves_out_is_left_out_of_the_answer_or_fails_the_step_that_reads_it(frontends: Any) -> None:
    # tritonserver 2.51 with a python-backend step that answers Y1 only (and nvidia-pytriton's callable alike):
    # the ensemble answers 200 without O2 (asked for O2 alone: no outputs, no parameters); a step that reads
    # the missing tensor fails the request as a request without that input: 400 / INVALID_ARGUMENT.
    with running_triton(_bind_partial, frontends=frontends) as triton:
        status, document = _post_infer(triton, "miss_out")
        assert status == 200 and [output["name"] for output in document["outputs"]] == ["O1"]
        assert document["outputs"][0]["data"] == [0.0, 2.0, 4.0, 6.0]
        assert document["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
        assert _post_infer(triton, "miss_out", ["O2"]) == (
            200,
            {"model_name": "miss_out", "model_version": "1", "outputs": []},
        )
        grpc = grpcclient.InferenceServerClient(grpc_url(triton))
        given = grpcclient.InferInput("IN", [1, 4], "FP32")
        given.set_data_from_numpy(ONE_ROW)
        answer = grpc.infer("miss_out", [given], outputs=[grpcclient.InferRequestedOutput("O2")], request_id="abc")
        assert answer.get_response(as_json=True) == {"model_name": "miss_out", "model_version": "1", "id": "abc"}
        assert grpc.infer("miss_out", [given]).as_numpy("O1").tolist() == (ONE_ROW * 2).tolist()
        over_http = _http_infer(http_url(triton), "miss_out", ONE_ROW)
        assert over_http.as_numpy("O1").tolist() == (ONE_ROW * 2).tolist() and over_http.as_numpy("O2") is None

        missing = (
            "expected 1 inputs but got 0 inputs for model 'ident'. Got input(s) [], but missing required input(s) "
            "['X']. Please provide all required input(s)."
        )
        for outputs in (None, ["O2"]):
            assert _post_infer(triton, "miss_mid", outputs) == (
                400,
                {"error": f"in ensemble 'miss_mid', [request id: <id_unknown>] {missing}"},
            )
        with pytest.raises(InferenceServerException) as refused:
            grpc.infer("miss_mid", [given], request_id="req-7")
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert refused.value.message() == f"in ensemble 'miss_mid', [request id: req-7] {missing}"
        status, document = _post_infer(triton, "miss_mid", ["O1"])  # `ident` is not run for O1
        assert status == 200 and [output["name"] for output in document["outputs"]] == ["O1"]

        stats = {
            entry["name"]: entry
            for entry in httpclient.InferenceServerClient(http_url(triton)).get_inference_statistics(
                "", headers=HTTP_AUTH
            )["model_stats"]
        }
        # As Triton counted them: the partial step succeeded each time; `ident` never ran; each of the three
        # failed ensemble requests counts twice.
        assert stats["partial"]["inference_stats"]["success"]["count"] == 9
        assert stats["ident"]["execution_count"] == 0 and stats["ident"]["inference_stats"]["fail"]["count"] == 0
        assert stats["miss_mid"]["inference_stats"]["fail"]["count"] == 6
        assert stats["miss_mid"]["inference_stats"]["success"]["count"] == 1
        assert stats["miss_out"]["inference_stats"]["success"]["count"] == 5


def _optional_or_default(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [{"Y": request["X"] + 100 if "X" in request else np.full((1, 4), -7, np.float32)} for request in requests]


def _bind_optional(triton: Triton) -> None:
    """`opt` (batching) and `opt_nb` (without) have an optional X; `miss_opt` feeds `opt` what `partial` leaves out."""
    config = ModelConfig(max_batch_size=8)
    triton.bind("partial", _first_of_two, [_tensor("X", 4)], [_tensor("Y1", 4), _tensor("Y2", 4)], config=config)
    triton.bind("opt", _optional_or_default, [_tensor("X", 4, optional=True)], [_tensor("Y", 4)], config=config)
    triton.bind(
        "opt_nb",
        _optional_or_default,
        [Tensor(name="X", dtype=np.float32, shape=(1, 4), optional=True)],
        [Tensor(name="Y", dtype=np.float32, shape=(1, 4))],
        config=ModelConfig(batching=False),
    )
    steps = [_step("partial", {"X": "IN"}, {"Y1": "O1", "Y2": "mid"}), _step("opt", {"X": "mid"}, {"Y": "O2"})]
    triton.bind_ensemble("miss_opt", steps, [_tensor("IN", 4)], [_tensor("O1", 4), _tensor("O2", 4)], config=config)


def test_a_request_without_inputs_to_a_batching_model_fails_as_in_triton_also_as_an_ensemble_step() -> None:
    # tritonserver 2.51 reads a batching model's batch size off its first input: a request without inputs (the
    # model's only input is optional) answers 400 / INVALID_ARGUMENT and counts a failure (reason BACKEND) without
    # running the model, sent by a client or by an ensemble whose earlier step left that input's tensor out. A
    # model without batching runs it.
    no_inputs = "out of bounds index 0: request has 0 inputs"
    with running_triton(_bind_optional) as triton:
        for document, named in (({"inputs": []}, "<id_unknown>"), ({"id": "q1", "inputs": []}, "q1")):
            status, answer = post_json(triton.http_port, "/v2/models/opt/infer", document)
            assert (status, answer) == (400, {"error": f"[request id: {named}] {no_inputs}"})
        grpc = grpcclient.InferenceServerClient(grpc_url(triton))
        with pytest.raises(InferenceServerException) as refused:
            grpc.infer("opt", [])
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert refused.value.message() == f"[request id: <id_unknown>] {no_inputs}"
        status, answer = post_json(triton.http_port, "/v2/models/opt_nb/infer", {"inputs": []})
        assert status == 200 and answer["outputs"][0]["data"] == [-7.0] * 4
        assert _post_infer(triton, "miss_opt") == (
            400,
            {"error": f"in ensemble 'miss_opt', [request id: <id_unknown>] {no_inputs}"},
        )
        stats = httpclient.InferenceServerClient(http_url(triton)).get_inference_statistics("opt", headers=HTTP_AUTH)
        opt = stats["model_stats"][0]
        assert opt["inference_stats"]["fail"]["count"] == 4 and opt["execution_count"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=10) as scraped:
            metrics = scraped.read().decode()
        assert 'nv_inference_request_failure{model="opt",reason="BACKEND",version="1"} 4' in metrics


class SlowBranch:
    """The slow step of a fork: waits at a gate, and tells whether its request was cancelled meanwhile."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.saw_cancel = False

    def callable(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        assert self.gate.wait(10), "the test never let the slow step go"
        self.saw_cancel = self.saw_cancel or any(request.is_cancelled() for request in requests)
        return [{"Y": request["X"] + 1} for request in requests]


@batch
def _fail_at_once(X: np.ndarray) -> Dict[str, np.ndarray]:
    raise ValueError("fast step failed")


def _bind_fork(slow: SlowBranch) -> Callable[[Triton], None]:
    """`fork`: `fast` (fails) writes OA from IN; `slow` then `after` write OB from IN, through `mid`."""

    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8)
        triton.bind("fast", _fail_at_once, [_tensor("X", 4)], [_tensor("Y", 4)], config=config)
        triton.bind("slow", slow.callable, [_tensor("X", 4)], [_tensor("Y", 4)], config=config)
        triton.bind("after", _plus_hundred, [_tensor("X", 4)], [_tensor("Y", 4)], config=config)
        triton.bind_ensemble(
            "fork",
            [
                _step("fast", {"X": "IN"}, {"Y": "OA"}),
                _step("slow", {"X": "IN"}, {"Y": "mid"}),
                _step("after", {"X": "mid"}, {"Y": "OB"}),
            ],
            [_tensor("IN", 4)],
            [_tensor("OA", 4), _tensor("OB", 4)],
            config=config,
        )

    return bind


@pytest.mark.parametrize("frontends", [None, 3], ids=["one-process", "frontends"])
def test_a_step_that_fails_answers_at_once_while_the_other_running_steps_finish(frontends: Any) -> None:
    # tritonserver 2.51, `fast` raising after 20 ms beside a `slow` step of 300 ms: the error came after 22 ms
    # (HTTP 500 / INTERNAL "in ensemble 'fork', " and the step's message); `slow` still ran and counted a
    # success; `after`, which reads only what `slow` wrote, never ran; the ensemble counted the failure once
    # (a failure with no step left running counts twice).
    slow = SlowBranch()
    with running_triton(_bind_fork(slow), frontends=frontends) as triton:
        url = http_url(triton)
        http = httpclient.InferenceServerClient(url)

        def stats(name: str) -> Dict[str, Any]:
            return http.get_inference_statistics(name, headers=HTTP_AUTH)["model_stats"][0]  # type: ignore[no-any-return]

        try:
            with pytest.raises(InferenceServerException) as over_http:
                _http_infer(url, "fork", ONE_ROW)
            # Answered while `slow` waits at its gate (it may not even have been called yet).
            assert stats("slow")["inference_stats"]["success"]["count"] == 0
            with pytest.raises(InferenceServerException) as over_grpc:
                _grpc_infer(grpc_url(triton), "fork", ONE_ROW)
        finally:
            slow.gate.set()
        assert over_http.value.status() == "500"
        assert over_http.value.message() == "in ensemble 'fork', ValueError: fast step failed"
        assert over_grpc.value.status() == "StatusCode.INTERNAL"
        assert over_grpc.value.message() == "in ensemble 'fork', ValueError: fast step failed"
        wait_until(lambda: stats("slow")["inference_stats"]["success"]["count"] == 2, "the slow steps' successes")
        wait_until(lambda: _model(triton, "fork").scheduler.open_requests == (0, 0), "the ensemble's runs to end")
        assert not slow.saw_cancel and stats("slow")["inference_stats"]["fail"]["count"] == 0
        assert stats("after")["execution_count"] == 0
        assert stats("fork")["inference_stats"]["fail"]["count"] == 2
        assert _post_infer(triton, "fork", ["OA"])[0] == 500  # `fast` alone runs: counted twice
        assert stats("fork")["inference_stats"]["fail"]["count"] == 4
        # tritonserver 2.51's metrics gave every one of these failures the reason OTHER.
        with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        assert 'nv_inference_request_failure{model="fork",reason="OTHER",version="1"} 4' in metrics
        assert 'nv_inference_request_failure{model="fork",reason="BACKEND",version="1"} 0' in metrics
        status, document = _post_infer(triton, "fork", ["OB"])
        assert status == 200 and document["outputs"][0]["data"] == [101.0, 102.0, 103.0, 104.0]


def _no_batch_double(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [{"PRE_OUT": request["INPUT"] * 2} for request in requests]


def _bind_batching_interplay(triton: Triton) -> None:
    """Ensembles with and without batching over steps with and without batching (`nb`: INPUT [4] -> PRE_OUT [4])."""
    config = ModelConfig(max_batch_size=8)
    no_batching = ModelConfig(batching=False)
    triton.bind("pre", _double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=config)
    triton.bind("cls", _classify, [_tensor("X", 4)], [_tensor("SCORES", 3)], config=config)
    triton.bind("nb", _no_batch_double, [_tensor("INPUT", 4)], [_tensor("PRE_OUT", 4)], config=no_batching)
    triton.bind_ensemble("unbatched_over_batching", STEPS, [_tensor("IN", 4)], [_tensor("OUT", 3)], config=no_batching)
    over_nb = [_step("nb", {"INPUT": "IN"}, {"PRE_OUT": "OUT"})]
    triton.bind_ensemble("batched_over_nb", over_nb, [_tensor("IN", 4)], [_tensor("OUT", 4)], config=config)


def test_tensors_cross_between_batching_and_non_batching_models_as_in_triton() -> None:
    # tritonserver 2.51 (python-backend steps): an ensemble without batching hands its [4] input to a batching
    # step as [1,4] and answers the [1,3] its last step wrote as [3]; a batching ensemble hands a batch of 1 to a
    # step without batching without its batch dimension and answers the step's [4] as [1,4]. A batch of 2 goes as
    # it is, and that step refuses it. Each is one execution of batch size 1 in the ensemble's statistics.
    with running_triton(_bind_batching_interplay) as triton:
        for infer in (_http_infer, _grpc_infer):
            url = http_url(triton) if infer is _http_infer else grpc_url(triton)
            answered = infer(url, "unbatched_over_batching", np.arange(4, dtype=np.float32)).as_numpy("OUT")
            assert answered.shape == (3,) and answered.tolist() == [0, 2, 4]
            answered = infer(url, "batched_over_nb", ROWS[:1]).as_numpy("OUT")
            assert answered.shape == (1, 4) and answered.tolist() == [[0, 2, 4, 6]]
            with pytest.raises(InferenceServerException) as refused:
                infer(url, "batched_over_nb", ROWS)
            assert refused.value.message() == (
                "in ensemble 'batched_over_nb', [request id: <id_unknown>] unexpected shape for input 'INPUT' for "
                "model 'nb'. Expected [4], got [2,4]. "
            )
        http = httpclient.InferenceServerClient(http_url(triton))
        for name in ("unbatched_over_batching", "batched_over_nb"):
            stats = http.get_inference_statistics(name, headers=HTTP_AUTH)["model_stats"][0]
            assert stats["inference_count"] == 2 and stats["execution_count"] == 2
            assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(1, 2)]
        nb = http.get_inference_statistics("nb", headers=HTTP_AUTH)["model_stats"][0]
        assert nb["inference_count"] == 2 and nb["inference_stats"]["fail"]["count"] == 0


def _bind_nested(triton: Triton) -> None:
    """`ens` (pre, cls: max_batch_size 8) and `deep`, an ensemble with `ens` as its step (named to sort first)."""
    _bind_steps(triton)
    triton.bind_ensemble(
        "deep",
        [_step("ens", {"IN": "IN"}, {"OUT": "OUT"})],
        [_tensor("IN", 4)],
        [_tensor("OUT", 3)],
        config=ModelConfig(max_batch_size=4),
    )


def test_a_step_model_loaded_with_a_smaller_batch_unloads_the_ensembles_it_breaks_as_in_triton() -> None:
    # tritonserver 2.51, `pre` loaded with a config override of max_batch_size 4 under `ens` (8): the load answered
    # 200; `ens` and the ensembles over it were unloaded (UNAVAILABLE, "unloaded"; its log: "ensemble ens allows
    # maximum batch size 8, but it contains model pre which only allows maximum batch size to be 4"), and a load of
    # `ens` then answered 400 {"error": "load failed for model 'ens': <that message>\n"}.
    with running_triton(_bind_nested) as triton:
        port = triton.http_port
        assert port is not None
        override = {"parameters": {"config": json.dumps({"max_batch_size": 4})}}
        assert post_json(port, "/v2/repository/models/pre/load", override, HTTP_AUTH) == (200, None)
        _, index = post_json(port, "/v2/repository/index", {}, HTTP_AUTH)
        states = {entry["name"]: (entry["state"], entry.get("reason", "")) for entry in index}
        assert states["ens"] == states["deep"] == ("UNAVAILABLE", "unloaded")
        assert states["pre"] == states["cls"] == ("READY", "")
        with pytest.raises(InferenceServerException, match="has no available versions"):
            _http_infer(http_url(triton), "ens", ROWS)
        message = (
            "ensemble ens allows maximum batch size 8, but it contains model pre which only allows maximum batch "
            "size to be 4"
        )
        assert post_json(port, "/v2/repository/models/ens/load", {}, HTTP_AUTH) == (
            400,
            {"error": f"load failed for model 'ens': {message}\n"},
        )
        assert post_json(port, "/v2/repository/models/pre/load", {}, HTTP_AUTH) == (200, None)  # 8 again
        assert post_json(port, "/v2/repository/models/ens/load", {}, HTTP_AUTH) == (200, None)
        assert _http_infer(http_url(triton), "deep", ROWS).as_numpy("OUT").tolist() == [[0, 2, 4], [8, 10, 12]]


def test_unloading_a_step_model_unloads_the_ensembles_over_its_ensembles_too_and_a_load_brings_them_back() -> None:
    # tritonserver 2.51: an ensemble whose only step is another ensemble went UNAVAILABLE ("unloaded") with the
    # inner one when a step model of the inner one was unloaded, and came back with it when that model was loaded.
    with running_triton(_bind_nested) as triton:
        port = triton.http_port
        assert port is not None

        def states() -> Dict[str, Any]:
            _, index = post_json(port, "/v2/repository/index", {}, HTTP_AUTH)
            return {entry["name"]: (entry["state"], entry.get("reason", "")) for entry in index}

        assert post_json(port, "/v2/repository/models/pre/unload", {}, HTTP_AUTH) == (200, None)
        wait_until(lambda: states()["pre"] == ("UNAVAILABLE", "unloaded"))
        assert states()["ens"] == states()["deep"] == ("UNAVAILABLE", "unloaded")
        with pytest.raises(InferenceServerException) as refused:
            _http_infer(http_url(triton), "deep", ROWS)
        assert refused.value.message() == "Request for unknown model: 'deep' has no available versions"
        assert post_json(port, "/v2/repository/models/pre/load", {}, HTTP_AUTH) == (200, None)
        assert states()["ens"] == states()["deep"] == ("READY", "")
        assert _http_infer(http_url(triton), "deep", ROWS).as_numpy("OUT").tolist() == [[0, 2, 4], [8, 10, 12]]


def _bind_tap(triton: Triton) -> None:
    """`tap`: `pre` writes MID, an output of the ensemble that `cls` reads to write OUT."""
    _bind_steps(triton)
    steps = [_step("pre", {"INPUT": "IN"}, {"PRE_OUT": "MID"}), _step("cls", {"X": "MID"}, {"SCORES": "OUT"})]
    outputs = [_tensor("MID", 4), _tensor("OUT", 3)]
    triton.bind_ensemble("tap", steps, [_tensor("IN", 4)], outputs, config=ModelConfig(max_batch_size=8))


def test_a_request_for_an_output_a_step_also_reads_runs_the_steps_it_needs() -> None:
    # A deliberate difference (docs/migration.md): tritonserver 2.51 answers such a request naming MID or OUT alone
    # 400 "unexpected deadlock, ..." without running a step; here the steps those outputs need run.
    with running_triton(_bind_tap) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        given = httpclient.InferInput("IN", [1, 4], "FP32")
        given.set_data_from_numpy(ROWS[:1])
        both = client.infer("tap", [given])
        assert [output["name"] for output in both.get_response()["outputs"]] == ["MID", "OUT"]
        mid = client.infer("tap", [given], outputs=[httpclient.InferRequestedOutput("MID")])
        assert [output["name"] for output in mid.get_response()["outputs"]] == ["MID"]
        assert mid.as_numpy("MID").tolist() == [[0, 2, 4, 6]]
        out = client.infer("tap", [given], outputs=[httpclient.InferRequestedOutput("OUT")])
        assert out.as_numpy("OUT").tolist() == [[0, 2, 4]]
        counts = {
            name: client.get_inference_statistics(name, headers=HTTP_AUTH)["model_stats"][0]["inference_count"]
            for name in ("pre", "cls", "tap")
        }
        assert counts == {"pre": 3, "cls": 2, "tap": 3}  # MID alone needs `pre` only
