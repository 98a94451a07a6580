"""/metrics as Prometheus itself reads it: promtool's lint, and a real Prometheus scraping the server every second.

Both come from Debian's `prometheus` package (2.42: `apt-get install -y prometheus`; `.ci/run` installs it); without
them these tests fail. prometheus_client's parser (tests/test_metrics.py) is more lenient than Prometheus's.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Set, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.core.custom_metrics import REGISTRY
from pytriton.metrics import MetricFamily
from pytriton.model_config import ModelConfig, Tensor
from pytriton.openai import OpenAIChat
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.fleet import free_ports, wait_until
from tests.http_helpers import get_json, request
from tests.openai_models import TEXT_IN, TEXT_OUT, toy

INSTALL_HINT = "{tool} is not installed: run `apt-get install -y prometheus` (as .ci/run and the README do)"
# What Prometheus 2.42 asks a target for: OpenMetrics first, then the text format.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
VECTOR = [Tensor(name="in", dtype=np.float32, shape=(-1,))]
VECTOR_OUT = [Tensor(name="out", dtype=np.float32, shape=(-1,))]
_SUFFIX = 'counter metrics should have "_total" suffix'
_UNITS = "metric names should not contain abbreviated units"
_COUNT = 'non-histogram and non-summary metrics should not have "_count" suffix'
_SUMMARY = "metric name should not include type 'summary'"
# promtool 2.42's lint of tritonserver 2.51's /metrics (nvidia-pytriton 0.7.0) with these models and options,
# measured: its names, which dashboards built for Triton query, so ours keep them.
TRITONS_LINT = {
    *((name, _SUFFIX) for name in ("nv_inference_request_success", "nv_inference_request_failure")),
    *((name, problem) for name in ("nv_inference_count", "nv_inference_exec_count") for problem in (_SUFFIX, _COUNT)),
    ("nv_inference_pending_request_count", _COUNT),
    *(
        (f"nv_inference_{stage}_duration_us", problem)
        for stage in ("request", "queue", "compute_input", "compute_infer", "compute_output")
        for problem in (_SUFFIX, _UNITS)
    ),
    *(
        (f"nv_inference_{stage}_summary_us", problem)
        for stage in ("request", "queue", "compute_input", "compute_infer", "compute_output")
        for problem in (_SUMMARY, _UNITS)
    ),
    *((f"nv_cache_{name}_per_model", _SUFFIX) for name in ("num_hits", "hit_duration", "num_misses", "miss_duration")),
    *((f"nv_cache_{name}_summary_per_model", _SUMMARY) for name in ("hit", "miss")),
}


def tool(name: str) -> str:
    """The path of a program of Debian's prometheus package; the test fails without it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(INSTALL_HINT.format(tool=name))
    return path


LABEL = 'a "quoted" \\ value\nwith a newline'  # escaped on /metrics


def _binder(prefix: str) -> Callable[[Triton], None]:
    """Binds plain, versioned (v1, v2 with the response cache), streaming and chat models, and a route; callables
    count in custom families named after `prefix` (a process's custom metrics outlive its servers)."""
    hits = MetricFamily(f"{prefix}_hits_total", "Requests a callable saw,\nby \\ kind", MetricFamily.COUNTER)
    rows = MetricFamily(f"{prefix}_rows", "Rows per call", MetricFamily.HISTOGRAM)

    def echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        hits.Metric(labels={"kind": LABEL}).increment(len(requests))
        rows.Metric(buckets=[1, 2, 4]).observe(len(requests))
        return [{"out": request["in"]} for request in requests]

    def stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        yield [{"out": request["in"]} for request in requests]

    def bind(triton: Triton) -> None:
        for name, version, config in (
            ("plain", 1, ModelConfig(max_batch_size=8)),
            ("versioned", 1, ModelConfig(max_batch_size=8)),
            ("versioned", 2, ModelConfig(max_batch_size=8, response_cache=True)),
        ):
            triton.bind(name, echo, inputs=VECTOR, outputs=VECTOR_OUT, model_version=version, config=config)
        streaming = ModelConfig(max_batch_size=8, decoupled=True)
        triton.bind("streaming", stream, inputs=VECTOR, outputs=VECTOR_OUT, config=streaming)
        triton.bind("chat", toy, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat())
        triton.add_route("/hello", lambda route_request: "hello", methods=["GET"])

    return bind


def infer(triton: Triton, model: str, count: int, version: str = "", grpc: bool = False) -> None:
    """`count` requests of one row, answered, over a fresh client of HTTP or gRPC."""
    client: Any
    if grpc:
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        tensor: Any = grpcclient.InferInput("in", [1, 2], "FP32")
    else:
        client = httpclient.InferenceServerClient(http_url(triton))
        tensor = httpclient.InferInput("in", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    try:
        for _ in range(count):
            client.infer(model, [tensor], model_version=version)
    finally:
        client.close()


def test_promtool_lint_finds_only_what_it_finds_in_tritons_metrics() -> None:
    promtool = tool("promtool")
    options = {"metrics_config": ["summary_latencies=true", "histogram_latencies=true"]}
    with running_triton(_binder("test_prometheus_lint"), cache_config=["local,size=1048576"], **options) as triton:
        infer(triton, "plain", 2)
        infer(triton, "versioned", 3, version="2")
        assert request(triton.http_port or 0, "GET", "/hello")[0] == 200
        status, headers, body = request(
            triton.metrics_port or 0, "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
        )
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"  # one Prometheus accepts
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    output = (lint.stdout + lint.stderr).decode()
    assert lint.returncode == 3, output  # 3: lint problems only; 1: text Prometheus cannot read
    # custom families live as long as the process: those other tests of this worker made are theirs to lint (those
    # named like the server's own are left out of /metrics: the names here are the server's)
    others = {
        name for name, *_ in REGISTRY.snapshot() if not name.startswith(("test_prometheus_lint", "nv_", "pytriton_"))
    }
    problems = {tuple(line.split(" ", 1)) for line in output.splitlines() if line and line.split(" ")[0] not in others}
    assert problems == TRITONS_LINT | {
        # Ours: the route and token counts' names predate this check; tritonserver 2.52 names its histogram so.
        ("pytriton_custom_route_requests", _SUFFIX),
        ("pytriton_openai_output_tokens", _SUFFIX),
        ("pytriton_openai_prompt_tokens", _SUFFIX),
        ("nv_inference_first_response_histogram_ms", _UNITS),
        ("nv_inference_first_response_histogram_ms", "metric name should not include type 'histogram'"),
    }


class Prometheus:
    """A prometheus server scraping one target every second, with its HTTP API on a loopback port."""

    def __init__(self, target_port: int, directory: Path) -> None:
        binary = tool("prometheus")
        (self.port,) = free_ports(1)
        config = directory / "prometheus.yml"
        config.write_text(
            # a scrape takes milliseconds; the 2 s bound leaves room for a stalled test machine (Prometheus marks every
            # series stale when one times out, and instant queries then find none)
            "global: {scrape_interval: 2s, scrape_timeout: 2s}\n"
            "scrape_configs:\n"
            f"  - {{job_name: pytriton, static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]}}\n"
        )
        self.log = directory / "prometheus.log"
        command = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, 30, f"prometheus to start ({self.log})", interval_s=0.1)

    def _ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            return request(self.port, "GET", "/-/ready")[0] == 200
        except OSError:
            return False

    def api(self, path: str, **query: str) -> Any:
        status, document = get_json(self.port, f"/api/v1/{path}?{urllib.parse.urlencode(query)}")
        assert status == 200 and document["status"] == "success", document
        return document["data"]

    def query(self, expression: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
        """An instant query's result: each series' labels but job and instance, and its value."""
        return {
            tuple(sorted((k, v) for k, v in result["metric"].items() if k not in ("job", "instance"))): float(
                result["value"][1]
            )
            for result in self.api("query", query=expression)["result"]
        }

    def scraped_after(self, moment: float) -> Dict[str, Any]:
        """Wait for a whole scrape that started after `moment` (time.time()); the target as Prometheus sees it then.

        A scrape that ran out of time is waited past (the machine stalled: the next one says what the server
        serves); any other error of the target's, Prometheus's reading of /metrics included, fails the test.
        """
        seen: List[Dict[str, Any]] = []

        def scraped() -> bool:
            targets = self.api("targets")["activeTargets"]
            if not targets:  # not discovered yet
                return False
            (target,) = targets
            started = target["lastScrape"]
            if started.startswith("0001-") or _epoch(started) <= moment:
                return False
            if "deadline exceeded" in target["lastError"]:
                return False
            seen.append(target)
            return True

        wait_until(scraped, 30, "a scrape by prometheus", interval_s=0.1)
        return seen[-1]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time as Prometheus's API writes it (nanoseconds, 'Z' or an offset)."""
    day, _, rest = stamp.partition("T")
    clock, zone = rest[:-1], "+00:00"
    if not rest.endswith("Z"):
        clock, zone = rest[:-6], rest[-6:]
    whole, _, fraction = clock.partition(".")
    parsed = datetime.datetime.fromisoformat(f"{day}T{whole}{zone}")
    return parsed.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _by_model(series: Dict[Tuple[Tuple[str, str], ...], float], *extra: str) -> Dict[Tuple[str, ...], float]:
    """Query results keyed by (model, version, *extra labels)."""
    keyed = {}
    for labels, value in series.items():
        found = dict(labels)
        keyed[(found["model"], found["version"], *(found[name] for name in extra))] = value
    return keyed


def test_a_real_prometheus_stores_exact_counts(tmp_path: Path) -> None:
    with running_triton(_binder("test_prometheus_scrape"), frontends=3, cache_config=["local,size=1048576"]) as triton:
        prometheus = Prometheus(triton.metrics_port or 0, tmp_path)
        try:
            target = prometheus.scraped_after(time.time())
            assert (target["health"], target["lastError"]) == ("up", ""), target
            infer(triton, "plain", 3)
            infer(triton, "plain", 2, grpc=True)
            infer(triton, "versioned", 4, version="1", grpc=True)
            infer(triton, "versioned", 5, version="2")  # one miss, then 4 cache hits
            target = prometheus.scraped_after(time.time())
            assert (target["health"], target["lastError"]) == ("up", ""), target
            assert prometheus.query("up") == {(("__name__", "up"),): 1}
            success = _by_model(prometheus.query("nv_inference_request_success"))
            assert success == {
                ("plain", "1"): 5,
                ("versioned", "1"): 4,
                ("versioned", "2"): 5,
                ("streaming", "1"): 0,
                ("chat", "1"): 0,
            }
            executed = _by_model(prometheus.query("nv_inference_count"))
            assert executed == {
                ("plain", "1"): 5,
                ("versioned", "1"): 4,
                ("versioned", "2"): 1,
                ("streaming", "1"): 0,
                ("chat", "1"): 0,
            }
            assert _by_model(prometheus.query("nv_cache_num_hits_per_model")) == {("versioned", "2"): 4}
            assert _by_model(prometheus.query("test_prometheus_scrape_hits_total"), "kind") == {
                ("plain", "1", LABEL): 5,
                ("versioned", "1", LABEL): 4,
                ("versioned", "2", LABEL): 1,
            }
            # Every sample of the exposition stored, none dropped as a duplicate or out of order.
            _, _, body = request(triton.metrics_port or 0, "GET", "/metrics")
            exposed = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
            assert prometheus.query("scrape_samples_scraped") == {(("__name__", "scrape_samples_scraped"),): exposed}
            _, _, own = request(prometheus.port, "GET", "/metrics")
            dropped = [
                line
                for line in own.decode().splitlines()
                if line.startswith("prometheus_target_scrapes_sample_") and not line.endswith(" 0")
            ]
            assert dropped == []

            assert triton.http_port is not None
            path = "/v2/repository/models/plain"
            assert request(triton.http_port, "POST", f"{path}/unload", b"{}", HTTP_AUTH)[0] == 200
            wait_until(lambda: _state(triton, "plain") == "UNAVAILABLE", 30, "plain to unload")
            target = prometheus.scraped_after(time.time())
            assert (target["health"], target["lastError"]) == ("up", ""), target
            success = _by_model(prometheus.query("nv_inference_request_success"))
            assert ("plain", "1") not in success  # as tritonserver 2.51: only its failure series stay
            failures = _by_model(prometheus.query('nv_inference_request_failure{model="plain"}'), "reason")
            assert set(failures.values()) == {0} and len(failures) == 4
            client = grpcclient.InferenceServerClient(grpc_url(triton))
            try:
                client.load_model("plain", headers=GRPC_AUTH)
            finally:
                client.close()
            infer(triton, "plain", 2)
            target = prometheus.scraped_after(time.time())
            assert (target["health"], target["lastError"]) == ("up", ""), target
            success = _by_model(prometheus.query("nv_inference_request_success"))
            assert success[("plain", "1")] == 2  # a new model's counters, as Triton's
            assert success[("versioned", "1")] == 4 and success[("versioned", "2")] == 5
            assert _by_model(prometheus.query("resets(nv_inference_request_success[5m])")) == {
                ("plain", "1"): 1,  # seen as a restarted counter: increase() and rate() count on
                ("versioned", "1"): 0,
                ("versioned", "2"): 0,
                ("streaming", "1"): 0,
                ("chat", "1"): 0,
            }
        finally:
            prometheus.stop()


def _state(triton: Triton, model: str) -> str:
    status, _, body = request(triton.http_port or 0, "POST", "/v2/repository/index", b"{}", HTTP_AUTH)
    assert status == 200
    index = json.loads(body)
    states: Set[str] = {entry.get("state", "") for entry in index if entry["name"] == model}
    (state,) = states
    return state
