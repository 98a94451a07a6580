"""Frontend processes, side by side: small requests served with 1, 2 ... N frontends, and where the CPU went.

    python -m bench frontends                              # 1 and 2 frontends, 3 rounds x 4 s, one wrk/h2load thread
    python -m bench frontends --counts 1,2,4,8 --load-threads 4    # a machine with more cores
    python -m bench frontends --rows pa_http,pa_grpc --pa-concurrency 128   # Triton's perf_analyzer, `simple` model

Each round starts this checkout's server (bench/model_server.py: the identity model) once per frontend count, in
alternating order, unpinned (the load generator shares the cores, as clients do), and runs every row on it. A row
reports req/s, its ratio to 1 frontend taken within each round, p50, and the CPU per request of the process that
holds the batcher (the hub: it handles every frontend's requests, so its cost per request is the server's
ceiling) and of the frontend processes together, read from /proc.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from bench import loadgen
from bench import perf_analyzer as pa
from bench.payloads import GRPC_PATH, Payload, grpc_frame, grpc_message, http_body, model_stats
from bench.servers import ACCESS_TOKEN, FRONTENDS_ENV, ServerProcess, _cpu_seconds, descendants, ours_target
from bench.workloads import SMALL_SHAPE

FRONTEND_MODULE = "pytriton.runtime.frontends.process"
LOG_DIR = pathlib.Path(tempfile.mkdtemp(prefix="bench-frontends-"))


@dataclasses.dataclass(frozen=True)
class Row:
    """One load: a protocol, a request and its concurrency."""

    name: str
    payload: Payload
    connections: int
    streams: int = 1


# perf_analyzer's rows (bench/perf_analyzer.py): the `simple` model at --pa-concurrency requests in flight.
PA_ROWS = ("pa_http", "pa_grpc")
ROWS = [
    Row("http_bin_c32", Payload("identity", "binary", SMALL_SHAPE), 32),
    Row("http_json_c32", Payload("identity", "json", SMALL_SHAPE), 32),
    Row("grpc_c4x8", Payload("identity", "grpc", SMALL_SHAPE), 4, 8),
    Row("grpc_m32", Payload("identity", "grpc", SMALL_SHAPE), 1, 32),  # one connection: one frontend serves it
]


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench frontends", description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2", help="frontend counts to compare (1: the server's own loop)")
    parser.add_argument("--rows", default=",".join(row.name for row in ROWS), help=f"also {', '.join(PA_ROWS)}")
    parser.add_argument("--perf-analyzer", default=None, help="perf_analyzer to run (bench/perf_analyzer.py)")
    parser.add_argument("--pa-concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--load-threads", type=int, default=1, help="wrk/h2load threads")
    parser.add_argument("--json", default="", help="write the results here")
    return parser.parse_args(argv)


def _cpu(server: ServerProcess) -> Dict[str, float]:
    """CPU seconds so far of the hub and of its frontend processes together."""
    frontends = 0.0
    for pid in descendants(server.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if FRONTEND_MODULE.encode() in cmdline.read():
                    frontends += _cpu_seconds(pid)
        except OSError:
            continue
    return {"hub": _cpu_seconds(server.proc.pid), "frontends": frontends}


def _machine_ticks() -> Tuple[int, int]:
    """(busy, all) clock ticks of every core so far (/proc/stat): idle and iowait are not busy."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:9]]  # guest time is in user time already
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _busy_cores(before: Tuple[int, int], after: Tuple[int, int]) -> float:
    """How many of the machine's cores were busy between two `_machine_ticks`, whatever ran on them."""
    ticks = max(after[1] - before[1], 1)
    return (after[0] - before[0]) / ticks * (os.cpu_count() or 1)


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children: the load generator's runs, once each has ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load(row: Row, server: ServerProcess, seconds: float, threads: int) -> Callable[[], Dict[str, float]]:
    """The call that runs `row`'s load against `server` for `seconds`."""
    if row.payload.protocol == "grpc":
        url = f"http://127.0.0.1:{server.grpc_port}{GRPC_PATH}"
        frame = grpc_frame(grpc_message(row.payload))
        headers = [("content-type", "application/grpc"), ("te", "trailers")]
        return lambda: loadgen.run_h2load(url, frame, headers, row.connections, row.streams, seconds, None, threads)
    url = f"{server.base_url}/v2/models/{row.payload.model}/infer"
    body, extra = http_body(row.payload)
    return lambda: loadgen.run_wrk(url, body, extra, row.connections, seconds, None, threads)


def measure_pa(protocol: str, server: ServerProcess, args: argparse.Namespace) -> Dict[str, float]:
    """One perf_analyzer run against `simple`: infer/s, latency, and CPU per inference of each part of the server."""
    binary = pa.find(args.perf_analyzer)
    if binary is None:
        raise SystemExit(pa.missing_note(args.perf_analyzer))
    before, stats_before = _cpu(server), model_stats(server.base_url, pa.MODEL, ACCESS_TOKEN)
    load_before, ticks = _children_cpu(), _machine_ticks()
    result = pa.run(binary, server, pa.Row(protocol, args.pa_concurrency), args.duration, None)
    load_cpu, busy = _children_cpu() - load_before, _busy_cores(ticks, _machine_ticks())
    after, stats_after = _cpu(server), model_stats(server.base_url, pa.MODEL, ACCESS_TOKEN)
    count = max(stats_after[0] - stats_before[0], 1) if stats_before and stats_after else 1
    return {
        "rps": result["infer_s"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "hub_us": (after["hub"] - before["hub"]) / count * 1e6,
        "frontends_us": (after["frontends"] - before["frontends"]) / count * 1e6,
        "load_us": load_cpu / count * 1e6,
        "busy_cores": busy,
    }


def measure(row: Row, server: ServerProcess, args: argparse.Namespace) -> Dict[str, float]:
    """One run of a row: throughput, latency and CPU per request of each part of the server."""
    if args.warmup:
        _load(row, server, args.warmup, args.load_threads)()
    before, load_before, ticks = _cpu(server), _children_cpu(), _machine_ticks()
    result = _load(row, server, args.duration, args.load_threads)()
    after, load_cpu = _cpu(server), _children_cpu() - load_before
    result["busy_cores"] = _busy_cores(ticks, _machine_ticks())
    requests = max(result["requests"], 1.0)
    result["load_us"] = load_cpu / requests * 1e6
    result["hub_us"] = (after["hub"] - before["hub"]) / requests * 1e6
    result["frontends_us"] = (after["frontends"] - before["frontends"]) / requests * 1e6
    return result


def run(args: argparse.Namespace) -> Dict[str, Dict[int, List[Dict[str, float]]]]:
    """Every row at every count, for every round (counts in turn, reversed every other round)."""
    counts = [int(count) for count in args.counts.split(",")]
    names = args.rows.split(",")
    rows = [row for row in ROWS if row.name in names]
    pa_rows = [name for name in PA_ROWS if name in names]
    results: Dict[str, Dict[int, List[Dict[str, float]]]] = {
        name: {count: [] for count in counts} for name in [*(row.name for row in rows), *pa_rows]
    }
    for round_index in range(args.rounds):
        order = counts if round_index % 2 == 0 else counts[::-1]
        for count in order:
            target = ours_target(count)
            server = ServerProcess(target, None, LOG_DIR)
            try:
                server.wait_ready(120)
                runs: List[Tuple[str, Callable[[], Dict[str, float]]]] = [
                    (row.name, functools.partial(measure, row, server, args)) for row in rows
                ]
                runs += [(name, functools.partial(measure_pa, name[3:], server, args)) for name in pa_rows]
                for name, take in runs:
                    point = take()
                    results[name][count].append(point)
                    print(
                        f"round {round_index + 1} {name} frontends={count}: {point['rps']:,.0f} req/s, "
                        f"hub {point['hub_us']:.1f} us, frontends {point['frontends_us']:.1f} us, "
                        f"load generator {point['load_us']:.1f} us per request; "
                        f"{point['busy_cores']:.2f} of {os.cpu_count()} cores busy",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                server.stop()
    return results


def _ceiling(one: Dict[str, float]) -> float:
    """How many times 1 frontend's req/s this machine's cores could serve if no request cost more CPU than
    it does with 1 frontend (server and load generator together): the bound on any split of the I/O."""
    cost_us = one["hub_us"] + one["frontends_us"] + one["load_us"]
    return (os.cpu_count() or 1) / (cost_us * 1e-6) / one["rps"]


def table(results: Dict[str, Dict[int, List[Dict[str, float]]]]) -> str:
    """Medians per row and count; the ratio to 1 frontend is the median of the per-round ratios.

    "ceiling" is `_ceiling` of the same round's 1-frontend run: a ratio above it needs the frontends and the hub
    together to spend less CPU per request than the server of one process does. "busy cores" counts whatever ran
    (the kernel's network work, other processes): at the machine's cores, the CPU per request alone sets the req/s.
    """
    lines = [
        "| row | frontends | req/s | vs 1 | ceiling | p50 ms | hub CPU us/req | frontends CPU us/req "
        f"| load generator CPU us/req | busy cores (of {os.cpu_count()}) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_count in results.items():
        base = by_count.get(1, [])
        ceiling = f"{statistics.median(_ceiling(one) for one in base):.2f}x" if base else "-"
        for count, points in by_count.items():
            if not points:
                continue
            ratios = [point["rps"] / one["rps"] for point, one in zip(points, base)]
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            lines.append(
                f"| {name} | {count} | {statistics.median(p['rps'] for p in points):,.0f} | {ratio} "
                f"| {ceiling if count != 1 else '-'} "
                f"| {statistics.median(p.get('p50_ms', 0.0) for p in points):.2f} "
                f"| {statistics.median(p['hub_us'] for p in points):.1f} "
                f"| {statistics.median(p['frontends_us'] for p in points):.1f} "
                f"| {statistics.median(p['load_us'] for p in points):.1f} "
                f"| {statistics.median(p.get('busy_cores', 0.0) for p in points):.2f} |"
            )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    print(f"{FRONTENDS_ENV} counts {args.counts}, {args.rounds} rounds x {args.duration:g} s", file=sys.stderr)
    started = time.time()
    results = run(args)
    print(table(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "results": results, "seconds": time.time() - started}, out, indent=1)
    return 0
