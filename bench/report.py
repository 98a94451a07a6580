"""Medians, paired ratios, the printed table, the JSON summary and the sweep plot."""

from __future__ import annotations

import json
import math
import pathlib
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.perf_analyzer import SWEEP_ELEMENTS, size_label
from bench.runner import Bench

# (key, label): the metrics shown, in order, when a workload has them
METRICS: List[Tuple[str, str]] = [
    ("rps", "req/s"),
    ("infer_s", "infer/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("mib_s", "MiB/s"),
    ("cpu_us_req", "server CPU us/req"),
    ("avg_batch", "avg batch (model)"),
    ("avg_batch_stats", "avg batch (/stats)"),
    ("identity_c64_rps", "identity@64 req/s"),
    ("vs_identity", "req/s / identity@64"),
    ("errors", "errors"),
]
STARTUP_METRICS = [("startup_s", "startup s"), ("rss_mib", "RSS MiB"), ("pss_mib", "PSS MiB")]
REFERENCE = "ours"


def median(values: Sequence[float]) -> Optional[float]:
    """The median of the finite values, None when there is none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def paired_ratio(ours: Sequence[Dict[str, float]], theirs: Sequence[Dict[str, float]], key: str) -> Optional[float]:
    """Median over rounds of ours/theirs, pairing run i with run i (they ran back to back)."""
    ratios = [
        a[key] / b[key]
        for a, b in zip(ours, theirs)
        if key in a and key in b and b[key] and math.isfinite(a[key]) and math.isfinite(b[key])
    ]
    return median(ratios)


def summarize(bench: Bench, meta: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON-ready summary of a bench session."""
    targets = bench.all_targets()
    names = [t.name for t in targets]
    workloads: Dict[str, Any] = {}
    for workload, cells in bench.cells.items():
        entry: Dict[str, Any] = {"targets": {}, "ratios": {}}
        for name, cell in cells.items():
            keys = sorted({k for run in cell.rounds for k in run})
            medians = {k: median([run[k] for run in cell.rounds if k in run]) for k in keys}
            entry["targets"][name] = {"status": cell.status, "median": medians, "rounds": cell.rounds}
        ours = cells.get(REFERENCE)
        for name in names:
            if name == REFERENCE or ours is None or name not in cells:
                continue
            keys = [k for k, _ in METRICS if k != "errors"]
            ratios = {k: paired_ratio(ours.rounds, cells[name].rounds, k) for k in keys}
            entry["ratios"][f"{REFERENCE}/{name}"] = {k: v for k, v in ratios.items() if v is not None}
        workloads[workload] = entry
    startup: Dict[str, Any] = {}
    for name, data in bench.startup.items():
        rounds = data["rounds"]
        medians = {k: median([r[k] for r in rounds if k in r]) for k, _ in STARTUP_METRICS}
        startup[name] = {"status": data["status"], "median": medians, "rounds": rounds}
        if name in bench.rss_after_load:
            startup[name]["after_load"] = bench.rss_after_load[name]
    startup_ratios: Dict[str, Any] = {}
    if REFERENCE in startup:
        for name in startup:
            if name != REFERENCE:
                mine, theirs = startup[REFERENCE]["rounds"], startup[name]["rounds"]
                ratios = {k: paired_ratio(mine, theirs, k) for k, _ in STARTUP_METRICS}
                after = _div(
                    startup[REFERENCE].get("after_load", {}).get("rss_mib"),
                    startup[name].get("after_load", {}).get("rss_mib"),
                )
                startup_ratios[f"{REFERENCE}/{name}"] = {**ratios, "rss_mib_after_load": after}
    return {
        "meta": meta,
        "targets": {t.name: {"label": t.label, "argv": t.argv_prefix, "env": t.env} for t in targets},
        "workloads": workloads,
        "startup": startup,
        "startup_ratios": startup_ratios,
        "grpc_available": bench.grpc,
        "sweep": bench.sweep,
        "memory": bench.memory,
        "perf_analyzer_shm": shm_over_bytes(bench.cells, names),
    }


# perf_analyzer's rows with system shared memory, and the rows sending the bytes they are compared with
# (`simple`; and the sweep's, by tensor size: bench/perf_analyzer.py's SWEEP_ELEMENTS)
SHM_PAIRS = {
    f"{protocol}{size}": (f"pa_{protocol}_c8{size}_shm", f"pa_{protocol}_c8{size}")
    for size in ("", *(f"_{size_label(elements * 4)}" for elements in SWEEP_ELEMENTS))
    for protocol in ("http", "grpc")
}


def shm_over_bytes(cells: Dict[str, Any], names: Sequence[str]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per target and protocol, the shared-memory row over the bytes row at the same concurrency.

    Medians of per-round ratios (the two rows of a round ran minutes apart at most), for infer/s (above 1:
    shared memory is faster) and the server's CPU per inference (below 1: cheaper).
    """
    found: Dict[str, Dict[str, Dict[str, float]]] = {}
    for name in names:
        for protocol, (shm_row, bytes_row) in SHM_PAIRS.items():
            shm_cell, bytes_cell = cells.get(shm_row, {}).get(name), cells.get(bytes_row, {}).get(name)
            if shm_cell is None or bytes_cell is None:
                continue
            ratios = {key: paired_ratio(shm_cell.rounds, bytes_cell.rounds, key) for key in ("infer_s", "cpu_us_req")}
            kept = {key: value for key, value in ratios.items() if value is not None}
            if kept:
                found.setdefault(name, {})[protocol] = kept
    return found


def shm_table(summary: Dict[str, Any]) -> str:
    """The shared-memory / bytes ratios of the perf_analyzer rows, one line per target ('' when none)."""
    found = summary.get("perf_analyzer_shm") or {}
    if not found:
        return ""
    shown = [label for label in SHM_PAIRS if any(label in protocols for protocols in found.values())]
    header = ["perf_analyzer c8: shm / bytes"]
    for label in shown:
        header += [f"{label} infer/s", f"{label} CPU/inf"]
    rows = []
    for name, protocols in found.items():
        cells = [name]
        for label in shown:
            for key in ("infer_s", "cpu_us_req"):
                cells.append(_ratio(protocols.get(label, {}).get(key)))
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(lines)


def _fmt(value: Optional[float], key: str = "") -> str:
    """A table cell."""
    if value is None:
        return "-"
    if key in ("rps", "infer_s", "identity_c64_rps", "mib_s", "rss_mib", "pss_mib", "errors"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def table(summary: Dict[str, Any]) -> str:
    """The printed report: medians per target and the median paired ratio ours/other."""
    names = list(summary["targets"])
    others = [n for n in names if n != REFERENCE] if REFERENCE in names else []
    header = ["workload", "metric", *names, *[f"{REFERENCE}/{o}" for o in others]]
    rows: List[List[str]] = []
    notes: List[str] = []
    for workload, entry in summary["workloads"].items():
        targets = entry["targets"]
        for name in names:
            status = targets.get(name, {}).get("status", "-")
            if status != "ok":
                notes.append(f"{workload} / {name}: {status}")
        first = True
        for key, label in METRICS:
            values = [targets.get(n, {}).get("median", {}).get(key) for n in names]
            if all(v is None for v in values) or (key == "errors" and not any(values)):
                continue
            ratios = [entry["ratios"].get(f"{REFERENCE}/{o}", {}).get(key) for o in others]
            cells = [_fmt(v, key) if v is not None else _short(targets, n) for v, n in zip(values, names)]
            rows.append([workload if first else "", label, *cells, *[_ratio(r) for r in ratios]])
            first = False
        if first:  # nothing measured at all
            rows.append([workload, "-", *[_short(targets, n) for n in names], *["-" for _ in others]])
    startup = summary["startup"]
    first = True
    for key, label in STARTUP_METRICS:
        values = [startup.get(n, {}).get("median", {}).get(key) for n in names]
        if all(v is None for v in values):
            continue
        ratios = [_ratio(summary["startup_ratios"].get(f"{REFERENCE}/{o}", {}).get(key)) for o in others]
        rows.append(["startup" if first else "", label, *[_fmt(v, key) for v in values], *ratios])
        first = False
    after = [startup.get(n, {}).get("after_load", {}).get("rss_mib") for n in names]
    if any(v is not None for v in after):
        ratios = [
            _ratio(summary["startup_ratios"].get(f"{REFERENCE}/{o}", {}).get("rss_mib_after_load")) for o in others
        ]
        rows.append(["after load", "RSS MiB", *[_fmt(v, "rss_mib") for v in after], *ratios])
    memory = summary.get("memory") or {}
    first = True
    for row in sorted({row for rows_of in memory.values() for row in rows_of}, key=_memory_order):
        peaks = [memory.get(n, {}).get(row, {}).get("x_tensor") for n in names]
        mine = memory.get(REFERENCE, {}).get(row, {}).get("x_tensor")
        ratios = [_ratio(_div(mine, memory.get(o, {}).get(row, {}).get("x_tensor"))) for o in others]
        label = f"{row} peak"
        cells = ["-" if v is None else f"{v:.2f}x" for v in peaks]
        rows.append(["memory (x tensor)" if first else "", label, *cells, *ratios])
        first = False
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if notes:
        lines += ["", "not measured:", *[f"  {note}" for note in notes]]
    return "\n".join(lines)


def _memory_order(row: str) -> Tuple[int, str]:
    """'http 8 MiB' before 'http 32 MiB': by size, then protocol."""
    protocol, size, _ = row.split()
    return int(size), protocol


def _short(targets: Dict[str, Any], name: str) -> str:
    """A short status for a table cell."""
    status = targets.get(name, {}).get("status", "-")
    if status == "ok":
        return "-"
    return {"n/a": "n/a", "not available": "not avail."}.get(status, status.split(":")[0])


def _ratio(value: Optional[float]) -> str:
    """A ratio cell."""
    return "-" if value is None else f"{value:.2f}x"


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a/b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def sweep_table(sweep: Dict[str, List[Dict[str, float]]]) -> str:
    """Req/s and p99 per connection count, one column pair per target."""
    names = [name for name, points in sweep.items() if points]
    conns = sorted({int(p["connections"]) for name in names for p in sweep[name]})
    header = ["sweep conns", *[f"{n} req/s" for n in names], *[f"{n} p99 ms" for n in names]]
    rows = []
    for c in conns:
        points = {n: next((p for p in sweep[n] if int(p["connections"]) == c), {}) for n in names}
        rows.append(
            [
                str(c),
                *[_fmt(points[n].get("rps"), "rps") for n in names],
                *[_fmt(points[n].get("p99_ms")) for n in names],
            ]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def write_json(summary: Dict[str, Any], path: pathlib.Path) -> None:
    """Write the summary (and a copy as latest.json beside it)."""
    text = json.dumps(summary, indent=2, sort_keys=False, default=str)
    path.write_text(text)
    (path.parent / "latest.json").write_text(text)


def plot_sweep(sweep: Dict[str, List[Dict[str, float]]], labels: Dict[str, str], path: pathlib.Path) -> Optional[str]:
    """Throughput and p99 against connections, one line per target; a reason when no plot was made."""
    if not any(sweep.values()):
        return "no sweep data"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: `.venv/bin/pip install matplotlib` to get the sweep plot"
    fig, (ax_rps, ax_p99) = plt.subplots(1, 2, figsize=(12, 4.5))
    ticks: List[float] = []
    for name, points in sweep.items():
        if not points:
            continue
        conns = [p["connections"] for p in points]
        label = f"{name} ({labels.get(name, '')})" if labels.get(name) else name
        ticks = sorted(set(ticks) | set(conns))
        ax_rps.plot(conns, [p["rps"] for p in points], marker="o", label=label)
        ax_p99.plot(conns, [p.get("p99_ms", float("nan")) for p in points], marker="o", label=label)
    for ax, title, ylabel in (
        (ax_rps, "Throughput, identity FP32 [1,16], HTTP binary", "requests / s"),
        (ax_p99, "p99 latency", "ms"),
    ):
        log2_axes(ax, ticks, "connections (wrk)", ylabel, title)
    ax_p99.set_yscale("log")
    save_figure(fig, path)
    return None


def log2_axes(ax: Any, ticks: Sequence[float], xlabel: str, ylabel: str, title: str) -> None:
    """A log2 x axis ticked at the measured points, with labels, a grid and the legend."""
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [f"{t:.0f}" for t in ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def save_figure(fig: Any, path: pathlib.Path) -> None:
    """Lay a figure out, write it as PNG and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
