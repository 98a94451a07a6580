"""Latency histograms and sliding-window summaries of one model version, fed as requests finish.

They exist only when `metrics_config` asks for them (`histogram_latencies`, `summary_latencies`);
counters never touch the request path, these do, with one append per observation.
"""

from __future__ import annotations

import array
import bisect
import math
import random
import time
from collections import deque
from typing import Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.stats import ComputeTimes
from pytriton.transport.metrics.exposition import Family, Labels, format_value, sample_line

# Triton's default buckets of nv_inference_first_response_histogram_ms.
FIRST_RESPONSE_BUCKETS_MS: Tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)
# prometheus-cpp's summary defaults, which Triton uses: quantiles over the last 60 s, in 5 age buckets.
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
# Observations kept per age bucket; beyond that a uniform reservoir sample stands in for the rest.
SUMMARY_BUCKET_CAPACITY = 1024
SUMMARY_STAGES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
CACHE_SUMMARY_STAGES = ("cache_hit", "cache_miss")  # a model with the response cache only

# Values of one age bucket and the weight of each (observations seen / values kept).
WindowPart = Tuple["array.array[float]", float]


class HistogramSnapshot:
    """A copy of a histogram's state, taken on the event loop."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float], counts: List[int], count: int, total: float) -> None:
        """Keep the copied values."""
        self.bounds = bounds
        self.counts = counts
        self.count = count
        self.total = total


class Histogram:
    """A Prometheus histogram with fixed upper bounds (`le`)."""

    __slots__ = ("_bounds", "_counts", "count", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        """Create empty buckets for ascending upper bounds (+Inf is implied)."""
        self._bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self._bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self.count += 1
        self.total += value

    def snapshot(self) -> HistogramSnapshot:
        """Copy the state for rendering."""
        return HistogramSnapshot(self._bounds, list(self._counts), self.count, self.total)


class _AgeBucket:
    """Observations of one slice of the sliding window."""

    __slots__ = ("seen", "start", "values")

    def __init__(self, start: float) -> None:
        """Start an empty slice at `start` (monotonic seconds)."""
        self.start = start
        self.values: array.array[float] = array.array("d")
        self.seen = 0


class SummarySnapshot:
    """A copy of a summary's state, taken on the event loop; quantiles are computed from it later."""

    __slots__ = ("count", "parts", "total")

    def __init__(self, count: int, total: float, parts: List[WindowPart]) -> None:
        """Keep the copied values."""
        self.count = count
        self.total = total
        self.parts = parts

    def quantiles(self, targets: Sequence[float]) -> List[float]:
        """The value at each target quantile over the window (NaN when the window is empty)."""
        if not self.parts:
            return [math.nan] * len(targets)
        values = np.concatenate([np.frombuffer(part, dtype=np.float64) for part, _ in self.parts])
        weights = np.concatenate([np.full(len(part), weight) for part, weight in self.parts])
        order = np.argsort(values, kind="stable")
        cumulative = np.cumsum(weights[order])
        positions = np.searchsorted(cumulative, np.asarray(targets, dtype=np.float64) * cumulative[-1])
        return [float(values[order[min(int(i), len(order) - 1)]]) for i in positions]


class SlidingSummary:
    """A Prometheus summary: count and sum since start, quantiles over a sliding time window."""

    __slots__ = ("_buckets", "_capacity", "_clock", "_max_age_s", "_random", "_slice_s", "count", "total")

    def __init__(
        self,
        max_age_s: float = SUMMARY_MAX_AGE_S,
        age_buckets: int = SUMMARY_AGE_BUCKETS,
        capacity: int = SUMMARY_BUCKET_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create an empty summary whose window is `max_age_s` long, kept in `age_buckets` slices."""
        self._max_age_s = max_age_s
        self._slice_s = max_age_s / age_buckets
        self._capacity = capacity
        self._clock = clock
        self._buckets: Deque[_AgeBucket] = deque()
        self._random = random.Random()
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        now = self._clock()
        buckets = self._buckets
        if not buckets or now - buckets[-1].start >= self._slice_s:
            self._expire(now)
            buckets.append(_AgeBucket(now))
        bucket = buckets[-1]
        bucket.seen += 1
        if len(bucket.values) < self._capacity:
            bucket.values.append(value)
        else:
            slot = self._random.randrange(bucket.seen)
            if slot < self._capacity:
                bucket.values[slot] = value
        self.count += 1
        self.total += value

    def snapshot(self) -> SummarySnapshot:
        """Copy the state for rendering: only the newest slice changes later, so only it is copied."""
        self._expire(self._clock())
        parts: List[WindowPart] = [
            (bucket.values, bucket.seen / len(bucket.values)) for bucket in self._buckets if bucket.values
        ]
        if parts and self._buckets[-1].values:
            parts[-1] = (parts[-1][0][:], parts[-1][1])
        return SummarySnapshot(self.count, self.total, parts)

    def _expire(self, now: float) -> None:
        """Drop slices that left the window."""
        while self._buckets and now - self._buckets[0].start >= self._max_age_s:
            self._buckets.popleft()


class ModelLatencies:
    """Summaries (microseconds) and the first-response histogram (milliseconds) of one model version.

    An observer of the model's statistics: the core calls it as it records each request. As Triton's, the summaries
    observe each successful request (its compute times too: a failed execution shows in none), and a model with
    the response cache has the cache's summaries and no request summary (tritonserver 2.51 leaves it out, as a
    cache hit's duration and a miss's insertion are not one observation).
    """

    def __init__(self, *, summaries: bool, first_response_histogram: bool, cache: bool = False) -> None:
        """Create the summaries and the histogram that the metrics settings ask for; `cache`: the model's is on."""
        stages = (*SUMMARY_STAGES[1:], *CACHE_SUMMARY_STAGES) if cache else SUMMARY_STAGES
        self.summaries: Dict[str, SlidingSummary] = {stage: SlidingSummary() for stage in stages} if summaries else {}
        self.first_response_ms = Histogram(FIRST_RESPONSE_BUCKETS_MS) if first_response_histogram else None

    def request_succeeded(self, total_ns: int, queue_ns: int, compute: Optional[ComputeTimes]) -> None:
        """A request succeeded after `total_ns`, `queue_ns` of it queued; `compute` None: a cache hit.

        Whole microseconds are observed, as tritonserver 2.51 observes its uint64 nanoseconds / 1000.
        """
        summaries = self.summaries
        if not summaries:
            return
        request = summaries.get("request")
        if request is not None:
            request.observe(total_ns // 1000)
        summaries["queue"].observe(queue_ns // 1000)
        if compute is not None:
            summaries["compute_input"].observe(compute[0] // 1000)
            summaries["compute_infer"].observe(compute[1] // 1000)
            summaries["compute_output"].observe(compute[2] // 1000)

    def cache_looked_up(self, hit: bool, ns: int) -> None:
        """The response cache found (`hit`) or stored a response in `ns`."""
        summary = self.summaries.get("cache_hit" if hit else "cache_miss")
        if summary is not None:
            summary.observe(ns // 1000)

    def first_response_sent(self, ns: int) -> None:
        """A decoupled request sent its first response `ns` after it arrived."""
        if self.first_response_ms is not None:
            self.first_response_ms.observe(ns / 1_000_000)


class SummaryFamily(Family):
    """A summary family whose quantiles are computed when it is rendered (off the event loop)."""

    __slots__ = ("_quantiles", "_windows")

    def __init__(self, name: str, help_text: str, quantiles: Sequence[float]) -> None:
        """Create an empty summary family reporting `quantiles`."""
        super().__init__(name, "summary", help_text)
        self._quantiles = quantiles
        self._windows: List[Tuple[Labels, SummarySnapshot]] = []

    def add_summary(self, labels: Labels, snapshot: SummarySnapshot) -> None:
        """Add one labelled summary."""
        self._windows.append((labels, snapshot))

    def lines(self) -> Iterator[str]:
        """`_count`, `_sum` and one line per quantile for each summary."""
        for labels, snapshot in self._windows:
            yield sample_line(self.name, "_count", labels, snapshot.count)
            yield sample_line(self.name, "_sum", labels, snapshot.total)
            for quantile, value in zip(self._quantiles, snapshot.quantiles(self._quantiles)):
                yield sample_line(self.name, "", (*labels, ("quantile", _quantile_label(quantile))), value)


def add_histogram(family: Family, labels: Labels, snapshot: HistogramSnapshot) -> None:
    """Add one labelled histogram: `_count`, `_sum` and cumulative `_bucket` samples."""
    family.add(labels, snapshot.count, "_count")
    family.add(labels, snapshot.total, "_sum")
    cumulative = 0
    for bound, count in zip((*snapshot.bounds, math.inf), snapshot.counts):
        cumulative += count
        family.add((*labels, ("le", _bound_label(bound))), cumulative, "_bucket")


def _quantile_label(quantile: float) -> str:
    """A quantile as its label value (`0.5`, `0.999`)."""
    return repr(float(quantile))


def _bound_label(bound: float) -> str:
    """A bucket bound as its `le` label (`100`, `2.5`, `+Inf`, `-Inf`)."""
    return format_value(float(bound))  # prometheus-cpp's `%.16g`: `100`, `2.5`, `1e+21`
