"""Model warm-up (ModelConfig.model_warmup): run by the engine on every instance before the model is ready.

nvidia-pytriton 0.7.0, measured here: a model with `ModelWarmup(name="w1", batch_size=2, inputs={"x":
WarmupInput(dtype=np.float32, shape=(3,), zero_data=True)}, count=2)` had its callable called twice with one
Request whose "x" was float32 zeros of shape (2, 3) before the model loaded; a warm-up callable that raised
was logged ("Warmup request 1 failed for inference function 0: warm-up broke") and the model loaded anyway;
the model's config showed "model_warmup": [].
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, ModelWarmup, Tensor, WarmupInput
from pytriton.model_config.common import generate_warmup_data, generate_warmup_requests
from pytriton.triton import Triton, TritonConfig
from tests.http_helpers import get_json, post_json, request

VECTOR = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUTPUT = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
INFER = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}


def _zeros(count: int = 2, batch_size: int = 2) -> List[ModelWarmup]:
    inputs = {"x": WarmupInput(dtype=np.float32, shape=(3,), zero_data=True)}
    return [ModelWarmup(name="w1", batch_size=batch_size, inputs=inputs, count=count)]


class Recorder:
    """A callable remembering what each call got (thread-safe: instances run in their own threads)."""

    def __init__(self, fail: bool = False, gate: Any = None) -> None:
        self.calls: List[Dict[str, Any]] = []
        self.fail = fail
        self.gate = gate
        self.lock = threading.Lock()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            for item in requests:
                self.calls.append({key: value.copy() for key, value in item.items()})
        if self.fail:
            raise RuntimeError("warm-up broke")
        return [{"y": item["x"]} for item in requests]


def _server(**config: Any) -> Triton:
    return Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False, **config))


def test_warm_up_runs_before_the_model_is_ready_and_config_shows_none() -> None:
    model = Recorder()
    with _server() as triton:
        triton.bind(
            "m", model, inputs=VECTOR, outputs=OUTPUT, config=ModelConfig(max_batch_size=8, model_warmup=_zeros())
        )
        assert len(model.calls) == 2  # bind returns once a model bound while serving is warm
        for call in model.calls:
            assert call["x"].dtype == np.float32 and call["x"].shape == (2, 3) and not call["x"].any()
        assert request(triton.http_port, "GET", "/v2/models/m/ready")[0] == 200
        assert get_json(triton.http_port, "/v2/models/m/config")[1]["model_warmup"] == []
        assert post_json(triton.http_port, "/v2/models/m/infer", INFER)[0] == 200
        token = {"triton-access-token": triton.get_access_token() or ""}
        stats = get_json(triton.http_port, "/v2/models/m/stats", token)[1]["model_stats"][0]
        assert stats["inference_count"] == 1 and stats["execution_count"] == 1  # warm-up is not counted


def test_every_instance_is_warmed_before_run_returns() -> None:
    first, second = Recorder(), Recorder()
    config = ModelConfig(max_batch_size=8, model_warmup=_zeros(count=3))
    triton = _server()
    try:
        triton.bind("m", [first, second], inputs=VECTOR, outputs=OUTPUT, config=config)
        triton.run()
        assert len(first.calls) == 3 and len(second.calls) == 3
    finally:
        triton.stop()


def test_a_failing_warm_up_is_logged_and_the_model_serves(caplog: pytest.LogCaptureFixture) -> None:
    model = Recorder(fail=True)
    with _server() as triton, caplog.at_level(logging.WARNING, logger="pytriton"):
        triton.bind("m", model, inputs=VECTOR, outputs=OUTPUT, config=ModelConfig(model_warmup=_zeros(count=1)))
        assert request(triton.http_port, "GET", "/v2/models/m/ready")[0] == 200
    assert "model 'm': warmup request 1 failed for inference function 0: RuntimeError: warm-up broke" in caplog.text


def test_the_model_is_not_ready_while_it_warms_up() -> None:
    gate = threading.Event()
    model = Recorder(gate=gate)
    with _server() as triton:
        port = triton.http_port
        binding = threading.Thread(
            target=triton.bind,
            args=("m", model, VECTOR, OUTPUT),
            kwargs={"config": ModelConfig(model_warmup=_zeros(count=1))},
        )
        binding.start()
        try:
            deadline = threading.Event()
            while request(port, "GET", "/v2/models/m")[0] != 200 and not deadline.wait(0.01):
                pass  # bound, warming up
            assert request(port, "GET", "/v2/models/m/ready")[0] == 400
            assert request(port, "GET", "/v2/health/ready")[0] == 400  # strict readiness: every model ready
            token = {"triton-access-token": triton.get_access_token() or ""}
            index = post_json(port, "/v2/repository/index", {}, token)[1]
            assert index == [{"name": "m", "version": "1", "state": "LOADING"}]  # Triton writes no empty reason
            status, document = post_json(port, "/v2/models/m/infer", INFER)
            assert status == 503 and "not ready" in document["error"]
        finally:
            gate.set()
            binding.join(10)
        assert request(port, "GET", "/v2/models/m/ready")[0] == 200


def test_decoupled_models_warm_up_through_their_generator() -> None:
    steps: List[int] = []

    def stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        for step in range(3):
            steps.append(step)
            yield [{"y": item["x"]} for item in requests]

    with _server() as triton:
        config = ModelConfig(decoupled=True, model_warmup=_zeros(count=1))
        triton.bind("m", stream, inputs=VECTOR, outputs=OUTPUT, config=config)
        assert steps == [0, 1, 2]


def test_warm_up_data_sources(tmp_path: Any) -> None:
    with pytest.raises(PyTritonBadParameterError, match="One of 'zero_data', 'random_data', or 'input_data_file'"):
        generate_warmup_data(WarmupInput(dtype=np.float32, shape=(2,)), 1)
    assert generate_warmup_data(WarmupInput(dtype=np.int64, shape=(2, 2), zero_data=True), 3).shape == (3, 2, 2)
    small = generate_warmup_data(WarmupInput(dtype=np.int8, shape=(64,), random_data=True), 4)
    assert small.dtype == np.int8 and small.shape == (4, 64)
    floats = generate_warmup_data(WarmupInput(dtype=np.float16, shape=(5,), random_data=True), 2)
    assert floats.dtype == np.float16 and ((floats >= 0) & (floats < 1)).all()
    flags = generate_warmup_data(WarmupInput(dtype=np.bool_, shape=(3,), random_data=True), 2)
    assert flags.dtype == np.bool_
    words = generate_warmup_data(WarmupInput(dtype=np.bytes_, shape=(2,), random_data=True), 2)
    assert words.shape == (2, 2) and all(8 <= len(word) <= 32 for word in words.flat)
    sample = tmp_path / "sample.npy"
    np.save(sample, np.arange(3, dtype=np.float64))
    from_file = generate_warmup_data(WarmupInput(dtype=np.float32, shape=(3,), input_data_file=str(sample)), 2)
    assert from_file.dtype == np.float32 and from_file.tolist() == [[0, 1, 2], [0, 1, 2]]
    rows = tmp_path / "rows.npy"
    np.save(rows, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert generate_warmup_data(WarmupInput(dtype=np.float32, shape=(3,), input_data_file=str(rows)), 3).shape == (3, 3)
    with pytest.raises(PyTritonBadParameterError, match="doesn't match expected shape"):
        generate_warmup_data(WarmupInput(dtype=np.float32, shape=(4,), input_data_file=str(rows)), 1)
    requests = generate_warmup_requests(_zeros(count=2, batch_size=1), [], [])
    assert len(requests) == 2 and requests[0]["x"].shape == (1, 3)
