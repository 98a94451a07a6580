"""Custom metrics of inference callables (`pytriton.metrics`): Triton's `pb_utils.MetricFamily` shape, on /metrics.

Counts are exact after N requests whether the callable runs in a thread, on the loop (async) or in instance
processes, and with frontend processes. Every family name here is the test's own: the registry is the process's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import urllib.request
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.metrics_core import Metric as ParsedFamily
from prometheus_client.parser import text_string_to_metric_families

from pytriton.core.custom_metrics import COUNTER, GAUGE, HISTOGRAM, Registry
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonValidationError
from pytriton.instances import ProcessInstances
from pytriton.metrics import Metric, MetricFamily
from pytriton.model_config import ModelConfig, Tensor
from pytriton.transport.metrics.custom import custom_families
from pytriton.transport.metrics.exposition import render
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url, running_triton
from tests.server_process import ROOT

INPUTS = [Tensor(name="in", dtype=np.float32, shape=(1,))]
OUTPUTS = [Tensor(name="out", dtype=np.float32, shape=(1,))]
BUCKETS = [1.0, 2.5, 10.0]
# What each request sends; a histogram of them with BUCKETS counts (1, 3, 5, 6) cumulatively, +Inf last.
VALUES = [0.5, 1.5, 2.5, 4.0, 8.0, 20.0]


def scrape_text(triton: Triton) -> str:
    """GET /metrics with urllib."""
    with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()  # type: ignore[no-any-return]


def scrape(triton: Triton) -> Dict[str, ParsedFamily]:
    """/metrics parsed by prometheus_client, by family name."""
    return {family.name: family for family in text_string_to_metric_families(scrape_text(triton))}


def samples(family: ParsedFamily, name: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
    """A family's samples called `name` (a counter's: the parser adds `_total`), by their sorted labels."""
    names = {name, name + "_total"} if family.type == "counter" else {name}
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name in names}


def value(families: Dict[str, ParsedFamily], family: str, name: str, **labels: str) -> float:
    """The one sample `name` of `family` with exactly these labels."""
    found = samples(families[family], name)
    key = tuple(sorted(labels.items()))
    assert key in found, f"{name}{labels} not in {found}"
    return found[key]


def send_all(triton: Triton, model: str, values: List[float], parallel: int = 1) -> None:
    """One request per value, `parallel` at a time, each answered before this returns."""

    def send(item: float) -> None:
        client = httpclient.InferenceServerClient(http_url(triton))
        try:
            tensor = httpclient.InferInput("in", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[item]], dtype=np.float32))
            result = client.infer(model, [tensor])
            assert result.as_numpy("out") is not None
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        list(pool.map(send, values))


class Counting:
    """A callable that counts its requests, the values it gets and the last one, in families of its own prefix."""

    def __init__(self, prefix: str) -> None:
        """Families are defined now; metrics at the first call (inside it, so they carry the model's labels)."""
        self.requests = MetricFamily(f"{prefix}_requests", "Requests counted by the callable", MetricFamily.COUNTER)
        self.sizes = MetricFamily(f"{prefix}_values", "Values the callable got", MetricFamily.HISTOGRAM)
        self.last = MetricFamily(f"{prefix}_last", "The last value the callable got", MetricFamily.GAUGE)
        self._metrics: Optional[Tuple[Metric, Metric, Metric]] = None

    def count(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        if self._metrics is None:
            self._metrics = (
                self.requests.Metric(labels={"kind": "plain"}),
                self.sizes.Metric(labels={"kind": "plain"}, buckets=BUCKETS),
                self.last.Metric(),
            )
        counter, histogram, gauge = self._metrics
        for request in requests:
            item = float(request["in"].flat[0])
            counter.increment()
            histogram.observe(item)
            gauge.set(item)
        return [{"out": request["in"]} for request in requests]

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return self.count(requests)


class AsyncCounting(Counting):
    """The same, as an async callable."""

    async def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.count(requests)


def process_factory() -> Counting:
    """What each instance process builds: its families and metrics are made there, as that model's."""
    MetricFamily("test_custom_process_made", "Made by the factory, never updated", MetricFamily.COUNTER).Metric()
    return Counting("test_custom_process")


STEPS = "test_custom_stream_steps"


def stream_steps(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Two steps, each counted per request; the metric is asked for at each call (same labels: same metric)."""
    steps = MetricFamily(STEPS, "Steps yielded", MetricFamily.COUNTER).Metric(labels={"kind": "sync"})
    for _ in range(2):
        steps.increment(len(requests))
        yield [{"out": request["in"]} for request in requests]


async def async_stream_steps(requests: List[Any]) -> AsyncIterator[List[Dict[str, np.ndarray]]]:
    """The same, as an async generator."""
    steps = MetricFamily(STEPS, "Steps yielded", MetricFamily.COUNTER).Metric(labels={"kind": "async"})
    for _ in range(2):
        await asyncio.sleep(0)
        steps.increment(len(requests))
        yield [{"out": request["in"]} for request in requests]


def stream_all(triton: Triton, model: str, count: int) -> None:
    """`count` requests on one gRPC stream, each followed to its final response."""
    finals = threading.Semaphore(0)
    errors: List[Any] = []

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            errors.append(error)
            finals.release()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            finals.release()

    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        client.start_stream(callback=callback)
        for index in range(count):
            tensor = grpcclient.InferInput("in", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[index]], dtype=np.float32))
            client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
        for _ in range(count):
            assert finals.acquire(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert not errors, errors


def assert_counted(families: Dict[str, ParsedFamily], prefix: str, model: str, values: List[float]) -> None:
    """Exact counts of a Counting model after one request per value (the gauge: the last value sent)."""
    model_labels = {"model": model, "version": "1"}
    assert value(families, f"{prefix}_requests", f"{prefix}_requests", kind="plain", **model_labels) == len(values)
    histogram = f"{prefix}_values"
    assert value(families, histogram, f"{histogram}_count", kind="plain", **model_labels) == len(values)
    assert value(families, histogram, f"{histogram}_sum", kind="plain", **model_labels) == pytest.approx(sum(values))
    cumulative = [sum(1 for item in values if item <= bound) for bound in BUCKETS] + [len(values)]
    bounds = ["1", "2.5", "10", "+Inf"]  # as Triton writes `le`
    buckets = samples(families[histogram], f"{histogram}_bucket")
    for bound, expected in zip(bounds, cumulative):
        key = tuple(sorted({**model_labels, "kind": "plain", "le": bound}.items()))
        assert buckets[key] == expected, (bound, buckets)
    assert families[f"{prefix}_requests"].type == "counter"
    assert families[histogram].type == "histogram"
    assert families[f"{prefix}_last"].type == "gauge"


def assert_help_and_type_once(text: str, names: List[str]) -> None:
    for name in names:
        assert text.count(f"# HELP {name} ") == 1, name
        assert text.count(f"# TYPE {name} ") == 1, name


def _bind(triton: Triton, name: str, infer_func: Any, max_batch_size: int = 4) -> None:
    triton.bind(name, infer_func, inputs=INPUTS, outputs=OUTPUTS, config=ModelConfig(max_batch_size=max_batch_size))


# -- the API, as Triton's Python backend has it ----------------------------------------------------------------


def test_counter_gauge_and_histogram_operations_follow_triton() -> None:
    counter = MetricFamily("test_custom_api_counter", "a counter", MetricFamily.COUNTER).Metric(labels={"a": "1"})
    assert counter.value() == 0.0
    counter.increment(2023.0)
    counter.increment()
    assert counter.value() == 2024.0
    with pytest.raises(PyTritonValidationError, match="negative"):
        counter.increment(-1)
    with pytest.raises(PyTritonInvalidOperationError, match="counter"):
        counter.set(5)
    with pytest.raises(PyTritonInvalidOperationError, match="counter"):
        counter.observe(5)

    gauge = MetricFamily("test_custom_api_gauge", "a gauge", MetricFamily.GAUGE).Metric()
    gauge.increment(2023.0)
    gauge.increment(-23.5)
    assert gauge.value() == 1999.5
    gauge.set(999.9)
    assert gauge.value() == 999.9
    with pytest.raises(PyTritonInvalidOperationError, match="gauge"):
        gauge.observe(1)

    histograms = MetricFamily("test_custom_api_histogram", "a histogram", MetricFamily.HISTOGRAM)
    histogram = histograms.Metric(labels={"a": "1"}, buckets=[0.1, 1, 2.5])
    histogram.observe(0.05)
    for operation, args in (("value", ()), ("increment", (1,)), ("set", (1,))):
        with pytest.raises(PyTritonInvalidOperationError, match="histogram"):
            getattr(histogram, operation)(*args)
    with pytest.raises(PyTritonValidationError, match="needs buckets"):
        histograms.Metric(labels={"b": "1"})
    for wrong in ([2.5, 0.1, 1.0], [1, 1, 2]):
        with pytest.raises(PyTritonValidationError, match="strictly ascending"):
            histograms.Metric(labels={"b": "1"}, buckets=wrong)
    histograms.Metric(labels={"c": "1"}, buckets=[])  # only +Inf
    with pytest.raises(PyTritonValidationError, match="already exists with buckets"):
        histograms.Metric(labels={"a": "1"}, buckets=[5.0])
    with pytest.raises(PyTritonValidationError, match="reserved"):
        histograms.Metric(labels={"le": "1"}, buckets=[1.0])
    with pytest.raises(PyTritonInvalidOperationError, match="buckets are for histograms"):
        MetricFamily("test_custom_api_counter", "a counter", MetricFamily.COUNTER).Metric(buckets=[1.0])


def test_invalid_names_labels_and_kinds_are_refused_clearly() -> None:
    for name in ("", "1abc", "has space", "dash-name", None):
        with pytest.raises(PyTritonValidationError, match="invalid metric family name"):
            MetricFamily(name, "x", MetricFamily.COUNTER)  # type: ignore[arg-type]
    with pytest.raises(PyTritonValidationError, match="invalid metric family kind 'summary'"):
        MetricFamily("test_custom_bad_kind", "x", "summary")
    family = MetricFamily("test_custom_bad_labels", "x", MetricFamily.COUNTER)
    for labels in ({"1a": "x"}, {"__reserved": "x"}, {"with-dash": "x"}):
        with pytest.raises(PyTritonValidationError, match="invalid label name"):
            family.Metric(labels=labels)
    with pytest.raises(PyTritonValidationError, match="must have a str value"):
        family.Metric(labels={"a": 1})  # type: ignore[dict-item]
    assert MetricFamily("ns:with_colon", "colons are allowed", MetricFamily.GAUGE).name == "ns:with_colon"


def test_updates_take_numbers_only_as_triton_does() -> None:
    # pb_utils' increment/set/observe take a float (pybind11): a str or None is a TypeError there, and here a
    # str set on a gauge was stored and broke every later scrape.
    counter = MetricFamily("test_custom_numbers_counter", "c", MetricFamily.COUNTER).Metric()
    gauge = MetricFamily("test_custom_numbers_gauge", "g", MetricFamily.GAUGE).Metric()
    histogram = MetricFamily("test_custom_numbers_histogram", "h", MetricFamily.HISTOGRAM).Metric(buckets=[1.0])
    for wrong in ("3", b"3", None, [1.0]):
        for update in (counter.increment, gauge.increment, gauge.set, histogram.observe):
            with pytest.raises(TypeError, match="takes a number"):
                update(wrong)  # type: ignore[arg-type]
    counter.increment(2)
    counter.increment(np.float32(0.5))  # type: ignore[arg-type]
    gauge.set(True)
    gauge.increment(np.int64(2))  # type: ignore[arg-type]
    histogram.observe(np.float64(0.5))  # type: ignore[arg-type]
    assert (counter.value(), gauge.value()) == (2.5, 3.0)
    text = render(custom_families(set())).decode()
    assert "test_custom_numbers_gauge 3\n" in text
    assert 'test_custom_numbers_histogram_bucket{le="1"} 1\n' in text


def test_a_histogram_bucket_at_minus_infinity_is_written_as_such() -> None:
    # It was written le="+Inf", so the histogram had two +Inf buckets (a duplicate series Prometheus refuses).
    histogram = MetricFamily("test_custom_minus_inf", "h", MetricFamily.HISTOGRAM)
    histogram.Metric(buckets=[float("-inf"), 1.0]).observe(-5.0)
    lines = [line for line in render(custom_families(set())).decode().splitlines() if "test_custom_minus_inf_b" in line]
    assert lines == [
        'test_custom_minus_inf_bucket{le="-Inf"} 0',
        'test_custom_minus_inf_bucket{le="1"} 1',
        'test_custom_minus_inf_bucket{le="+Inf"} 1',
    ]


def test_values_help_and_family_order_as_tritonserver_writes_them() -> None:
    # Read off tritonserver 2.51's /metrics for the same pb_utils calls (prometheus-cpp: `%.16g`, `Nan`, no HELP
    # line for an empty description, counters then gauges then histograms then summaries).
    written = {
        3.0000000000000004: "3",
        1e15: "1000000000000000",
        123456789012345678.0: "1.234567890123457e+17",
        -0.0: "-0",
        float("nan"): "Nan",
        2.0**53 + 2: "9007199254740994",
        1e16: "1e+16",
        1e-7: "1e-07",
        1 / 3: "0.3333333333333333",
        100.0: "100",
    }
    gauges = MetricFamily("test_custom_printed", "", MetricFamily.GAUGE)
    for index, number in enumerate(written):
        gauges.Metric(labels={"i": str(index)}).set(number)
    histogram = MetricFamily("test_custom_printed_bounds", "bounds", MetricFamily.HISTOGRAM)
    histogram.Metric(buckets=[0.1, 1e21]).observe(5)
    counter = MetricFamily("test_custom_printed_made_last", "a counter", MetricFamily.COUNTER)
    counter.Metric().increment(1)
    with running_triton(lambda triton: _bind(triton, "printed", lambda requests: requests)) as triton:
        text = scrape_text(triton)
    for index, printed in enumerate(written.values()):
        assert f'test_custom_printed{{i="{index}"}} {printed}\n' in text
    assert "# HELP test_custom_printed " not in text
    assert "# TYPE test_custom_printed gauge\n" in text
    assert 'test_custom_printed_bounds_bucket{le="1e+21"} 1\n' in text
    kinds = [line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")]
    ranks = ["counter", "gauge", "histogram", "summary"]
    assert [ranks.index(kind) for kind in kinds] == sorted(ranks.index(kind) for kind in kinds), kinds
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert names.index("test_custom_printed_made_last") < names.index("nv_inference_pending_request_count")
    assert names[:2] == ["nv_inference_request_success", "nv_inference_request_failure"]


def test_duplicate_families_and_metrics_are_the_same_ones() -> None:
    first = MetricFamily("test_custom_dup", "first description", MetricFamily.COUNTER)
    second = MetricFamily("test_custom_dup", "second description", MetricFamily.COUNTER)
    assert second.description == "first description"
    one = first.Metric(labels={"a": "x"})
    other = second.Metric(labels={"a": "x"})
    one.increment(7.5)
    assert other.value() == 7.5
    with pytest.raises(PyTritonValidationError, match="already exists as a counter"):
        MetricFamily("test_custom_dup", "x", MetricFamily.GAUGE)


# -- exported on /metrics ----------------------------------------------------------------------------------------


def test_thread_instance_metrics_are_exact_on_the_metrics_port() -> None:
    prefix = "test_custom_thread"
    callable_ = Counting(prefix)
    outside = MetricFamily(f"{prefix}_outside", "Made outside any callable", MetricFamily.COUNTER)
    outside_metric = outside.Metric(labels={"where": "test"})
    clash = MetricFamily("nv_inference_count", "a custom family named like Triton's", MetricFamily.COUNTER)
    clash.Metric(labels={"x": "y"}).increment(99)
    with running_triton(lambda triton: _bind(triton, "counting", callable_)) as triton:
        send_all(triton, "counting", VALUES, parallel=3)
        outside_metric.increment(3)
        text = scrape_text(triton)
        families = {family.name: family for family in text_string_to_metric_families(text)}
    assert_counted(families, prefix, "counting", VALUES)
    assert value(families, f"{prefix}_last", f"{prefix}_last", model="counting", version="1") in VALUES
    assert value(families, f"{prefix}_outside", f"{prefix}_outside", where="test") == 3  # no model labels
    assert_help_and_type_once(text, [f"{prefix}_requests", f"{prefix}_values", f"{prefix}_last", "nv_inference_count"])
    assert "# HELP test_custom_thread_requests Requests counted by the callable" in text
    assert "a custom family named like Triton's" not in text  # the server's own family wins
    assert {s.labels["model"] for s in families["nv_inference_count"].samples} == {"counting"}


def test_a_custom_family_named_like_the_route_counts_is_never_exported() -> None:
    fake = MetricFamily("pytriton_custom_route_requests", "a custom family named like the server's", COUNTER)
    fake.Metric(labels={"route": "/fake", "method": "GET", "status": "200"}).increment(5)
    with running_triton(lambda triton: triton.add_route("/real", lambda request: "ok", methods=["GET"])) as triton:
        before = scrape_text(triton)  # no route answered yet: the server has no such family to show
        with urllib.request.urlopen(f"http://127.0.0.1:{triton.http_port}/real", timeout=30) as response:
            assert response.read() == b"ok"
        after = scrape_text(triton)
    assert "pytriton_custom_route_requests" not in before
    assert [line for line in after.splitlines() if line.startswith("pytriton_custom_route_requests{")] == [
        'pytriton_custom_route_requests{route="/real",method="GET",status="200"} 1'
    ]


def test_text_utf8_cannot_encode_is_refused_and_scrapes_go_on() -> None:
    # A lone surrogate (what os.fsdecode makes of a file name that is not UTF-8) in a description or a label
    # value was taken: every scrape then failed with 500 (Prometheus: the target down) until the process ended.
    refused: List[str] = []

    def infer(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        labelled = MetricFamily("test_custom_surrogate_label", "x", MetricFamily.COUNTER)
        for make in (
            lambda: MetricFamily("test_custom_surrogate_help", "read from \udcff", MetricFamily.COUNTER),
            lambda: labelled.Metric(labels={"file": "data-\udcff.bin"}),
        ):
            try:
                make()
            except PyTritonValidationError as error:
                refused.append(str(error))
        return [{"out": request["in"]} for request in requests]

    with running_triton(lambda triton: _bind(triton, "surrogates", infer)) as triton:
        send_all(triton, "surrogates", [1.0])
        families = scrape(triton)
    assert refused == [
        "the description of metric family 'test_custom_surrogate_help' must be text UTF-8 can encode (no lone "
        "surrogates): 'read from \\udcff'",
        "label 'file' of metric 'test_custom_surrogate_label' must have a value UTF-8 can encode (no lone "
        "surrogates): 'data-\\udcff.bin'",
    ]
    assert (
        value(families, "nv_inference_request_success", "nv_inference_request_success", model="surrogates", version="1")
        == 1
    )
    assert "test_custom_surrogate_help" not in families and "test_custom_surrogate_label" not in families


def test_async_callable_metrics_carry_the_model_that_made_them() -> None:
    prefix = "test_custom_async"
    first, second = AsyncCounting(prefix), AsyncCounting(prefix)

    def bind(triton: Triton) -> None:
        _bind(triton, "async_a", first)
        _bind(triton, "async_b", second)

    with running_triton(bind) as triton:
        send_all(triton, "async_a", VALUES, parallel=3)
        send_all(triton, "async_b", VALUES[:2])
        families = scrape(triton)
    assert_counted(families, prefix, "async_a", VALUES)
    assert_counted(families, prefix, "async_b", VALUES[:2])


def test_process_instances_metrics_reach_the_server_exactly() -> None:
    prefix = "test_custom_process"
    values = VALUES * 5

    def bind(triton: Triton) -> None:
        _bind(triton, "counting_processes", ProcessInstances(factory=process_factory, count=2))

    with running_triton(bind) as triton:
        send_all(triton, "counting_processes", values, parallel=4)
        families = scrape(triton)
        assert_counted(families, prefix, "counting_processes", values)
        made = f"{prefix}_made"
        assert value(families, made, made, model="counting_processes", version="1") == 0  # shown, as in Triton
        send_all(triton, "counting_processes", [1.0])
        assert_counted(scrape(triton), prefix, "counting_processes", [*values, 1.0])
    assert value(families, f"{prefix}_last", f"{prefix}_last", model="counting_processes", version="1") in values


def test_frontend_processes_serve_the_same_custom_metrics() -> None:
    prefix = "test_custom_frontends"
    callable_ = Counting(prefix)
    with running_triton(lambda triton: _bind(triton, "counting", callable_), frontends=3) as triton:
        send_all(triton, "counting", VALUES, parallel=2)
        text = scrape_text(triton)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert_counted(families, prefix, "counting", VALUES)
    assert_help_and_type_once(text, [f"{prefix}_requests", f"{prefix}_values", f"{prefix}_last"])


def test_generators_count_as_their_model_in_threads_on_the_loop_and_in_processes() -> None:
    decoupled = ModelConfig(max_batch_size=4, decoupled=True)

    def bind(triton: Triton) -> None:
        for name, infer_func in (
            ("gen_sync", stream_steps),
            ("gen_async", async_stream_steps),
            ("gen_process", ProcessInstances(stream_steps)),
        ):
            triton.bind(name, infer_func, inputs=INPUTS, outputs=OUTPUTS, config=decoupled)

    with running_triton(bind) as triton:
        for count, model in enumerate(("gen_sync", "gen_async", "gen_process"), start=3):
            stream_all(triton, model, count)
        families = scrape(triton)
    assert value(families, STEPS, STEPS, kind="sync", model="gen_sync", version="1") == 2 * 3
    assert value(families, STEPS, STEPS, kind="async", model="gen_async", version="1") == 2 * 4
    assert value(families, STEPS, STEPS, kind="sync", model="gen_process", version="1") == 2 * 5
    assert len(families[STEPS].samples) == 3


def test_the_documented_example_counts_as_the_docs_say() -> None:
    docs = (ROOT / "docs" / "inference_callables.md").read_text()
    section = docs.split("## Custom metrics", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: Dict[str, Any] = {
        "count_hits": lambda requests: 2 * len(requests),
        "backlog_size": lambda: 7,
        "answer": lambda requests: [{"out": request["in"]} for request in requests],
    }
    exec(compile(code.group(1), "inference_callables.md", "exec"), namespace)  # the docs' own code
    with running_triton(lambda triton: _bind(triton, "documented", namespace["infer"])) as triton:
        for _ in range(3):
            send_all(triton, "documented", [1.0])  # one at a time: one call each
        families = scrape(triton)
    model = {"model": "documented", "version": "1"}
    assert value(families, "my_cache_hits", "my_cache_hits", cache="embeddings", **model) == 6
    assert value(families, "my_batch_rows", "my_batch_rows_count", **model) == 3
    assert value(families, "my_backlog", "my_backlog", **model) == 7


# -- what instance processes ship, added on the server -----------------------------------------------------------


def test_shipped_updates_add_exactly_and_a_clashing_family_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    child, server = Registry(), Registry()
    child.shipping = True  # as start_shipping makes it, without making this process an instance's
    counter = child.series(child.family("ship_counter", "c", COUNTER), {"a": "1"}, None)
    gauge = child.series(child.family("ship_gauge", "g", GAUGE), None, None)
    histogram = child.series(child.family("ship_histogram", "h", HISTOGRAM), None, [1.0, 5.0])
    clash = child.series(child.family("ship_clash", "x", COUNTER), None, None)
    server.family("ship_clash", "the server's", GAUGE)
    for _ in range(2):  # two jobs
        counter.add(2.0)
        gauge.add(1.0)
        histogram.observe(0.5)
        histogram.observe(7.0)
        clash.add(1.0)
        with caplog.at_level(logging.ERROR, "pytriton.core.custom_metrics"):
            server.apply_updates(child.take_updates())
    assert child.take_updates() == []  # nothing changed since
    gauge.set(10.0)
    gauge.add(-3.0)
    server.apply_updates(child.take_updates())
    shown = {name: samples for name, _, _, samples in server.snapshot()}
    assert shown["ship_counter"] == [((("a", "1"),), 4.0)]
    assert shown["ship_gauge"] == [((), 7.0)]
    assert shown["ship_histogram"] == [((), ((1.0, 5.0), [2, 0, 2], 15.0, 4))]
    assert shown["ship_clash"] == []  # the server's gauge, untouched
    errors = [record.getMessage() for record in caplog.records if "ship_clash" in record.getMessage()]
    assert len(errors) == 1 and "already exists as a gauge" in errors[0]


def test_a_family_whose_samples_share_names_with_another_is_refused() -> None:
    # Prometheus keeps one of two samples with one name and labels: a counter `x_count` beside a histogram `x` lost
    # its values, or the histogram its count (tritonserver 2.51 writes both, measured with pb_utils).
    MetricFamily("test_custom_lat", "a histogram", MetricFamily.HISTOGRAM)
    with pytest.raises(PyTritonValidationError) as raised:
        MetricFamily("test_custom_lat_count", "a counter", MetricFamily.COUNTER)
    assert str(raised.value) == (
        "metric family 'test_custom_lat_count' (counter) would write samples named like those of histogram "
        "'test_custom_lat' (test_custom_lat_count): Prometheus would keep one of them; name it otherwise"
    )
    MetricFamily("test_custom_size_bucket", "a gauge", MetricFamily.GAUGE)
    with pytest.raises(PyTritonValidationError, match=r"'test_custom_size' \(histogram\) would write samples named"):
        MetricFamily("test_custom_size", "a histogram", MetricFamily.HISTOGRAM)
    assert MetricFamily("test_custom_lat_total", "no clash", MetricFamily.COUNTER).name == "test_custom_lat_total"
    assert MetricFamily("test_custom_lat", "the same one again", MetricFamily.HISTOGRAM).kind == MetricFamily.HISTOGRAM


def test_a_family_whose_samples_share_names_with_the_servers_is_left_out() -> None:
    # A custom histogram `nv_inference_exec` writes `nv_inference_exec_count{model,version}`, the server's counter's
    # series; a counter `nv_inference_request_summary_us_count`, the server's summary's count: both were there twice.
    def infer(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        MetricFamily("nv_inference_exec", "x", MetricFamily.HISTOGRAM).Metric(buckets=[1.0]).observe(5.0)
        MetricFamily("nv_inference_request_summary_us_count", "x", MetricFamily.COUNTER).Metric().increment(100)
        return [{"out": request["in"]} for request in requests]

    bind = lambda triton: _bind(triton, "clashing", infer)  # noqa: E731
    with running_triton(bind, metrics_config=["summary_latencies=true"]) as triton:
        send_all(triton, "clashing", [1.0, 2.0])
        text = scrape_text(triton)
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len(set(series)), sorted(name for name in series if series.count(name) > 1)
    assert 'nv_inference_exec_count{model="clashing",version="1"} 2' in text.splitlines()
    assert 'nv_inference_request_summary_us_count{model="clashing",version="1"} 2' in text.splitlines()
    assert "nv_inference_exec_bucket" not in text
