"""Reads the engine's counters into metric families, with Triton's names, labels and units."""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pytriton.core.cache import ResponseCache
from pytriton.core.engine import Engine
from pytriton.core.errors import FailureReason
from pytriton.core.model import ModelState, ServedModel
from pytriton.core.stats import ModelStats, TokenStats
from pytriton.options.openai import OpenAIChat, OpenAICompletions
from pytriton.options.routes import CustomRoutes
from pytriton.options.server import MetricsSettings
from pytriton.transport.metrics.custom import custom_families
from pytriton.transport.metrics.exposition import Family, Labels
from pytriton.transport.metrics.gpu import FAMILY_NAMES as GPU_FAMILY_NAMES
from pytriton.transport.metrics.gpu import GpuMonitor
from pytriton.transport.metrics.host import HostMonitor
from pytriton.transport.metrics.latency import HistogramSnapshot, ModelLatencies, SummaryFamily, add_histogram

_COUNTS: Sequence[Tuple[str, str, Callable[[ModelStats], int]]] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda stats: stats.inference["success"].count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda stats: stats.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda stats: stats.execution_count,
    ),
)
# (family, statistics duration, help): cumulative durations in microseconds.
_DURATIONS = (
    (
        "nv_inference_request_duration_us",
        "success",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "queue",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "compute_input",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "compute_infer",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "compute_output",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)
# (family, statistics duration, count or microseconds, help): models with the response cache only, in Triton's order.
_CACHE = (
    ("nv_cache_num_hits_per_model", "cache_hit", False, "Number of cache hits per model"),
    ("nv_cache_hit_duration_per_model", "cache_hit", True, "Total cache hit duration per model, in microseconds"),
    ("nv_cache_num_misses_per_model", "cache_miss", False, "Number of cache misses per model"),
    (
        "nv_cache_miss_duration_per_model",
        "cache_miss",
        True,
        "Total cache miss (insert+lookup) duration per model, in microseconds",
    ),
)
# (family, help, reading): the response cache's, server-wide gauges, in Triton's order; durations in microseconds.
_SERVER_CACHE: Sequence[Tuple[str, str, Callable[[ResponseCache], float]]] = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda cache: cache.used_bytes / cache.capacity_bytes),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda cache: cache.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda cache: cache.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda cache: cache.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda cache: cache.hits + cache.misses),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", lambda cache: cache.evictions),
    (
        "nv_cache_lookup_duration",
        "Total cache lookup duration (hit and miss), in microseconds",
        lambda cache: cache.lookup_ns // 1000,
    ),
    (
        "nv_cache_insertion_duration",
        "Total cache insertion duration, in microseconds",
        lambda cache: cache.insertion_ns // 1000,
    ),
)
# (family, ModelLatencies stage, help), in Triton's order. tritonserver 2.51 describes its compute summaries with its
# compute counters' words ("Cumulative ..."): kept, as a dashboard or a diff against Triton reads them.
_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "request",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_summary_us",
        "queue",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "compute_input",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "compute_infer",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "compute_output",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_cache_hit_summary_per_model",
        "cache_hit",
        "Summary of cache hit counts/durations per model, in microseconds.",
    ),
    (
        "nv_cache_miss_summary_per_model",
        "cache_miss",
        "Summary of cache miss counts/durations per model, in microseconds.",
    ),
)
# tritonserver's --pinned-memory-pool-byte-size default (256 MiB), which its total gauge reports.
PINNED_MEMORY_POOL_BYTES = 1 << 28
_SUMMARY_RANK = {name: rank for rank, (name, _, _) in enumerate(_SUMMARIES)}
_KIND_ORDER = {"counter": 0, "gauge": 1, "histogram": 2, "summary": 3}
FAILURE_REASONS = tuple(reason.value for reason in FailureReason)
_FAILURE_HELP = "Number of failed inference requests, all batch sizes"
_ROUTE_HELP = "Number of requests answered by a custom route or mounted app, by route, method and status"


def collect(
    engine: Engine,
    settings: MetricsSettings,
    latencies: Mapping[ServedModel, ModelLatencies],
    host: Optional[HostMonitor],
    gpu: Optional[GpuMonitor] = None,
    routes: Optional[CustomRoutes] = None,
) -> List[Family]:
    """Every family, read now; runs on the event loop and only copies numbers (quantiles come later)."""
    families: Dict[str, Family] = {}

    def family(name: str, kind: str, help_text: str) -> Family:
        found = families.get(name)
        if found is None:
            found = families[name] = Family(name, kind, help_text)
        return found

    family(_COUNTS[0][0], "counter", _COUNTS[0][1])  # success, then failure: Triton's order (render drops empty ones)
    family("nv_inference_request_failure", "counter", _FAILURE_HELP)
    for model in engine.models():
        labels: Labels = (("model", model.spec.name), ("version", model.spec.version_str))
        stats = model.stats
        unloaded = model.state is ModelState.UNAVAILABLE
        failures = family("nv_inference_request_failure", "counter", _FAILURE_HELP)
        for name, help_text, read in () if unloaded else _COUNTS:
            family(name, "counter", help_text).add(labels, read(stats))
        for reason in (*FAILURE_REASONS, *sorted(set(stats.failures_by_reason) - set(FAILURE_REASONS))):
            # Labels sorted by name, as prometheus-cpp writes them for Triton.
            failures.add((labels[0], ("reason", reason), labels[1]), stats.failures_by_reason.get(reason, 0))
        if unloaded:  # tritonserver 2.51 drops an unloaded model's series but its failure counters
            continue
        family(
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.",
        ).add(labels, model.scheduler.pending)
        if settings.counter_latencies:
            for name, key, help_text in _DURATIONS:
                family(name, "counter", help_text).add(labels, stats.inference[key].ns // 1000)
            if model.cache is not None:
                for name, key, is_duration, help_text in _CACHE:
                    duration = stats.inference[key]
                    family(name, "counter", help_text).add(
                        labels, duration.ns // 1000 if is_duration else duration.count
                    )
        observed = latencies.get(model)
        if observed is not None:
            _add_latencies(families, labels, observed, settings)
        if isinstance(model.spec.openai, (OpenAIChat, OpenAICompletions)):
            _add_tokens(family, labels, model.stats.tokens)
    if routes is not None and routes.counts:
        requests = family("pytriton_custom_route_requests", "counter", _ROUTE_HELP)
        for (route, method, status), count in sorted(routes.counts.items()):
            requests.add((("route", route), ("method", method), ("status", str(status))), count)
    ordered = list(families.values())
    ordered.extend(_pinned_memory_families())
    if gpu is not None:
        ordered.extend(gpu.families())
    if host is not None:
        ordered.extend(_host_families(host))
    if engine.response_cache is not None:
        ordered.extend(_cache_families(engine.response_cache))
    ordered.extend(custom_families({family.name for family in ordered} | _OWN_NAMES))
    ordered.sort(key=_kind_rank)  # stable: each kind's families in the order they were made
    return ordered


def _kind_rank(family: Family) -> Tuple[int, int]:
    """Where a family comes on /metrics: by its kind, and the server's summaries in Triton's order.

    Triton's prometheus-cpp registry writes its counters first, then its gauges, histograms and summaries (so a
    custom counter comes before the server's gauges). Its summary families are registered at start, in one order;
    here they are made as models are read, and a model with the response cache has no request summary, so they
    are put in that order (a custom summary after them).
    """
    return _KIND_ORDER.get(family.kind, len(_KIND_ORDER)), _SUMMARY_RANK.get(family.name, len(_SUMMARY_RANK))


def _add_latencies(
    families: Dict[str, Family], labels: Labels, observed: ModelLatencies, settings: MetricsSettings
) -> None:
    """A model's summaries and first-response histogram."""
    quantiles = [quantile for quantile, _ in settings.summary_quantiles]
    for name, stage, help_text in _SUMMARIES:
        summary = observed.summaries.get(stage)
        if summary is None:
            continue
        found = families.get(name)
        if not isinstance(found, SummaryFamily):
            found = families[name] = SummaryFamily(name, help_text, quantiles)
        found.add_summary(labels, summary.snapshot())
    if observed.first_response_ms is not None:
        name = "nv_inference_first_response_histogram_ms"
        histogram = families.get(name)
        if histogram is None:
            histogram = families[name] = Family(
                name, "histogram", "Duration from request to first response in milliseconds"
            )
        add_histogram(histogram, labels, observed.first_response_ms.snapshot())


# (family, TokenStats histogram, help): the OpenAI API's generations, per model.
_TOKEN_HISTOGRAMS = (
    (
        "pytriton_openai_time_to_first_token_seconds",
        "first_token",
        "Time from an OpenAI API request to its first generated text, in seconds",
    ),
    (
        "pytriton_openai_time_between_tokens_seconds",
        "between_tokens",
        "Time between one generated text of an OpenAI API request and the next, in seconds",
    ),
)


# Families the server exports now or may later (a model's first request, a GPU polled), and the names of their
# histograms' and summaries' samples: never a custom family's, nor one of its samples'.
_HISTOGRAM_NAMES = ["nv_inference_first_response_histogram_ms", *(name for name, _, _ in _TOKEN_HISTOGRAMS)]
_SUMMARY_NAMES = [name for name, _, _ in _SUMMARIES]
_OWN_NAMES = frozenset(
    [f"{name}{suffix}" for name in _HISTOGRAM_NAMES for suffix in ("_count", "_sum", "_bucket")]
    + [f"{name}{suffix}" for name in _SUMMARY_NAMES for suffix in ("_count", "_sum")]
    + [name for name, _, _ in _COUNTS]
    + [name for name, _, _ in _DURATIONS]
    + [name for name, _, _, _ in _CACHE]
    + _SUMMARY_NAMES
    + ["nv_inference_request_failure", "nv_inference_pending_request_count", *_HISTOGRAM_NAMES]
    + ["nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes"]
    + ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes", *GPU_FAMILY_NAMES]
    + [name for name, _, _ in _SERVER_CACHE]
    + ["pytriton_openai_output_tokens", "pytriton_openai_prompt_tokens", "pytriton_custom_route_requests"]
)


def _add_tokens(family: Callable[[str, str, str], Family], labels: Labels, tokens: TokenStats) -> None:
    """A model's OpenAI API token counters and histograms (counted on this process, once per request)."""
    family("pytriton_openai_output_tokens", "counter", "Number of tokens generated through the OpenAI API").add(
        labels, tokens.output_tokens
    )
    family("pytriton_openai_prompt_tokens", "counter", "Number of prompt tokens of the OpenAI API's requests").add(
        labels, tokens.prompt_tokens
    )
    for name, key, help_text in _TOKEN_HISTOGRAMS:
        buckets = getattr(tokens, key)
        snapshot = HistogramSnapshot(buckets.bounds, list(buckets.counts), buckets.count, buckets.total)
        add_histogram(family(name, "histogram", help_text), labels, snapshot)


def _cache_families(cache: ResponseCache) -> List[Family]:
    """The response cache's gauges, as Triton exports them when a cache is configured (from before any traffic)."""
    families = []
    for name, help_text, read in _SERVER_CACHE:
        gauge = Family(name, "gauge", help_text)
        gauge.add((), read(cache))
        families.append(gauge)
    return families


def _pinned_memory_families() -> List[Family]:
    """Triton's pinned memory pool gauges: its default pool size and nothing used, as on a machine without CUDA.

    tritonserver 2.51 exports both whenever metrics are on, even where it could not allocate the pool (no CUDA
    driver) and with CPU and GPU metrics off; this server stages no tensor in pinned memory, so nothing is used.
    """
    total = Family("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes")
    total.add((), PINNED_MEMORY_POOL_BYTES)
    used = Family("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes")
    used.add((), 0)
    return [total, used]


def _host_families(host: HostMonitor) -> List[Family]:
    """nv_cpu_utilization and the host's memory, as last polled."""
    utilization = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
    utilization.add((), host.utilization)
    total = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
    total.add((), host.memory_total_bytes)
    used = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
    used.add((), host.memory_used_bytes)
    return [utilization, total, used]
