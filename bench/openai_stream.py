"""`python -m bench openai`: streamed chat completions, this project against LitServe's OpenAISpec, in one run.

    python -m bench openai                   # 3 rounds x 4 s per concurrency (~4 minutes)
    python -m bench openai --quick           # 1 round x 2 s, no warm-up (~1 minute)
    python -m bench openai --targets litserve,ours,ours-gs   # /v1 and the generate_stream stand-in
    python -m bench openai --pytriton-path ../other-checkout      # another checkout's pytriton as `ours`

Every target serves the same toy generator: 64 tokens ("tok0 " ... "tok63 ") per request, no sleep.
`litserve` is bench/openai_litserve.py (LitServe's `OpenAISpec` at `/v1/chat/completions`, its defaults);
`ours` is bench/openai_pytriton.py with `openai=OpenAIChat(chat_template=None)` at `/v1/chat/completions`
(`ours-f2`: the same with two frontend processes); `ours-gs` is the same generator bound plainly and read
from `/v2/models/toy/generate_stream` (the KServe generate extension's server-sent events; `ours-gs-f2` with
two frontend processes); `ours-loop` and `ours-gs-loop` serve the tokens from an async generator instead, which
the server iterates on its event loop (no hop from an instance thread per token); `ours-b64` and `ours-gs-b64`
bind it with max_batch_size 64 instead of ModelConfig's default 4; `litserve-tuned` is
LitServe with `fast_queue=True` and uvicorn's log level "warning".

Each round starts each target in turn (order reversed every other round), verifies one stream (64 deltas
spelling the toy text, then `[DONE]` where the route sends it), and loads it at every concurrency with
bench/sse_load.py: C streams back to back for `--duration` s. Figures: tokens/s, time to first token
p50/p99, the server's CPU per streamed token (utime+stime of the server process and all its descendants,
from /proc) and the client's (getrusage of this process). Only one server runs at a time. Nothing is pinned
by default: client and server share the machine's cores, as on a developer's machine. Medians over rounds;
ratios ours/litserve are medians of the per-round ratios.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from bench import sse_load, stacks
from bench.servers import BENCH_DIR, FRONTENDS_ENV, REPO_ROOT, ServerProcess, Target, byte_compile, http_get

RESULTS_DIR = BENCH_DIR / "results"
LITSERVE_SCRIPT = BENCH_DIR / "openai_litserve.py"
PYTRITON_SCRIPT = BENCH_DIR / "openai_pytriton.py"
TOKENS = 64
EXPECTED_TEXT = "".join(f"tok{index} " for index in range(TOKENS))
CHAT_PATH = "/v1/chat/completions"
TARGETS = (
    *("litserve", "litserve-tuned", "ours", "ours-f2", "ours-loop", "ours-b64"),
    *("ours-gs", "ours-gs-f2", "ours-gs-loop", "ours-gs-b64"),
)
# The figures a table shows, and their labels (ratios read "ours / litserve": above 1x is better for us for
# tokens/s only).
FIGURES = {
    "tokens_s": "tokens/s",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "server_us_per_token": "server CPU us/token",
    "client_us_per_token": "client CPU us/token",
}


class StreamServer(ServerProcess):
    """A bench server whose readiness is one URL (LitServe has no /v2/health/ready)."""

    def __init__(self, target: Target, cpus: Optional[str], log_dir: pathlib.Path, ready_path: str, path: str):
        super().__init__(target, cpus, log_dir)
        self.ready_path = ready_path
        self.path = path

    def wait_ready(self, timeout: float) -> float:
        deadline = self.started_at + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.target.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if http_get(self.base_url + self.ready_path, timeout=0.5) == 200:
                self.startup_s = time.perf_counter() - self.started_at
                return self.startup_s
            time.sleep(0.02)
        raise TimeoutError(f"{self.target.name} not ready after {timeout:.0f}s: {self.log_tail()}")

    @property
    def url(self) -> str:
        return self.base_url + self.path


def make_target(name: str, pytriton_path: pathlib.Path) -> Target:
    """The server script and environment of one target name."""
    python = [sys.executable]
    if name.startswith("litserve"):
        tuned = {"BENCH_LITSERVE_FAST_QUEUE": "1", "BENCH_LITSERVE_LOG_LEVEL": "warning"}
        env = tuned if name == "litserve-tuned" else {}
        return Target(name, python, LITSERVE_SCRIPT, env, grpc=False, models=False, label=_litserve_label(name))
    env = {"PYTHONPATH": str(pytriton_path), FRONTENDS_ENV: "2" if name.endswith("-f2") else "1"}
    route = "generate_stream" if name.startswith("ours-gs") else "v1"
    label = f"pytriton at {pytriton_path}, {route}, {env[FRONTENDS_ENV]} frontend(s)"
    env["BENCH_OPENAI_ROUTE"] = route
    env["BENCH_TOY_ON_LOOP"] = "1" if name.endswith("-loop") else "0"
    if name.endswith("-loop"):
        label += ", async generator"
    if name.endswith("-b64"):
        env["BENCH_TOY_MAX_BATCH"] = "64"
        label += ", max_batch_size 64"
    return Target(name, python, PYTRITON_SCRIPT, env, grpc=False, models=False, label=label)


def _litserve_label(name: str) -> str:
    try:
        version = importlib.metadata.version("litserve")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    tuning = "fast_queue=True, log_level=warning" if name == "litserve-tuned" else "defaults"
    return f"LitServe {version}, {tuning}"


def start(target: Target, cpus: Optional[str], log_dir: pathlib.Path, timeout: float) -> StreamServer:
    """Start a target and wait until it answers its readiness URL."""
    if target.name.startswith("litserve"):
        server = StreamServer(target, cpus, log_dir, "/health", CHAT_PATH)
    elif target.name.startswith("ours-gs"):
        server = StreamServer(target, cpus, log_dir, "/v2/models/toy/ready", "/v2/models/toy/generate_stream")
    else:
        server = StreamServer(target, cpus, log_dir, "/v2/models/toy/ready", CHAT_PATH)
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


def request_body(server: StreamServer) -> bytes:
    """The chat request, or the generate extension's body for the stand-in route."""
    if server.target.name.startswith("ours-gs"):
        return json.dumps({"text_input": "Say something."}).encode()
    return sse_load.chat_body("toy", TOKENS)


def verify(server: StreamServer) -> str:
    """'' when one stream carries the 64 toy tokens in order (and `[DONE]` on /v1), else what went wrong."""
    stream = sse_load.fetch_one(server.url, request_body(server))
    if stream.error:
        return stream.error
    text = "".join(stream.text)
    if text != EXPECTED_TEXT or stream.tokens != TOKENS:
        return f"expected {TOKENS} deltas spelling the toy text, got {stream.tokens}: {text[:80]!r}"
    if server.path == CHAT_PATH and not stream.done:
        return "no data: [DONE] at the end of the stream"
    return ""


def measure(
    server: StreamServer, concurrency: int, seconds: float, profile: Optional[pathlib.Path] = None
) -> Dict[str, Any]:
    """One run at `concurrency` streams: the load's figures and the server's CPU per token (`profile`: py-spy's)."""
    body = request_body(server)
    profiler = stacks.record(server.proc.pid, seconds, profile) if profile else None
    cpu_before = server.cpu_seconds()
    result = sse_load.run_load(server.url, body, concurrency, seconds)
    cpu = server.cpu_seconds() - cpu_before
    if profiler is not None:
        profiler.join()
    figures, errors = sse_load.summarize(result)
    tokens = figures["tokens"]
    figures["server_cpu_s"] = cpu
    figures["server_us_per_token"] = cpu / tokens * 1e6 if tokens else 0.0
    figures["server_cores"] = cpu / result.wall_s if result.wall_s else 0.0
    figures["client_cores"] = result.client_cpu_s / result.wall_s if result.wall_s else 0.0
    return {"figures": figures, "errors": errors}


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench openai", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s per point, no warm-up")
    parser.add_argument("--targets", default="", help=f"comma list from {', '.join(TARGETS)} (default: see above)")
    parser.add_argument("--pytriton-path", type=pathlib.Path, default=REPO_ROOT, help="PYTHONPATH of ours-*")
    parser.add_argument("--concurrency", default="1,8,64", help="streams in flight, comma list")
    parser.add_argument("--rounds", type=int, help="default 3; quick 1")
    parser.add_argument("--duration", type=float, help="seconds per point (default 4; quick 2)")
    parser.add_argument("--warmup", type=float, help="seconds of load at each target's start (default 1; quick 0)")
    parser.add_argument("--server-cpus", default="", help="taskset CPU list for the servers (default: unpinned)")
    parser.add_argument("--load-cpus", default="", help="CPU list this client runs on (default: unpinned)")
    parser.add_argument(
        "--py-spy",
        type=pathlib.Path,
        help="record each point's server tree with py-spy into this folder (figures then include its cost)",
    )
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (2.0 if args.quick else 4.0)
    args.warmup = (0.0 if args.quick else 1.0) if args.warmup is None else args.warmup
    if not args.targets:
        has_v1 = (args.pytriton_path / "pytriton" / "openai").exists() or (
            args.pytriton_path / "pytriton" / "openai.py"
        ).exists()
        args.targets = "litserve,ours,ours-f2" if has_v1 else "litserve,ours-gs"
    unknown = set(args.targets.split(",")) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {', '.join(TARGETS)}")
    return args


Results = Dict[str, Dict[int, List[Dict[str, float]]]]  # target -> concurrency -> one figures dict per round


def run(args: argparse.Namespace, log_dir: pathlib.Path) -> Dict[str, Any]:
    """Every target at every concurrency, for every round (targets in turn, reversed every other round)."""
    names = args.targets.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if any(name.startswith("ours") for name in names):
        byte_compile(args.pytriton_path / "pytriton")
    targets = {name: make_target(name, args.pytriton_path) for name in names}
    results: Results = {name: {c: [] for c in concurrencies} for name in names}
    startup: Dict[str, List[float]] = {name: [] for name in names}
    failures: Dict[str, str] = {}
    if any(name.startswith("litserve") for name in names) and importlib.util.find_spec("litserve") is None:
        for name in names:
            if name.startswith("litserve"):
                failures[name] = "skipped: litserve is not installed (pip install litserve; Python >= 3.10)"
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            if name in failures:
                continue
            try:
                server = start(targets[name], args.server_cpus or None, log_dir, args.startup_timeout)
            except (RuntimeError, TimeoutError) as error:
                failures[name] = f"start failed: {error}"
                _log(f"{name}: {failures[name]}")
                continue
            try:
                startup[name].append(server.startup_s or 0.0)
                problem = verify(server)
                if problem:
                    failures[name] = f"verify failed: {problem}"
                    _log(f"{name}: {failures[name]}")
                    continue
                if args.warmup:
                    sse_load.run_load(server.url, request_body(server), max(concurrencies), args.warmup)
                for concurrency in concurrencies:
                    profile = args.py_spy / f"{name}-c{concurrency}-r{round_index + 1}.txt" if args.py_spy else None
                    point = measure(server, concurrency, args.duration, profile)
                    results[name][concurrency].append(point["figures"])
                    _log_point(round_index, name, concurrency, point)
                    if profile is not None and profile.exists():
                        shares = ", ".join(f"{file} {share:.0%}" for file, share in stacks.by_file(profile))
                        _log(f"  py-spy {profile.name}: {shares}")
            finally:
                server.stop()
    return {
        "targets": {name: targets[name].label for name in names},
        "results": results,
        "startup_s": startup,
        "failures": failures,
    }


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _log_point(round_index: int, name: str, concurrency: int, point: Dict[str, Any]) -> None:
    f = point["figures"]
    _log(
        f"round {round_index + 1} {name} c={concurrency}: {f['tokens_s']:,.0f} tokens/s, "
        f"TTFT p50 {f['ttft_p50_ms']:.1f} ms p99 {f['ttft_p99_ms']:.1f} ms, server {f['server_us_per_token']:.0f} "
        f"us/token ({f['server_cores']:.2f} cores), client {f['client_us_per_token']:.0f} us/token "
        f"({f['client_cores']:.2f} cores), {f['requests']:.0f} requests"
        + (f", {f['errors']:.0f} errors: {point['errors']}" if f["errors"] else "")
    )


def ratios(results: Results, name: str, base: str, concurrency: int, key: str) -> Optional[float]:
    """The median over rounds of name's figure over base's, within each round."""
    pairs = [
        (mine[key], theirs[key])
        for mine, theirs in zip(results.get(name, {}).get(concurrency, []), results.get(base, {}).get(concurrency, []))
        if theirs[key]
    ]
    return statistics.median(mine / theirs for mine, theirs in pairs) if pairs else None


def table(summary: Dict[str, Any]) -> str:
    """Medians per target and concurrency, then each non-LitServe target's ratio to `litserve`."""
    results: Results = summary["results"]
    names = [name for name in results if name not in summary["failures"]]
    others = [name for name in names if name != "litserve"] if "litserve" in names else []
    header = ["streams", "figure", *names, *(f"{name}/litserve" for name in others)]
    rows: List[List[str]] = []
    for concurrency in next(iter(results.values()), {}):
        for key, label in FIGURES.items():
            row = [str(concurrency) if key == "tokens_s" else "", label]
            for name in names:
                points = results[name][concurrency]
                value = statistics.median(p[key] for p in points) if points else None
                row.append("-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}")
            for name in others:
                ratio = ratios(results, name, "litserve", concurrency, key)
                row.append("-" if ratio is None else f"{ratio:.2f}x")
            rows.append(row)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(header, widths)) + " |"]
    lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    lines += ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |" for row in rows]
    for name, why in summary["failures"].items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.load_cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.load_cpus.split(",")})
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="bench-openai-"))
    load_before = os.getloadavg()[0]
    _log(f"targets {args.targets}; {args.rounds} rounds x {args.duration:g} s; server logs in {log_dir}")
    summary = run(args, log_dir)
    summary["meta"] = {
        "command": " ".join(sys.argv),
        "machine": f"{os.cpu_count()} CPUs, client and servers {'pinned' if args.server_cpus else 'unpinned'}",
        "load_average": [load_before, os.getloadavg()[0]],
        "args": {key: str(value) for key, value in vars(args).items()},
    }
    print(table(summary))
    out = args.results_dir / f"openai-{stamp}.json"
    out.write_text(json.dumps(summary, indent=1))
    _log(f"results: {out}")
    return 1 if any(not why.startswith("skipped") for why in summary["failures"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
