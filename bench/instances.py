"""`python -m bench instances`: process instances against thread instances, side by side in one run.

    python -m bench instances                       # 3 rounds x 4 s (~3 minutes)
    python -m bench instances --rounds 1 --duration 1 --warmup 0      # smoke test

One server (bench/instances_server.py) serves each model both ways; wrk loads them over HTTP binary,
thread and process alternating every round. Three comparisons:

* hop: identity [1,16], 1 connection: what the trip to another process adds to p50;
* 1 MiB: identity [1,262144] FP32, 4 connections: MiB/s through the shared-memory arenas;
* GIL: a callable holding the GIL 5 ms per call with 1, 2 and 4 instances, 8 connections: req/s.

The server is pinned to CPU 1 and wrk to CPU 0, as in the main bench; the GIL models' instance processes
unpin themselves (the cores are what they are for), the identity process stays on the server's core.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from bench import loadgen
from bench.instances_server import COUNTS
from bench.payloads import Payload, http_body, verify_http
from bench.report import median
from bench.servers import BENCH_DIR, REPO_ROOT, ServerProcess, Target, byte_compile
from bench.workloads import LARGE_SHAPE, MIB, SMALL_SHAPE

RESULTS_DIR = BENCH_DIR / "results"

# (name, payload shape, connections, thread model, process model)
COMPARISONS: List[Tuple[str, Tuple[int, int], int, str, str]] = [
    ("hop c1", SMALL_SHAPE, 1, "identity_thread", "identity_proc"),
    ("1 MiB c4", LARGE_SHAPE, 4, "identity_thread", "identity_proc"),
    *[(f"GIL 5 ms x{n} c8", SMALL_SHAPE, 8, f"gil_thread_{n}", f"gil_proc_{n}") for n in COUNTS],
]


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench instances", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=4, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of load before a model's first run")
    parser.add_argument("--server-cpus", default="1")
    parser.add_argument("--load-cpus", default="0")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def _run(
    server: ServerProcess, model: str, shape: Tuple[int, int], conns: int, seconds: float, cpus: Any
) -> Dict[str, float]:
    body, headers = http_body(Payload(model, "binary", shape))
    result = loadgen.run_wrk(f"{server.base_url}/v2/models/{model}/infer", body, headers, conns, seconds, cpus)
    if shape == LARGE_SHAPE:
        result["mib_s"] = result["rps"] * shape[0] * shape[1] * 4 / MIB
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Run every comparison, print the table, write the JSON."""
    args = parse_args(argv)
    if "wrk" in loadgen.missing_tools():
        raise SystemExit(loadgen.missing_tools()["wrk"])
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    server_cpus, load_cpus = (args.server_cpus, args.load_cpus) if pin else (None, None)
    byte_compile(REPO_ROOT / "pytriton")
    target = Target("ours", [sys.executable], BENCH_DIR / "instances_server.py", {}, grpc=False, models=False)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    results: Dict[str, Dict[str, List[Dict[str, float]]]] = {
        name: {"thread": [], "process": []} for name, *_ in COMPARISONS
    }
    with tempfile.TemporaryDirectory(prefix="bench-instances-") as logs:
        server = ServerProcess(target, server_cpus, pathlib.Path(logs))
        try:
            server.wait_ready(180)
            for _, shape, _, thread_model, process_model in COMPARISONS:
                for model in (thread_model, process_model):
                    problem = verify_http(server.base_url, Payload(model, "binary", shape))
                    if problem:
                        raise SystemExit(f"{model}: {problem}")
                    if args.warmup:
                        _run(server, model, shape, 1, args.warmup, load_cpus)
            for round_index in range(args.rounds):
                for name, shape, conns, thread_model, process_model in COMPARISONS:
                    order = [("thread", thread_model), ("process", process_model)]
                    for kind, model in order if round_index % 2 == 0 else order[::-1]:
                        result = _run(server, model, shape, conns, args.duration, load_cpus)
                        results[name][kind].append(result)
                        print(
                            f"[r{round_index + 1}] {name:<16} {kind:<8} {result['rps']:8.0f} req/s  p50 "
                            f"{result['p50_ms']:.3f} ms"
                            + (f"  {result['mib_s']:.0f} MiB/s" if "mib_s" in result else ""),
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            server.stop()
    rows = []
    for name, *_ in COMPARISONS:
        threads, processes = results[name]["thread"], results[name]["process"]
        row: Dict[str, Any] = {"comparison": name}
        for key in ("rps", "p50_ms", "mib_s"):
            a, b = median([r[key] for r in threads if key in r]), median([r[key] for r in processes if key in r])
            if a is not None and b is not None:
                row[key] = {"thread": a, "process": b, "process/thread": b / a if a else None}
        pairs = [p["p50_ms"] - t["p50_ms"] for t, p in zip(threads, processes)]
        row["p50_added_us"] = (median(pairs) or 0.0) * 1000
        rows.append(row)
    print(_table(rows))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.results_dir / f"instances-{stamp}.json"
    meta = {
        "rounds": args.rounds,
        "duration_s": args.duration,
        "pinning": "off" if not pin else [server_cpus, load_cpus],
    }
    path.write_text(json.dumps({"meta": meta, "comparisons": rows, "raw": results}, indent=2))
    print(f"\n{args.rounds} round(s) x {args.duration}s, medians; summary: {path}")
    return 0


def _table(rows: List[Dict[str, Any]]) -> str:
    header = ["comparison", "metric", "thread", "process", "process/thread"]
    lines: List[List[str]] = []
    for row in rows:
        first = True
        for key, label in (("rps", "req/s"), ("p50_ms", "p50 ms"), ("mib_s", "MiB/s")):
            if key not in row:
                continue
            cells = row[key]
            lines.append(
                [
                    row["comparison"] if first else "",
                    label,
                    f"{cells['thread']:,.3f}" if key == "p50_ms" else f"{cells['thread']:,.0f}",
                    f"{cells['process']:,.3f}" if key == "p50_ms" else f"{cells['process']:,.0f}",
                    f"{cells['process/thread']:.2f}x",
                ]
            )
            first = False
        lines.append(["", "p50 added", "", f"{row['p50_added_us']:+.0f} us", ""])
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    out.append("  ".join("-" * w for w in widths))
    out += [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
    ]
    return "\n".join(out)
