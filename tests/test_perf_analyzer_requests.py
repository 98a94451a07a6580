"""What perf_analyzer asks of the server, reproduced with tritonclient: the answers and statistics it reads.

perf_analyzer (Triton's measuring client) prints the server's side of each request from the statistics
extension: queue, compute input, compute infer, compute output. These tests send its requests the way it does
(its `--streaming` mode: one gRPC stream, each request asking for the empty final response) and check the
statistics it derives the breakdown from, with the engine in the server's process and behind frontend
processes.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, grpc_url

STEP_S = 0.005  # each step of the decoupled model sleeps this long: its compute infer is at least that much
STEPS = 3
REQUESTS = 4
TIMEOUT_S = 30.0


def repeat(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """A decoupled model: STEPS responses per request, each after STEP_S of work."""
    for _ in range(STEPS):
        time.sleep(STEP_S)
        yield [{"OUT": request["IN"]} for request in requests]


def bind_repeat(triton: Triton) -> None:
    triton.bind(
        model_name="repeat",
        infer_func=repeat,
        inputs=[Tensor(name="IN", dtype=np.int32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.int32, shape=(-1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )


Item = Tuple[Optional[grpcclient.InferResult], Optional[Exception]]


def stream_like_perf_analyzer(url: str, model: str, requests: int) -> List[Item]:
    """Send `requests` one after another on one stream, as `perf_analyzer --streaming` does; all answers."""
    items: queue.Queue[Item] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    answers: List[Item] = []
    try:
        client.start_stream(callback=lambda result, error: items.put((result, error)))
        for index in range(requests):
            data = np.arange(4, dtype=np.int32) + index
            infer_input = grpcclient.InferInput("IN", list(data.shape), "INT32")
            infer_input.set_data_from_numpy(data)
            client.async_stream_infer(model, [infer_input], request_id=str(index), enable_empty_final_response=True)
            while True:  # the next request goes once this one's final (empty) response came
                result, error = items.get(timeout=TIMEOUT_S)
                answers.append((result, error))
                if error is not None or result is None:
                    break
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
        client.stop_stream()
    finally:
        client.close()
    return answers


def model_stats(url: str, model: str) -> Dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    try:
        stats: Dict[str, Any] = client.get_inference_statistics(model, headers=GRPC_AUTH, as_json=True)
    finally:
        client.close()
    return dict(stats["model_stats"][0])


@pytest.mark.parametrize("frontends", [None, 3], ids=["in-process", "frontends=3"])
def test_decoupled_model_statistics_split_its_run(
    start_triton: Callable[..., Triton], frontends: Optional[int]
) -> None:
    """A decoupled model's compute infer and output are its run, not zero (perf_analyzer showed it all as overhead)."""
    triton = start_triton(bind_repeat, frontends=frontends)
    url = grpc_url(triton)
    answers = stream_like_perf_analyzer(url, "repeat", REQUESTS)
    assert [error for _, error in answers if error is not None] == []
    assert len(answers) == REQUESTS * (STEPS + 1)  # each request's steps, then its empty final response

    stats = model_stats(url, "repeat")
    inference = stats["inference_stats"]
    assert int(inference["success"]["count"]) == REQUESTS
    for name in ("compute_input", "compute_infer", "compute_output"):
        assert int(inference[name]["count"]) == REQUESTS, name
    infer_ns = int(inference["compute_infer"]["ns"])
    output_ns = int(inference["compute_output"].get("ns", 0))
    assert infer_ns >= REQUESTS * STEPS * STEP_S * 1e9  # every step's work, counted once per request
    assert output_ns > 0  # the responses were checked and sent
    parts = sum(int(inference[name].get("ns", 0)) for name in ("queue", "compute_input", "compute_infer"))
    assert parts + output_ns <= int(inference["success"]["ns"])  # the parts of a request fit in its time

    (batch,) = stats["batch_stats"]  # one request per execution: the same times as the requests'
    assert int(batch["batch_size"]) == 1
    assert int(batch["compute_infer"]["ns"]) == infer_ns
    assert int(batch["compute_output"]["ns"]) == output_ns
