"""The Prometheus endpoint: Triton's names and labels, counts equal to the statistics extension, options."""

from __future__ import annotations

import concurrent.futures
import math
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.options.server import DEFAULT_SUMMARY_QUANTILES
from pytriton.runtime.options import resolve_options
from pytriton.transport.metrics.exposition import Family, render
from pytriton.transport.metrics.host import HostMonitor
from pytriton.transport.metrics.latency import Histogram, ModelLatencies, SlidingSummary
from pytriton.triton import Triton, TritonConfig
from tests.conftest import HTTP_AUTH, grpc_url, http_url
from tests.http_helpers import get_json, request

Families = Dict[str, Metric]
LATENCY_COUNTERS = {
    "nv_inference_request_duration_us": "success",
    "nv_inference_queue_duration_us": "queue",
    "nv_inference_compute_input_duration_us": "compute_input",
    "nv_inference_compute_infer_duration_us": "compute_infer",
    "nv_inference_compute_output_duration_us": "compute_output",
}
SUMMARIES = {
    "nv_inference_request_summary_us": "success",
    "nv_inference_queue_summary_us": "queue",
    "nv_inference_compute_input_summary_us": "compute_input",
    "nv_inference_compute_infer_summary_us": "compute_infer",
    "nv_inference_compute_output_summary_us": "compute_output",
}
CPU_FAMILIES = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")
VECTOR = [Tensor(name="in", dtype=np.float32, shape=(-1,))]
VECTOR_OUT = [Tensor(name="out", dtype=np.float32, shape=(-1,))]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU metrics are read from /proc")


def _echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": r["in"]} for r in requests]


def _fail_on_negative(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    if any((r["in"] < 0).any() for r in requests):
        raise ValueError("negative input")
    return _echo(requests)


def _bind_echo(triton: Triton, name: str = "echo", **config: Any) -> None:
    triton.bind(name, _echo, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(max_batch_size=8, **config))


def scrape(triton: Triton) -> Families:
    """GET /metrics and parse it with prometheus_client."""
    assert triton.metrics_port is not None
    status, headers, body = request(triton.metrics_port, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def sample(families: Families, name: str, suffix: str = "", **labels: str) -> float:
    """The value of the one sample of `name` (plus a `_count`/`_sum`/`_bucket` suffix) with these labels."""
    family = families[name]
    wanted = {name + suffix} if suffix else {name, name + "_total"}
    found = [s.value for s in family.samples if s.name in wanted and s.labels == labels]
    assert len(found) == 1, f"{name}{suffix}{labels}: {family.samples}"
    return found[0]


def model_stats(triton: Triton, model: str) -> Dict[str, Any]:
    """The statistics extension's entry for version 1 of a model, over HTTP."""
    assert triton.http_port is not None
    status, document = get_json(triton.http_port, f"/v2/models/{model}/versions/1/stats", HTTP_AUTH)
    assert status == 200
    (entry,) = document["model_stats"]
    return entry  # type: ignore[no-any-return]


def infer(triton: Triton, model: str, data: np.ndarray) -> np.ndarray:
    """One inference over HTTP with a fresh client."""
    client = httpclient.InferenceServerClient(http_url(triton))
    try:
        tensor = httpclient.InferInput("in", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor])
        output = result.as_numpy("out")
        assert output is not None
        return output
    finally:
        client.close()


def rows(count: int, value: float = 1.0) -> np.ndarray:
    """A batch of `count` rows of two values."""
    return np.full((count, 2), value, dtype=np.float32)


def labels(model: str) -> Dict[str, str]:
    """Triton's per-model labels for version 1."""
    return {"model": model, "version": "1"}


def assert_matches_statistics(families: Families, stats: Dict[str, Any], model: str) -> None:
    """Counters equal the statistics extension (durations: nanoseconds // 1000)."""
    inference = stats["inference_stats"]
    assert sample(families, "nv_inference_request_success", **labels(model)) == inference["success"]["count"]
    failures = sum(
        sample(families, "nv_inference_request_failure", **labels(model), reason=reason)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    )
    assert failures == inference["fail"]["count"]
    assert sample(families, "nv_inference_count", **labels(model)) == stats["inference_count"]
    assert sample(families, "nv_inference_exec_count", **labels(model)) == stats["execution_count"]
    for family, key in LATENCY_COUNTERS.items():
        assert sample(families, family, **labels(model)) == inference[key]["ns"] // 1000, family


def test_counts_match_statistics(start_triton: Callable[..., Triton]) -> None:
    def bind(triton: Triton) -> None:
        _bind_echo(triton)
        triton.bind("flaky", _fail_on_negative, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(max_batch_size=8))

    triton = start_triton(bind)
    infer(triton, "echo", rows(2))
    infer(triton, "echo", rows(1))
    infer(triton, "echo", rows(1))
    infer(triton, "flaky", rows(1))
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="negative input"):
            infer(triton, "flaky", rows(1, -1.0))

    families = scrape(triton)
    assert sample(families, "nv_inference_request_success", **labels("echo")) == 3
    assert sample(families, "nv_inference_count", **labels("echo")) == 4
    assert sample(families, "nv_inference_exec_count", **labels("echo")) == 3
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert sample(families, "nv_inference_request_failure", **labels("echo"), reason=reason) == 0
    assert sample(families, "nv_inference_request_success", **labels("flaky")) == 1
    assert sample(families, "nv_inference_request_failure", **labels("flaky"), reason="BACKEND") == 2
    assert sample(families, "nv_inference_request_failure", **labels("flaky"), reason="REJECTED") == 0
    assert sample(families, "nv_inference_pending_request_count", **labels("echo")) == 0
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert families["nv_inference_request_success"].type == "counter"
    for model in ("echo", "flaky"):
        assert_matches_statistics(families, model_stats(triton, model), model)
    assert sample(families, "nv_inference_request_duration_us", **labels("echo")) > 0


def test_failure_labels_in_triton_order(start_triton: Callable[..., Triton]) -> None:
    # prometheus-cpp writes a series' labels sorted by name: tritonserver 2.51 sends reason between model and version.
    triton = start_triton(_bind_echo)
    assert triton.metrics_port is not None
    _, _, body = request(triton.metrics_port, "GET", "/metrics")
    assert 'nv_inference_request_failure{model="echo",reason="BACKEND",version="1"} 0\n' in body.decode()


def test_a_failed_execution_has_compute_times(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51's batch_stats of a callable that raised: compute_input, _infer and _output all over 0 ns.
    def bind(triton: Triton) -> None:
        triton.bind("flaky", _fail_on_negative, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(max_batch_size=8))

    triton = start_triton(bind)
    with pytest.raises(InferenceServerException, match="negative input"):
        infer(triton, "flaky", rows(2, -1.0))
    (batch,) = model_stats(triton, "flaky")["batch_stats"]
    assert batch["batch_size"] == 2
    for key in ("compute_input", "compute_infer", "compute_output"):
        assert batch[key]["count"] == 1 and batch[key]["ns"] > 0, key


def test_queue_full_is_no_failure(start_triton: Callable[..., Triton]) -> None:
    running = threading.Event()
    release = threading.Event()

    def gated(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        running.set()
        assert release.wait(60)
        return _echo(requests)

    def bind(triton: Triton) -> None:
        batcher = DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=1))
        triton.bind("gated", gated, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(batcher=batcher))

    triton = start_triton(bind)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        try:
            executing = pool.submit(infer, triton, "gated", rows(1))
            assert running.wait(30)
            queued = pool.submit(infer, triton, "gated", rows(1))
            wait_for_pending(triton, "gated", 1)
            with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
                infer(triton, "gated", rows(1))
        finally:
            release.set()
        executing.result(30)
        queued.result(30)

    families = scrape(triton)
    assert sample(families, "nv_inference_request_success", **labels("gated")) == 2
    # tritonserver 2.51 counts no failure for a request its full queue refused (REJECTED: timed out in the queue).
    for reason in ("REJECTED", "BACKEND", "OTHER", "CANCELED"):
        assert sample(families, "nv_inference_request_failure", **labels("gated"), reason=reason) == 0
    assert model_stats(triton, "gated")["inference_stats"]["fail"]["count"] == 0
    assert sample(families, "nv_inference_count", **labels("gated")) == 2
    assert sample(families, "nv_inference_exec_count", **labels("gated")) == 2
    assert sample(families, "nv_inference_pending_request_count", **labels("gated")) == 0
    assert_matches_statistics(families, model_stats(triton, "gated"), "gated")


def wait_for_pending(triton: Triton, model: str, expected: int, timeout_s: float = 30.0) -> None:
    """Scrape until the pending gauge of a model shows `expected` (a request reached the queue)."""
    deadline = time.monotonic() + timeout_s
    while sample(scrape(triton), "nv_inference_pending_request_count", **labels(model)) != expected:
        assert time.monotonic() < deadline, f"{model} never had {expected} pending requests"


def test_servers_keep_their_own_metrics(start_triton: Callable[..., Triton]) -> None:
    first = start_triton(_bind_echo)
    second = start_triton(_bind_echo)
    infer(first, "echo", rows(1))
    assert sample(scrape(first), "nv_inference_request_success", **labels("echo")) == 1
    assert sample(scrape(second), "nv_inference_request_success", **labels("echo")) == 0


def test_model_bound_while_running_is_reported(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind_echo)
    _bind_echo(triton, "late")
    infer(triton, "late", rows(3))
    families = scrape(triton)
    assert sample(families, "nv_inference_request_success", **labels("late")) == 1
    assert sample(families, "nv_inference_count", **labels("late")) == 3


def test_metrics_disabled_opens_no_port(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind_echo, allow_metrics=False)
    assert triton.metrics_port is None
    assert not any(url.endswith("/metrics") for url in triton.urls())
    infer(triton, "echo", rows(1))


def test_the_metrics_port_answers_as_tritons_does(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7), measured: GET /metrics and /metrics/ serve the exposition, a GET of
    # any other path 200 with no body, any other method (HEAD too) 405 {"error":"Method Not Allowed"}, text/plain.
    # (This server answered 404 for other paths, and HEAD /metrics 200.)
    triton = start_triton(_bind_echo)
    assert triton.metrics_port is not None
    for path in ("/metrics", "/metrics/", "/metrics?name=x"):
        status, headers, body = request(triton.metrics_port, "GET", path)
        assert status == 200 and body.startswith(b"# HELP nv_inference_request_success "), path
    for path in ("/", "/metricsx", "/metrics/a", "/v2/models/echo/stats"):
        status, headers, body = request(triton.metrics_port, "GET", path)
        assert (status, headers["content-type"], body) == (200, "text/plain; charset=utf-8", b""), path
    for method, path in (("HEAD", "/metrics"), ("POST", "/metrics"), ("PUT", "/x"), ("OPTIONS", "/metrics")):
        status, headers, body = request(triton.metrics_port, method, path, b"")
        assert (status, headers["content-type"]) == (405, "text/plain"), (method, path)
        assert body == (b"" if method == "HEAD" else b'{"error":"Method Not Allowed"}')


@linux_only
def test_cpu_metrics_are_reported(start_triton: Callable[..., Triton]) -> None:
    families = scrape(start_triton(_bind_echo, metrics_interval_ms=10))
    for name in CPU_FAMILIES:
        assert families[name].type == "gauge"
    assert 0.0 <= sample(families, "nv_cpu_utilization") <= 1.0
    total = sample(families, "nv_cpu_memory_total_bytes")
    assert total > 0
    assert 0 < sample(families, "nv_cpu_memory_used_bytes") <= total


def test_cpu_metrics_can_be_disabled(start_triton: Callable[..., Triton]) -> None:
    families = scrape(start_triton(_bind_echo, allow_cpu_metrics=False))
    assert not set(CPU_FAMILIES) & set(families)
    assert "nv_inference_request_success" in families


def test_pinned_memory_pool_gauges_as_tritons(start_triton: Callable[..., Triton]) -> None:
    # nvidia-pytriton 0.7.0 (tritonserver 2.51) on this CPU-only machine, with and without models and with CPU and
    # GPU metrics off, sent these lines between nv_inference_pending_request_count and nv_cpu_utilization:
    expected = (
        b"# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes\n"
        b"# TYPE nv_pinned_memory_pool_total_bytes gauge\n"
        b"nv_pinned_memory_pool_total_bytes 268435456\n"
        b"# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in bytes\n"
        b"# TYPE nv_pinned_memory_pool_used_bytes gauge\n"
        b"nv_pinned_memory_pool_used_bytes 0\n"
    )
    for options in ({}, {"allow_cpu_metrics": False, "allow_gpu_metrics": False}):
        triton = start_triton(_bind_echo, **options)
        assert triton.metrics_port is not None
        status, _, body = request(triton.metrics_port, "GET", "/metrics")
        assert status == 200 and expected in body, options
        pending = body.index(b"# HELP nv_inference_pending_request_count ")
        assert pending < body.index(expected)
        if not options:
            assert body.index(expected) < body.index(b"# HELP nv_cpu_utilization ")


def test_counter_latencies_can_be_disabled(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind_echo, metrics_config=["counter_latencies=false"])
    infer(triton, "echo", rows(1))
    families = scrape(triton)
    assert not set(LATENCY_COUNTERS) & set(families)
    assert sample(families, "nv_inference_request_success", **labels("echo")) == 1


def test_response_cache_counters(start_triton: Callable[..., Triton]) -> None:
    def bind(triton: Triton) -> None:
        _bind_echo(triton, "cached", response_cache=True)
        _bind_echo(triton, "uncached")

    triton = start_triton(bind, cache_config=["local,size=1048576"])
    for _ in range(3):
        infer(triton, "cached", rows(1))
    families = scrape(triton)
    stats = model_stats(triton, "cached")["inference_stats"]
    assert sample(families, "nv_cache_num_hits_per_model", **labels("cached")) == stats["cache_hit"]["count"] == 2
    assert sample(families, "nv_cache_num_misses_per_model", **labels("cached")) == stats["cache_miss"]["count"] == 1
    assert sample(families, "nv_cache_hit_duration_per_model", **labels("cached")) == stats["cache_hit"]["ns"] // 1000
    assert sample(families, "nv_cache_miss_duration_per_model", **labels("cached")) == stats["cache_miss"]["ns"] // 1000
    assert sample(families, "nv_inference_request_success", **labels("cached")) == 3
    assert sample(families, "nv_inference_count", **labels("cached")) == 1
    for family in ("nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"):
        assert all(s.labels["model"] == "cached" for s in families[family].samples)
    # tritonserver 2.51 (nvidia-pytriton 0.7.0, same models) writes the per-model cache families in this order:
    triton_order = [
        "nv_cache_num_hits_per_model",
        "nv_cache_hit_duration_per_model",
        "nv_cache_num_misses_per_model",
        "nv_cache_miss_duration_per_model",
    ]
    assert [name for name in families if name.endswith("_per_model")] == triton_order


SERVER_CACHE_GAUGES = (
    "nv_cache_util",
    "nv_cache_num_entries",
    "nv_cache_num_hits",
    "nv_cache_num_misses",
    "nv_cache_num_lookups",
    "nv_cache_num_evictions",
    "nv_cache_lookup_duration",
    "nv_cache_insertion_duration",
)


def test_server_wide_response_cache_gauges(start_triton: Callable[..., Triton]) -> None:
    # nvidia-pytriton 0.7.0 (tritonserver 2.51) with cache_config ["local,size=1048576"] exported these gauges,
    # unlabelled, from its first scrape (zeros, nv_cache_util 128 / 1048576 already: the local cache's buffer keeps
    # 128 bytes of its own); after a miss and a hit of one model:
    # nv_cache_num_entries 1, nv_cache_num_hits 1, nv_cache_num_misses 1, nv_cache_num_lookups 2,
    # nv_cache_num_evictions 0. Without a cache, none of them. (This server exported the per-model ones only.)
    assert not set(SERVER_CACHE_GAUGES) & set(scrape(start_triton(_bind_echo)))

    def bind(triton: Triton) -> None:
        _bind_echo(triton, "cached", response_cache=True)
        _bind_echo(triton, "uncached")

    triton = start_triton(bind, cache_config=["local,size=1048576"])
    before = scrape(triton)
    assert [before[name].type for name in SERVER_CACHE_GAUGES] == ["gauge"] * len(SERVER_CACHE_GAUGES)
    assert [sample(before, name) for name in SERVER_CACHE_GAUGES] == [128 / 1048576] + [0] * 7
    for value in (1.0, 1.0, 2.0, 1.0):
        infer(triton, "cached", rows(1, value))
    infer(triton, "uncached", rows(1))
    after = scrape(triton)
    counts = {name: sample(after, name) for name in SERVER_CACHE_GAUGES[1:6]}
    assert counts == {
        "nv_cache_num_entries": 2,
        "nv_cache_num_hits": 2,
        "nv_cache_num_misses": 2,
        "nv_cache_num_lookups": 4,
        "nv_cache_num_evictions": 0,
    }
    assert 0 < sample(after, "nv_cache_util") < 0.01


def test_summary_latencies(start_triton: Callable[..., Triton]) -> None:
    quantiles = "summary_quantiles=0.5:0.05,0.99:0.001"
    triton = start_triton(_bind_echo, metrics_config=["summary_latencies=true", quantiles])
    for _ in range(4):
        infer(triton, "echo", rows(1))
    families = scrape(triton)
    stats = model_stats(triton, "echo")["inference_stats"]
    for name, key in SUMMARIES.items():
        assert families[name].type == "summary"
        count = sample(families, name, "_count", **labels("echo"))
        assert count == stats[key]["count"] == 4, name
        # Each observation is truncated to whole microseconds: the sum is short by less than 1 us per request.
        assert 0 <= stats[key]["ns"] / 1000 - sample(families, name, "_sum", **labels("echo")) < count
        quantile_samples = [s for s in families[name].samples if "quantile" in s.labels]
        assert sorted(s.labels["quantile"] for s in quantile_samples) == ["0.5", "0.99"]
        assert all(s.value >= 0 for s in quantile_samples), name
        # tritonserver 2.51 observes whole microseconds (uint64 ns / 1000): its quantiles and sums are integers.
        assert all(s.value == int(s.value) for s in families[name].samples), name


def test_summaries_count_a_model_bound_while_serving(start_triton: Callable[..., Triton]) -> None:
    # `with Triton() as triton: triton.bind(...)` binds once the server runs, as does a bind after run().
    triton = start_triton(lambda _: None, metrics_config=["summary_latencies=true"])
    _bind_echo(triton)
    infer(triton, "echo", rows(1))
    families = scrape(triton)
    for name in SUMMARIES:
        assert sample(families, name, "_count", **labels("echo")) == 1, name


def test_compute_summaries_observe_each_successful_request(start_triton: Callable[..., Triton]) -> None:
    # As tritonserver 2.51's: one observation per successful request (3 in one batch: 3), none for a failed one.
    entered = threading.Event()
    release = threading.Event()

    def gated(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        entered.set()
        assert release.wait(30)
        return _fail_on_negative(requests)

    def bind(triton: Triton) -> None:
        triton.bind("gated", gated, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(max_batch_size=8))

    triton = start_triton(bind, metrics_config=["summary_latencies=true"])
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(infer, triton, "gated", rows(1))
        assert entered.wait(30)
        batched = [pool.submit(infer, triton, "gated", rows(1)) for _ in range(3)]
        wait_for_pending(triton, "gated", 3)
        release.set()
        for future in (first, *batched):
            future.result(30)
    with pytest.raises(InferenceServerException, match="negative input"):
        infer(triton, "gated", rows(1, -1.0))
    families = scrape(triton)
    stats = model_stats(triton, "gated")
    assert (stats["execution_count"], stats["inference_stats"]["fail"]["count"]) == (3, 1)
    for name, key in SUMMARIES.items():
        assert sample(families, name, "_count", **labels("gated")) == stats["inference_stats"][key]["count"] == 4, name


def test_response_cache_summaries(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51: a cached model's hits and misses have summaries of their own, and it has no request summary.
    def bind(triton: Triton) -> None:
        _bind_echo(triton, "cached", response_cache=True)

    triton = start_triton(bind, cache_config=["local,size=1048576"], metrics_config=["summary_latencies=true"])
    for value in (1.0, 1.0, 1.0, 2.0):
        infer(triton, "cached", rows(1, value))
    families = scrape(triton)
    assert sample(families, "nv_cache_hit_summary_per_model", "_count", **labels("cached")) == 2
    assert sample(families, "nv_cache_miss_summary_per_model", "_count", **labels("cached")) == 2
    assert families["nv_cache_hit_summary_per_model"].type == "summary"
    assert "nv_inference_request_summary_us" not in families
    assert sample(families, "nv_inference_queue_summary_us", "_count", **labels("cached")) == 4
    assert sample(families, "nv_inference_compute_infer_summary_us", "_count", **labels("cached")) == 2


def test_summary_families_as_tritons(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0, summary_latencies=true, a cached model bound before a plain one, a
    # request to each) wrote these HELP and TYPE lines, in this order: the request summary first though the first
    # model has none, and the compute summaries described in the compute counters' words.
    expected = [
        "# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds (includes cached"
        " requests)",
        "# TYPE nv_inference_request_summary_us summary",
        "# HELP nv_inference_queue_summary_us Summary of inference queuing duration in microseconds (includes cached"
        " requests)",
        "# TYPE nv_inference_queue_summary_us summary",
        "# HELP nv_inference_compute_input_summary_us Cumulative compute input duration in microseconds (does not"
        " include cached requests)",
        "# TYPE nv_inference_compute_input_summary_us summary",
        "# HELP nv_inference_compute_infer_summary_us Cumulative compute inference duration in microseconds (does not"
        " include cached requests)",
        "# TYPE nv_inference_compute_infer_summary_us summary",
        "# HELP nv_inference_compute_output_summary_us Cumulative inference compute output duration in microseconds"
        " (does not include cached requests)",
        "# TYPE nv_inference_compute_output_summary_us summary",
        "# HELP nv_cache_hit_summary_per_model Summary of cache hit counts/durations per model, in microseconds.",
        "# TYPE nv_cache_hit_summary_per_model summary",
        "# HELP nv_cache_miss_summary_per_model Summary of cache miss counts/durations per model, in microseconds.",
        "# TYPE nv_cache_miss_summary_per_model summary",
    ]

    def bind(triton: Triton) -> None:
        _bind_echo(triton, "cached", response_cache=True)
        _bind_echo(triton, "plain")

    triton = start_triton(bind, cache_config=["local,size=1048576"], metrics_config=["summary_latencies=true"])
    for model in ("cached", "cached", "plain"):
        infer(triton, model, rows(1))
    assert triton.metrics_port is not None
    status, _, body = request(triton.metrics_port, "GET", "/metrics")
    assert status == 200
    lines = [line for line in body.decode().splitlines() if line.startswith("# ") and "summary" in line]
    assert lines == expected


def test_summaries_are_off_by_default(start_triton: Callable[..., Triton]) -> None:
    families = scrape(start_triton(_bind_echo))
    assert not set(SUMMARIES) & set(families)
    assert "nv_inference_first_response_histogram_ms" not in families


def _stream(requests: List[Any]) -> Any:
    yield _echo(requests)
    yield _echo(requests)


def _bind_streaming(triton: Triton) -> None:
    triton.bind("stream", _stream, inputs=VECTOR, outputs=VECTOR_OUT, config=ModelConfig(decoupled=True))
    _bind_echo(triton)


def test_first_response_histogram_is_for_decoupled_models(start_triton: Callable[..., Triton]) -> None:
    families = scrape(start_triton(_bind_streaming, metrics_config=["histogram_latencies=true"]))
    histogram = families["nv_inference_first_response_histogram_ms"]
    assert histogram.type == "histogram"
    assert {s.labels["model"] for s in histogram.samples} == {"stream"}
    buckets = {s.labels["le"]: s.value for s in histogram.samples if s.name.endswith("_bucket")}
    assert buckets == {"100": 0, "500": 0, "2000": 0, "5000": 0, "+Inf": 0}
    assert sample(families, "nv_inference_first_response_histogram_ms", "_count", **labels("stream")) == 0


def test_first_response_histogram_counts_streams(start_triton: Callable[..., Triton]) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    triton = start_triton(_bind_streaming, metrics_config=["histogram_latencies=true"])
    responses: List[Tuple[Any, Optional[Exception]]] = []
    done = threading.Event()

    def callback(result: Any, error: Optional[Exception]) -> None:
        responses.append((result, error))
        if len(responses) == 2 or error is not None:
            done.set()

    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        tensor = grpcclient.InferInput("in", [1, 2], "FP32")
        tensor.set_data_from_numpy(rows(1))
        client.start_stream(callback=callback)
        client.async_stream_infer("stream", [tensor])
        assert done.wait(30)
        client.stop_stream()
    finally:
        client.close()
    assert [str(error) for _, error in responses if error is not None] == []
    assert len(responses) == 2
    families = scrape(triton)
    name = "nv_inference_first_response_histogram_ms"
    assert sample(families, name, "_count", **labels("stream")) == 1
    assert sample(families, name, "_bucket", **labels("stream"), le="+Inf") == 1
    assert sample(families, name, "_sum", **labels("stream")) > 0


def test_metrics_settings_from_config() -> None:
    settings = resolve_options(TritonConfig()).metrics_settings
    assert (settings.cpu_metrics, settings.interval_ms, settings.counter_latencies) == (True, 2000, True)
    assert (settings.histogram_latencies, settings.summary_latencies) == (False, False)
    assert settings.summary_quantiles == DEFAULT_SUMMARY_QUANTILES
    config = TritonConfig(
        allow_cpu_metrics=False,
        metrics_interval_ms=500,
        metrics_config=["summary_latencies=true", "histogram_latencies=true", "summary_quantiles=0.5:0.05", "0.9:0.01"],
    )
    settings = resolve_options(config).metrics_settings
    assert (settings.cpu_metrics, settings.interval_ms) == (False, 500)
    assert (settings.histogram_latencies, settings.summary_latencies) == (True, True)
    assert settings.summary_quantiles == ((0.5, 0.05), (0.9, 0.01))


@pytest.mark.parametrize(
    "config",
    [
        {"metrics_interval_ms": 0},
        {"metrics_config": ["summary_latencies"]},
        {"metrics_config": ["summary_latencies=maybe"]},
        {"metrics_config": ["summary_quantiles=0.5"]},
        {"metrics_config": ["summary_quantiles=2:0.1"]},
    ],
)
def test_invalid_metrics_settings_are_refused(config: Dict[str, Any]) -> None:
    with pytest.raises(PyTritonValidationError):
        resolve_options(TritonConfig(**config))


def test_histogram_buckets_are_cumulative_upper_bounds() -> None:
    histogram = Histogram([100.0, 500.0])
    for value in (1.0, 100.0, 100.5, 7000.0):
        histogram.observe(value)
    snapshot = histogram.snapshot()
    assert snapshot.counts == [2, 1, 1]
    assert (snapshot.count, snapshot.total) == (4, 7201.5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_summary_quantiles_slide_with_the_window() -> None:
    clock = FakeClock()
    summary = SlidingSummary(max_age_s=60.0, age_buckets=5, clock=clock)
    for value in range(1, 101):
        summary.observe(float(value))
    assert summary.snapshot().quantiles([0.0, 0.5, 0.9, 0.99, 1.0]) == [1.0, 50.0, 90.0, 99.0, 100.0]
    clock.now += 30.0
    summary.observe(1000.0)
    assert summary.snapshot().quantiles([1.0]) == [1000.0]
    clock.now += 31.0
    snapshot = summary.snapshot()
    assert snapshot.quantiles([0.5]) == [1000.0]
    assert (snapshot.count, snapshot.total) == (101, 5050.0 + 1000.0)
    clock.now += 60.0
    assert all(math.isnan(value) for value in summary.snapshot().quantiles([0.5, 0.99]))


def test_summary_keeps_a_weighted_sample_when_full() -> None:
    clock = FakeClock()
    summary = SlidingSummary(max_age_s=60.0, age_buckets=5, capacity=100, clock=clock)
    for _ in range(1000):
        summary.observe(1.0)
    clock.now += 12.0
    for _ in range(100):
        summary.observe(2.0)
    snapshot = summary.snapshot()
    assert sum(len(values) for values, _ in snapshot.parts) == 200
    assert snapshot.quantiles([0.5, 0.9, 0.95]) == [1.0, 1.0, 2.0]
    assert snapshot.count == 1100


def test_model_latencies_convert_units() -> None:
    latencies = ModelLatencies(summaries=True, first_response_histogram=True)
    latencies.request_succeeded(total_ns=2_000_000, queue_ns=500_000, compute=(1_000, 3_000, 2_000))
    latencies.first_response_sent(250_000_000)
    assert latencies.summaries["request"].snapshot().quantiles([0.5]) == [2000.0]
    assert [latencies.summaries[stage].total for stage in ("queue", "compute_input", "compute_infer")] == [500, 1, 3]
    assert latencies.first_response_ms is not None
    histogram = latencies.first_response_ms.snapshot()
    assert (histogram.counts, histogram.total) == ([0, 1, 0, 0, 0], 250.0)
    assert ModelLatencies(summaries=False, first_response_histogram=False).summaries == {}


def test_exposition_format() -> None:
    counter = Family("c", "counter", "help with \\ and\nnewline")
    counter.add((("model", 'a"b\\c\nd'),), 3)
    gauge = Family("g", "gauge", "a gauge")
    gauge.add((), 0.25)
    gauge.add((("k", "inf"),), math.inf)
    gauge.add((("k", "nan"),), math.nan)
    empty = Family("e", "gauge", "no samples")
    text = render([counter, gauge, empty]).decode()
    assert "# HELP e" not in text
    assert 'c{model="a\\"b\\\\c\\nd"} 3\n' in text
    assert 'g{k="inf"} +Inf\n' in text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["c"].samples[0].labels == {"model": 'a"b\\c\nd'}
    assert families["c"].documentation == "help with \\ and\nnewline"
    assert [s.value for s in families["g"].samples][:2] == [0.25, math.inf]


def _write_proc(root: Any, busy: int, idle: int, total_kib: int = 1000, available_kib: int = 250) -> None:
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {busy} 0 0 {idle} 0 0 0 0 0 0\n")
    (root / "meminfo").write_text(f"MemTotal: {total_kib} kB\nMemFree: 1 kB\nMemAvailable: {available_kib} kB\n")


def test_host_monitor_reads_proc(tmp_path: Any) -> None:
    _write_proc(tmp_path, busy=100, idle=100)
    monitor = HostMonitor(tmp_path)
    assert monitor.start()
    assert (monitor.utilization, monitor.memory_total_bytes, monitor.memory_used_bytes) == (0.0, 1024000, 768000)
    _write_proc(tmp_path, busy=130, idle=110, available_kib=500)
    monitor.poll()
    assert monitor.utilization == 0.75
    assert monitor.memory_used_bytes == 512000
    (tmp_path / "meminfo").unlink()
    monitor.poll()
    assert (monitor.memory_total_bytes, monitor.memory_used_bytes) == (0, 0)


def test_host_monitor_without_proc(tmp_path: Any) -> None:
    assert not HostMonitor(tmp_path / "missing").start()


def test_the_metrics_port_holds_few_connections(start_triton: Callable[..., Triton]) -> None:
    # Its own default cap was the HTTP port's (4096), held past the open-file limit's count: an idle client of the
    # metrics port alone could take the descriptors the other ports' clients needed.
    from pytriton.options.limits import METRICS_MAX_CONNECTIONS, OVER_CAP_HELD

    triton = start_triton(_bind_echo)
    assert triton.metrics_port is not None
    sockets: List[socket.socket] = []
    try:
        for _ in range(METRICS_MAX_CONNECTIONS + OVER_CAP_HELD + 2):  # accepted in this order
            sockets.append(socket.create_connection(("127.0.0.1", triton.metrics_port), timeout=10))
        # Idle, each gives its place to a newer one: all but the cap's worth are closed (connection_cap.py).
        assert [sock.recv(1024) for sock in sockets[:-METRICS_MAX_CONNECTIONS]] == [b""] * (OVER_CAP_HELD + 2)
    finally:
        for sock in sockets:
            sock.close()
    assert request(triton.metrics_port, "GET", "/metrics")[0] == 200
