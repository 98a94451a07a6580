"""Per-model inference statistics, as Triton's statistics extension reports them."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Protocol, Sequence, Tuple


class Duration:
    """A count and a total duration in nanoseconds."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        """Start at zero."""
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Record `count` events lasting `ns` in total."""
        self.count += count
        self.ns += ns

    def as_dict(self) -> Dict[str, int]:
        """The wire form."""
        return {"count": self.count, "ns": self.ns}


INFERENCE_STAT_NAMES = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
BATCH_STAT_NAMES = ("compute_input", "compute_infer", "compute_output")


ComputeTimes = Tuple[int, int, int]  # compute input, infer and output, in nanoseconds
# A direct inner call's success, counted later (ModelStats.lone_successes): batch size, rows, and the monotonic ns
# it started, its callable started and returned, and it ended at.
LoneSuccess = Tuple[int, int, int, int, int, int]
# How many lone successes may wait before their counting is posted to the loop (any read counts them first).
FOLD_EVERY = 256


class StatsObserver(Protocol):
    """Sees each latency as the statistics record it (metrics histograms and summaries)."""

    def request_succeeded(self, total_ns: int, queue_ns: int, compute: Optional[ComputeTimes]) -> None:
        """A request succeeded after `total_ns`, `queue_ns` of it waiting; `compute`: its model's (None: cache hit)."""

    def cache_looked_up(self, hit: bool, ns: int) -> None:
        """The response cache found (`hit`) or stored a request's response in `ns`."""

    def first_response_sent(self, ns: int) -> None:
        """A decoupled request sent its first response `ns` after it arrived."""


# Bucket bounds (seconds) of the token histograms, as vLLM's metrics have them.
FIRST_TOKEN_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
BETWEEN_TOKENS_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class Buckets:
    """Observations counted into fixed buckets (seconds), with their count and sum: a histogram's state."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        """Empty buckets of ascending upper `bounds` (+Inf implied)."""
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.total += seconds


class TokenStats:
    """What a model generated for the OpenAI API (transport/openai): tokens, time to first token, between tokens.

    Counted once per generation, on the process that holds the model (a frontend process sends TOKENS there).
    """

    __slots__ = ("between_tokens", "first_token", "generations", "output_tokens", "prompt_tokens")

    def __init__(self) -> None:
        """Start at zero."""
        self.generations = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.first_token = Buckets(FIRST_TOKEN_BUCKETS_S)
        self.between_tokens = Buckets(BETWEEN_TOKENS_BUCKETS_S)

    def record(self, first_token_ns: int, gaps_ns: Sequence[int], output_tokens: int, prompt_tokens: int) -> None:
        """One generation: its first text `first_token_ns` after the request came, then `gaps_ns` between texts."""
        self.generations += 1
        self.output_tokens += output_tokens
        self.prompt_tokens += prompt_tokens
        self.first_token.observe(first_token_ns / 1e9)
        between = self.between_tokens
        for gap in gaps_ns:
            between.observe(gap / 1e9)


class ModelStats:
    """Counters of one model version; updated on the event loop only, but for `lone_successes`.

    A direct inner call that succeeded (core/scheduling/direct_runs.py) is counted from its caller's thread without the
    loop: it appends its numbers to `lone_successes` (a deque: an append needs no lock), and the counters take them in
    when next read (`fold`: each counter read here is a property that folds first), or when the loop is told to
    after FOLD_EVERY of them. Counted on the loop, a call cost about 200 bytecodes there (11k instructions: the
    message, its call and the 15 counters), as much again as the call's own work on the caller's thread.
    """

    def __init__(self) -> None:
        """Start at zero."""
        self.observers: List[StatsObserver] = []
        # Failed requests by reason, for /metrics: `reset` keeps them, as tritonserver 2.51's
        # nv_inference_request_failure series outlive an unload and go on from there after a load.
        self.failures_by_reason: Dict[str, int] = {}
        # Direct inner calls that succeeded, not counted yet (LoneSuccess), appended from any thread; `fold` counts
        # them.
        self.lone_successes: Deque[LoneSuccess] = deque()
        self._folding = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start again at zero (a model loaded again after an unload, as Triton's new model), but for the failures."""
        self.lone_successes.clear()
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0
        self._inference: Dict[str, Duration] = {name: Duration() for name in INFERENCE_STAT_NAMES}
        self._batches: Dict[int, Dict[str, Duration]] = {}
        self.tokens = TokenStats()
        self._lone: Dict[int, Tuple[Duration, ...]] = {}  # record_lone_success's durations by rows

    @property
    def inference_count(self) -> int:
        """The inferences of successful requests (as Triton's)."""
        if self.lone_successes:
            self.fold()
        return self._inference_count

    @property
    def execution_count(self) -> int:
        """The model's calls (batches), failed or not."""
        if self.lone_successes:
            self.fold()
        return self._execution_count

    @property
    def last_inference_ms(self) -> int:
        """When the model was last called (ms since the epoch; 0: never)."""
        if self.lone_successes:
            self.fold()
        return self._last_inference_ms

    @property
    def inference(self) -> Dict[str, Duration]:
        """The requests' durations by INFERENCE_STAT_NAMES."""
        if self.lone_successes:
            self.fold()
        return self._inference

    @property
    def batches(self) -> Dict[int, Dict[str, Duration]]:
        """The executions' durations by batch size, each by BATCH_STAT_NAMES."""
        if self.lone_successes:
            self.fold()
        return self._batches

    def fold(self) -> None:
        """Count the direct inner calls' successes that wait in `lone_successes` (on the loop, or where read).

        Taken and summed in C (starmap, zip, sum): a Python loop over them cost 90 bytecodes each.
        """
        pending = self.lone_successes
        with self._folding:
            waiting = len(pending)  # those appended meanwhile wait for the next fold
            if not waiting:
                return
            taken = list(itertools.starmap(pending.popleft, itertools.repeat((), waiting)))
            columns = list(zip(*taken))
            kinds, last_ns = set(columns[1]), max(columns[5])
            for kind in kinds:
                if len(kinds) > 1:  # calls of several batch sizes (rare): each size's own
                    columns = list(zip(*[one for one in taken if one[1] == kind]))
                batch_sizes, _, starts, infer_starts, infer_ends, ends = columns
                # The durations' sums from the times' sums: sum(b - a) is sum(b) - sum(a).
                start, infer_start, infer_end, end = sum(starts), sum(infer_starts), sum(infer_ends), sum(ends)
                self._count_lone(
                    len(batch_sizes),
                    sum(batch_sizes),
                    kind,
                    infer_start - start,
                    infer_end - infer_start,
                    end - infer_end,
                    end - start,
                )
            # The wall clock's time of the last call's end.
            ended_ms = (time.time_ns() - (time.monotonic_ns() - last_ns)) // 1_000_000
            self._last_inference_ms = max(self._last_inference_ms, ended_ms)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """Record one model call over a batch of `batch_size` rows (batch_stats are per execution, failed or not)."""
        self._execution_count += 1
        self._last_inference_ms = int(time.time() * 1000)
        stats = self._batches.get(batch_size)
        if stats is None:
            stats = self._batches[batch_size] = _batch_durations()
        stats["compute_input"].add(input_ns)
        stats["compute_infer"].add(infer_ns)
        stats["compute_output"].add(output_ns)

    def record_success(
        self, total_ns: int, queue_ns: int, compute: Optional[ComputeTimes] = None, batch_size: int = 1
    ) -> None:
        """Record a successful request of `batch_size` inferences; compute is counted per successful request.

        As in Triton, inference_count counts the inferences of successful requests only.
        """
        self._inference_count += batch_size
        inference = self._inference
        inference["success"].add(total_ns)
        inference["queue"].add(queue_ns)
        if compute is not None:
            inference["compute_input"].add(compute[0])
            inference["compute_infer"].add(compute[1])
            inference["compute_output"].add(compute[2])
        for observer in self.observers:
            observer.request_succeeded(total_ns, queue_ns, compute)

    def record_cache_hit(self, lookup_ns: int) -> None:
        """A request the response cache answered after a lookup of `lookup_ns`: a success, with no inference."""
        self._inference["cache_hit"].add(lookup_ns)
        self.record_success(lookup_ns, 0, batch_size=0)
        for observer in self.observers:
            observer.cache_looked_up(True, lookup_ns)

    def record_cache_miss(self, insertion_ns: int) -> None:
        """A response the cache had not, stored in `insertion_ns`."""
        self._inference["cache_miss"].add(insertion_ns)
        for observer in self.observers:
            observer.cache_looked_up(False, insertion_ns)

    def record_lone_success(
        self, batch_size: int, rows: int, input_ns: int, infer_ns: int, output_ns: int, total_ns: int
    ) -> None:
        """A request that ran alone at once (no queue time) and succeeded: its execution over `rows` and its success.

        `record_execution` and `record_success` in one, for a direct inner call, counted on the loop. (One whose
        model has no observers is counted from its caller's thread instead: `lone_successes`.)
        """
        self._count_lone(1, batch_size, rows, input_ns, infer_ns, output_ns, total_ns)
        self._last_inference_ms = int(time.time() * 1000)
        if self.observers:
            for observer in self.observers:
                observer.request_succeeded(total_ns, 0, (input_ns, infer_ns, output_ns))

    def _count_lone(
        self, count: int, inferences: int, rows: int, input_ns: int, infer_ns: int, output_ns: int, total_ns: int
    ) -> None:
        """Count `count` lone successes of `rows` rows each, `inferences` in all, with the total of their durations."""
        durations = self._lone.get(rows)
        if durations is None:
            durations = self._lone[rows] = self._lone_durations(rows)
        batch_input, batch_infer, batch_output, inference_input, inference_infer, inference_output, success = durations
        self._execution_count += count
        self._inference_count += inferences
        batch_input.count += count
        batch_input.ns += input_ns
        batch_infer.count += count
        batch_infer.ns += infer_ns
        batch_output.count += count
        batch_output.ns += output_ns
        inference_input.count += count
        inference_input.ns += input_ns
        inference_infer.count += count
        inference_infer.ns += infer_ns
        inference_output.count += count
        inference_output.ns += output_ns
        success.count += count
        success.ns += total_ns
        self._inference["queue"].count += count

    def _lone_durations(self, rows: int) -> Tuple[Duration, ...]:
        """The durations a lone success of `rows` rows adds to (record_lone_success), looked up once."""
        stats = self._batches.get(rows)
        if stats is None:
            stats = self._batches[rows] = _batch_durations()
        inference = self._inference
        names = ("compute_input", "compute_infer", "compute_output")
        return (*(stats[name] for name in names), *(inference[name] for name in names), inference["success"])

    def record_successes(
        self, totals_ns: List[int], queues_ns: List[int], compute: ComputeTimes, inferences: int
    ) -> None:
        """Record the successful requests of one batch at once (`inferences` in all; they share compute times)."""
        count = len(totals_ns)
        self._inference_count += inferences
        inference = self._inference
        inference["success"].add(sum(totals_ns), count)
        inference["queue"].add(sum(queues_ns), count)
        inference["compute_input"].add(compute[0] * count, count)
        inference["compute_infer"].add(compute[1] * count, count)
        inference["compute_output"].add(compute[2] * count, count)
        for observer in self.observers:
            for total_ns, queue_ns in zip(totals_ns, queues_ns):
                observer.request_succeeded(total_ns, queue_ns, compute)

    def record_first_response(self, ns: int) -> None:
        """A decoupled request sent its first response (metrics only)."""
        for observer in self.observers:
            observer.first_response_sent(ns)

    def record_failure(self, total_ns: int, reason: str) -> None:
        """Record a failed request."""
        self._inference["fail"].add(total_ns)
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1

    def as_dict(self, name: str, version: str) -> Dict[str, object]:
        """The statistics extension's model_stats entry."""
        if self.lone_successes:
            self.fold()
        batch_stats: List[Dict[str, object]] = [
            {"batch_size": size, **{key: durations[key].as_dict() for key in BATCH_STAT_NAMES}}
            for size, durations in sorted(self._batches.items())
        ]
        return {
            "name": name,
            "version": version,
            "last_inference": self._last_inference_ms,
            "inference_count": self._inference_count,
            "execution_count": self._execution_count,
            "inference_stats": {key: duration.as_dict() for key, duration in self._inference.items()},
            "response_stats": {},
            "batch_stats": batch_stats,
            "memory_usage": [],
        }


def _batch_durations() -> Dict[str, Duration]:
    """Fresh durations for one batch size."""
    return {name: Duration() for name in BATCH_STAT_NAMES}
