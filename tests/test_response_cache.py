"""The response cache as tritonserver 2.51 (nvidia-pytriton 0.7) keeps it: what it answers, what it counts.

Side by side with nvidia-pytriton 0.7 (`cache_config=["local,size=1048576"]`, `ModelConfig(response_cache=True)`):
a stream's request to a model that is not decoupled is looked up and cached as a plain request; requests alike
that missed together count one miss (the others' insertions find the key there: no miss, no hit).
"""

from __future__ import annotations

import concurrent.futures
import math
import queue
import threading
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.exceptions import PyTritonValidationError
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.runtime.options import resolve_options
from pytriton.triton import Triton, TritonConfig
from tests.conftest import grpc_url
from tests.test_metrics import infer, labels, model_stats, rows, sample, scrape, wait_for_pending

VECTOR = [Tensor(name="in", dtype=np.float32, shape=(-1,))]
VECTOR_OUT = [Tensor(name="out", dtype=np.float32, shape=(-1,))]
CACHE = ["local,size=1048576"]


class Counted:
    """A callable that doubles its inputs and counts the batches it ran; `gate`, when set, holds each batch."""

    def __init__(self, gate: Optional[threading.Event] = None) -> None:
        self.batches: List[int] = []
        self.entered = threading.Event()
        self.gate = gate

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        self.batches.append(len(requests))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        return [{"out": r["in"] * 2} for r in requests]


def _bind(model: Callable[[List[Any]], List[Dict[str, np.ndarray]]]) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8, response_cache=True)
        triton.bind("cached", model, inputs=VECTOR, outputs=VECTOR_OUT, config=config)

    return bind


def doubled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's input doubled (for ProcessInstances: importable by name)."""
    return [{"out": r["in"] * 2} for r in requests]


def _stream_once(triton: Triton, data: np.ndarray) -> np.ndarray:
    """One request on a gRPC stream of its own (ModelStreamInfer); its one response's output."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("in", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.async_stream_infer("cached", [tensor], request_id="s")
        answer = answers.get(timeout=30)
        client.stop_stream()
    finally:
        client.close()
    assert not isinstance(answer, Exception), answer
    assert answer.get_response().id == "s"
    output = answer.as_numpy("out")
    assert output is not None
    return output  # type: ignore[no-any-return]


@pytest.mark.parametrize("frontends", [None, 3])
def test_a_stream_request_to_a_cached_model_is_looked_up_and_cached(
    start_triton: Callable[..., Triton], frontends: Optional[int]
) -> None:
    # tritonserver 2.51 looks a stream's request up in its scheduler as any other: the second stream request and
    # the plain one after it were hits (its stream's miss answered "response output count mismatch", the response
    # cached all the same). This server ran every stream request and cached none.
    model = Counted()
    triton = start_triton(_bind(model), cache_config=CACHE, frontends=frontends)
    data = rows(1, 3.0)
    for _ in range(2):
        assert np.array_equal(_stream_once(triton, data), data * 2)
    assert np.array_equal(infer(triton, "cached", data), data * 2)
    assert model.batches == [1]
    inference = model_stats(triton, "cached")["inference_stats"]
    counts = {key: inference[key]["count"] for key in ("success", "cache_hit", "cache_miss", "compute_infer")}
    assert counts == {"success": 3, "cache_hit": 2, "cache_miss": 1, "compute_infer": 1}


def test_a_stream_request_to_a_cached_model_in_instance_processes_is_looked_up(
    start_triton: Callable[..., Triton],
) -> None:
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8, response_cache=True)
        triton.bind("cached", ProcessInstances(doubled), inputs=VECTOR, outputs=VECTOR_OUT, config=config)

    triton = start_triton(bind, cache_config=CACHE)
    data = rows(1, 4.0)
    assert np.array_equal(infer(triton, "cached", data), data * 2)
    for _ in range(2):
        assert np.array_equal(_stream_once(triton, data), data * 2)
    stats = model_stats(triton, "cached")
    inference = stats["inference_stats"]
    counts = {key: inference[key]["count"] for key in ("success", "cache_hit", "cache_miss")}
    assert (counts, stats["execution_count"]) == ({"success": 3, "cache_hit": 2, "cache_miss": 1}, 1)


def test_requests_alike_that_missed_together_count_one_miss(start_triton: Callable[..., Triton]) -> None:
    # nvidia-pytriton 0.7, six requests alike at once: one ran alone, five in one batch after it; cache_miss +1,
    # cache_hit +0, success +6 (the five insertions found the key there: ALREADY_EXISTS counts nothing). The
    # server-wide gauges count the six lookups that missed.
    gate = threading.Event()
    model = Counted(gate)
    triton = start_triton(_bind(model), cache_config=CACHE)
    data = rows(1, 5.0)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(infer, triton, "cached", data)
        assert model.entered.wait(30)
        alike = [pool.submit(infer, triton, "cached", data) for _ in range(2)]
        wait_for_pending(triton, "cached", 2)
        gate.set()
        for future in (first, *alike):
            assert np.array_equal(future.result(30), data * 2)
    assert model.batches == [1, 2]
    stats = model_stats(triton, "cached")
    inference = stats["inference_stats"]
    counts = {key: inference[key]["count"] for key in ("success", "cache_hit", "cache_miss")}
    assert counts == {"success": 3, "cache_hit": 0, "cache_miss": 1}
    families = scrape(triton)
    assert sample(families, "nv_cache_num_misses_per_model", **labels("cached")) == 1
    assert sample(families, "nv_cache_num_misses") == 3
    assert sample(families, "nv_cache_num_entries") == 1


def _bind_two_outputs(model: Callable[..., Any]) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        outputs = [
            Tensor(name="double", dtype=np.float32, shape=(-1,)),
            Tensor(name="plus", dtype=np.float32, shape=(-1,)),
        ]
        config = ModelConfig(max_batch_size=8, response_cache=True)
        triton.bind("two", model, inputs=VECTOR, outputs=outputs, config=config)

    return bind


def _ask(triton: Triton, data: np.ndarray, outputs: List[str]) -> Dict[str, Any]:
    """One gRPC request of model `two` asking for `outputs`: the outputs its response has, by name."""
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        tensor = grpcclient.InferInput("in", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        asked = [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = client.infer("two", [tensor], outputs=asked)
        return {o.name: result.as_numpy(o.name).tolist() for o in result.get_response().outputs}
    finally:
        client.close()


def test_a_request_gets_the_outputs_it_asked_for_and_the_shapes_it_sent(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 hashes input names and bytes only: after a request asking for `double`, one asking for
    # `plus` got `double` alone (tritonclient's as_numpy("plus"): None), and after [[1, 2, 3]] the rows
    # [[1], [2], [3]] got the outputs in shape [1, 3]. Here each is answered as without the cache.
    batches: List[int] = []

    def two(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        batches.append(len(requests))
        return [{"double": r["in"] * 2, "plus": r["in"] + 1} for r in requests]

    triton = start_triton(_bind_two_outputs(two), cache_config=CACHE)
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    assert _ask(triton, data, ["double"]) == {"double": [[2.0, 4.0, 6.0]]}
    assert _ask(triton, data, ["plus"]) == {"plus": [[2.0, 3.0, 4.0]]}
    assert _ask(triton, data, ["double"]) == {"double": [[2.0, 4.0, 6.0]]}  # a hit
    both = {"double": [[2.0, 4.0, 6.0]], "plus": [[2.0, 3.0, 4.0]]}
    assert _ask(triton, data, ["double", "plus"]) == both
    assert _ask(triton, data, ["plus", "double", "plus"]) == both  # a hit: every output, in the callable's order
    assert _ask(triton, data.reshape(3, 1), ["double"]) == {"double": [[2.0], [4.0], [6.0]]}
    assert batches == [1, 1, 1, 1]
    inference = model_stats(triton, "two")["inference_stats"]
    assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (2, 4)


def test_the_cache_holds_the_bytes_of_tritonservers_local_cache(start_triton: Callable[..., Triton]) -> None:
    # nvidia-pytriton 0.7 with `local,size=30000`, answers of 2 x 1000 FP32 (8,128 bytes a block there): three fit,
    # nv_cache_util 0.817066 (128 + 3 x 8128 bytes); of 2 x 10 FP32, 208 bytes a block. A request that was the
    # least recently used is evicted first: 0, 1, 2, 0 (a hit), 3 evicts 1, then 0 is a hit and 1 a miss.
    batches: List[int] = []

    def two(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        batches.append(len(requests))
        return [{"double": r["in"] * 2, "plus": r["in"] + 1} for r in requests]

    triton = start_triton(_bind_two_outputs(two), cache_config=["local,size=30000"])
    ran = []
    for value in (0, 1, 2, 0, 3, 0, 1):
        before = len(batches)
        _ask(triton, np.full((1, 1000), value, dtype=np.float32), ["double", "plus"])
        ran.append(len(batches) - before)
    assert ran == [1, 1, 1, 0, 1, 0, 1]
    families = scrape(triton)
    assert sample(families, "nv_cache_num_entries") == 3
    assert sample(families, "nv_cache_num_evictions") == 2
    assert math.isclose(sample(families, "nv_cache_util"), (128 + 3 * 8128) / 30000)
    for value in range(12):
        _ask(triton, np.full((1, 10), 100 + value, dtype=np.float32), ["double", "plus"])
    families = scrape(triton)  # 15 fit: 128 + 3 x 8128 + 12 x 208 bytes
    assert (sample(families, "nv_cache_num_entries"), sample(families, "nv_cache_num_evictions")) == (15, 2)
    assert math.isclose(sample(families, "nv_cache_util"), (128 + 3 * 8128 + 12 * 208) / 30000)


@pytest.mark.parametrize("frontends", [None, 3])
def test_a_queued_stream_request_to_a_cached_model_leaves_the_queue_when_cancelled(
    start_triton: Callable[..., Triton], frontends: Optional[int]
) -> None:
    # The stream's request waits behind a running one; the client cancels the stream: it leaves the queue
    # (CANCELED), the callable never sees it, and nothing is cached for it.
    gate = threading.Event()
    model = Counted(gate)
    triton = start_triton(_bind(model), cache_config=CACHE, frontends=frontends)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(infer, triton, "cached", rows(1, 1.0))
        assert model.entered.wait(30)
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        try:
            client.start_stream(callback=lambda result, error: None)
            tensor = grpcclient.InferInput("in", [1, 2], "FP32")
            tensor.set_data_from_numpy(rows(1, 2.0))
            client.async_stream_infer("cached", [tensor])
            wait_for_pending(triton, "cached", 1)
            client.stop_stream(cancel_requests=True)
            wait_for_pending(triton, "cached", 0)
        finally:
            client.close()
        gate.set()
        first.result(30)
    assert model.batches == [1]
    failures = {s.labels["reason"]: s.value for s in scrape(triton)["nv_inference_request_failure"].samples}
    assert failures["CANCELED"] == 1
    assert sample(scrape(triton), "nv_cache_num_entries") == 1


@pytest.mark.parametrize("size", ["0", "-1", "100", "191"])
def test_a_cache_smaller_than_tritonservers_smallest_is_refused(size: str) -> None:
    # tritonserver 2.51 (measured): below `local,size=192` it does not start ("Failed to initialize LocalCache");
    # this server took size=0 as no cache (a model bound with response_cache served uncached) and 100 as a cache.
    with pytest.raises(PyTritonValidationError, match="needs a size of at least 192 bytes"):
        resolve_options(TritonConfig(cache_config=[f"local,size={size}"]))


def test_a_response_larger_than_the_cache_is_served_and_never_cached(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 with `local,size=192`: both requests missed, both were answered, and nothing was cached.
    model = Counted()
    triton = start_triton(_bind(model), cache_config=["local,size=192"])
    for _ in range(2):
        assert infer(triton, "cached", rows(1, 3.0)).tolist() == [[6.0, 6.0]]
    stats = model_stats(triton, "cached")["inference_stats"]
    assert (stats["cache_hit"]["count"], stats["cache_miss"]["count"], len(model.batches)) == (0, 2, 2)
    assert sample(scrape(triton), "nv_cache_num_entries") == 0


def test_a_hit_answers_what_the_callable_returned_then(start_triton: Callable[..., Triton]) -> None:
    # tritonserver copies a response into its cache. This one kept the callable's arrays: a callable that writes
    # its answers into one buffer made every hit answer the last request's output (after [1, 1] -> [2, 2] and
    # [2, 2] -> [4, 4], [1, 1] again got [4, 4]).
    reused = np.zeros((1, 2), dtype=np.float32)

    def doubled_in_one_buffer(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        answers = []
        for request in requests:
            reused[...] = request["in"] * 2
            answers.append({"out": reused})
        return answers

    triton = start_triton(_bind(doubled_in_one_buffer), cache_config=CACHE)
    for value in (1.0, 2.0, 1.0, 2.0):
        assert infer(triton, "cached", rows(1, value)).tolist() == [[value * 2] * 2]
    inference = model_stats(triton, "cached")["inference_stats"]
    assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (2, 2)
