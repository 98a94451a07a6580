"""The GPU bench's tables and plot: served throughput against the direct-call limit, latencies, batches, GPU use."""

from __future__ import annotations

import math
import pathlib
from typing import Any, Dict, List, Optional

from bench.report import log2_axes, save_figure


def _num(value: Optional[float], digits: int = 1) -> str:
    """A figure, or '-' when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def limit(direct: List[Dict[str, Any]]) -> float:
    """The direct-call limit: the most samples per second of any batch size."""
    return max((row["samples_per_s"] for row in direct), default=float("nan"))


Rows = List[Dict[str, Any]]


def summarize(model: str, direct: Rows, served: Dict[str, Rows], rtt_ms: float) -> Dict[str, Any]:
    """One model's figures: the limit, each served point's share of it, and the latency overhead at one request."""
    best = limit(direct)
    for points in served.values():
        for point in points:
            point["of_limit"] = point["rps"] / best if best else None
    single = next((row for row in direct if row["batch"] == 1), None)
    overhead: Dict[str, Optional[float]] = {}
    for protocol, points in served.items():
        one = next((point for point in points if point["in_flight"] == 1), None)
        if one is not None and single is not None:
            overhead[protocol] = one["p50_ms"] - single["p50_ms"] - rtt_ms
    return {
        "model": model,
        "direct": direct,
        "served": served,
        "limit": best,
        "rtt_ms": rtt_ms,
        "overhead_ms": overhead,
    }


def table(summary: Dict[str, Any]) -> str:
    """The direct-call table and the served table of one model, as text."""
    lines = [f"== {summary['model']}: direct calls (the limit: {_num(summary['limit'])} samples/s)"]
    lines.append(f"{'batch':>6} {'samples/s':>12} {'p50 ms':>9} {'p99 ms':>9} {'GPU':>6}")
    for row in summary["direct"]:
        lines.append(
            f"{row['batch']:>6} {_num(row['samples_per_s']):>12} {_num(row['p50_ms'], 2):>9} "
            f"{_num(row['p99_ms'], 2):>9} {_pct(row['gpu_utilization']):>6}"
        )
    rtt = _num(summary["rtt_ms"], 3)
    lines.append(
        f"== {summary.get('label', summary['model'])}: served, one sample per request (HTTP round trip {rtt} ms)"
    )
    columns = ("in flight", 9), ("req/s", 10), ("of limit", 9), ("p50 ms", 9), ("p99 ms", 9), ("batch", 6), ("GPU", 6)
    lines.append(f"{'proto':>5} " + " ".join(f"{name:>{width}}" for name, width in columns) + f" {'errors':>6}")
    for protocol, points in summary["served"].items():
        for point in points:
            lines.append(
                f"{protocol:>5} {point['in_flight']:>9} {_num(point['rps']):>10} {_pct(point.get('of_limit')):>9} "
                f"{_num(point['p50_ms'], 2):>9} {_num(point['p99_ms'], 2):>9} {_num(point.get('avg_batch')):>6} "
                f"{_pct(point.get('gpu_utilization')):>6} {point['errors']:>6}"
            )
    for protocol, value in summary["overhead_ms"].items():
        lines.append(f"{protocol}: p50 at 1 in flight - direct p50 at batch 1 - round trip = {_num(value, 3)} ms")
    return "\n".join(lines)


def plot(summaries: List[Dict[str, Any]], title: str, path: pathlib.Path) -> Optional[str]:
    """Throughput (with the direct limit) and p99 against requests in flight, one row per model; why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    fig, axes = plt.subplots(len(summaries), 2, figsize=(12, 4.5 * len(summaries)), squeeze=False)
    for (ax_rps, ax_p99), summary in zip(axes, summaries):
        ticks: List[int] = []
        for protocol, points in summary["served"].items():
            in_flight = [point["in_flight"] for point in points]
            ticks = sorted(set(ticks) | set(in_flight))
            ax_rps.plot(in_flight, [point["rps"] for point in points], marker="o", label=f"served, {protocol}")
            ax_p99.plot(in_flight, [point["p99_ms"] for point in points], marker="o", label=f"served, {protocol}")
        ax_rps.axhline(summary["limit"], linestyle="--", color="gray", label="direct calls (limit)")
        for ax, what, unit in ((ax_rps, "throughput", "samples / s"), (ax_p99, "p99 latency", "ms")):
            log2_axes(
                ax,
                ticks,
                "requests in flight (one sample each)",
                unit,
                f"{summary.get('label', summary['model'])}: {what}, {title}",
            )
        ax_p99.set_yscale("log")
    save_figure(fig, path)
    return None
