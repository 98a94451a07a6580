"""Benchmark this project's pytriton against NVIDIA's PyTriton, a previous version, and a bare ASGI ceiling.

    .venv/bin/python -m bench                 # full run (~8-10 minutes)
    .venv/bin/python -m bench --quick         # < 2 minutes
    .venv/bin/python -m bench --workloads http,startup --targets ours,nvidia --rounds 5
    .venv/bin/python -m bench --baseline-ref HEAD~3
    .venv/bin/python -m bench gpu --help      # the GPU bench (bench/gpu/)
    .venv/bin/python -m bench frontends       # 1 and 2 frontend processes side by side (bench/frontends.py)
    .venv/bin/python -m bench instances       # process instances against thread instances
    .venv/bin/python -m bench openai          # streamed /v1/chat/completions against LitServe (bench/openai_stream.py)
    .venv/bin/python -m bench sequences       # a sequence's request against a plain one (bench/sequences.py)
    .venv/bin/python -m bench cpu_ab REF .    # server CPU per small request, commits side by side (bench/cpu_ab.py)
    .venv/bin/python -m bench instr_ab REF .  # the same in instructions, unmoved by the machine's load (valgrind)
    .venv/bin/python -m bench opcodes         # which Python functions a request runs, in bytecodes, per process

See bench/README.md for the workloads and how to read the output.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from bench import perf_analyzer, report, servers
from bench.runner import Bench, Options, log
from bench.workloads import EXTRA_GROUPS, OPT_IN_GROUPS, WORKLOADS, select

RESULTS_DIR = servers.BENCH_DIR / "results"
# `python -m bench NAME ...`: the module whose main(argv) runs it.
SUBCOMMANDS = {
    "frontends": "bench.frontends",
    "gpu": "bench.gpu.__main__",
    "openai": "bench.openai_stream",
    "cpu_ab": "bench.cpu_ab",
    "instr_ab": "bench.instructions_ab",
    "opcodes": "bench.opcodes",
    "sequences": "bench.sequences",
    "instances": "bench.instances",
}
FULL_SWEEP = "1,2,4,8,16,32,64,128"
QUICK_SWEEP = "1,8,32,128"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command line options."""
    groups = sorted({g for w in WORKLOADS for g in w.groups} | set(EXTRA_GROUPS) | set(OPT_IN_GROUPS))
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s runs, no warm-up, short sweep (< 2 min)")
    parser.add_argument(
        "--workloads",
        default="all",
        help=f"comma list of workload names or groups ({', '.join(groups)}, all); see --list. Default: all",
    )
    parser.add_argument("--skip", default="", help="comma list of workloads or groups to leave out")
    parser.add_argument(
        "--targets",
        default="ours,nvidia,asgi",
        help="comma list from ours, nvidia, asgi (bare ASGI ceiling on uvicorn), asgi-pt (the same echo on "
        "this project's HTTP server), grpc-aio, grpc-h2, grpclib, grpc-pt (a bare gRPC echo on grpc.aio, h2, "
        "grpclib and this project's HTTP/2 server); baseline is added by --baseline-ref",
    )
    parser.add_argument("--baseline-ref", help="also measure this project at this git ref (exported with git archive)")
    parser.add_argument("--rounds", type=int, help="rounds per workload, targets alternating (default 3; quick 1)")
    parser.add_argument("--duration", type=int, help="seconds per measured run (default 4; quick 2)")
    parser.add_argument("--warmup", type=int, help="seconds of warm-up before a pair's first run (default 1; quick 0)")
    parser.add_argument("--sweep-conns", help=f"connections for the sweep (default {FULL_SWEEP}; quick {QUICK_SWEEP})")
    parser.add_argument("--sweep-duration", type=int, help="seconds per sweep point (default 2; quick 1)")
    parser.add_argument("--server-cpus", default="1", help="taskset CPU list for the servers (default 1)")
    parser.add_argument("--load-cpus", default="0", help="taskset CPU list for wrk/h2load (default 0)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin servers and load generators")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for a server")
    parser.add_argument("--nvidia-run", help="NVIDIA PyTriton's env wrapper (default /tmp/nvidia-pytriton/run)")
    parser.add_argument(
        "--perf-analyzer",
        help=f"Triton's perf_analyzer binary (default {perf_analyzer.DEFAULT_PATH}, else PATH; "
        "bash bench/install_perf_analyzer.sh installs it)",
    )
    parser.add_argument(
        "--frontends",
        default="",
        help="comma list of frontend process counts for the perf_analyzer rows (e.g. 1,2): ours runs with "
        f"{servers.FRONTENDS_ENV}=1, and each N > 1 adds a target ours-fN started with {servers.FRONTENDS_ENV}=N",
    )
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS_DIR, help="where JSON/PNG/logs go")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = parser.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.duration = args.duration or (2 if quick else 4)
    args.warmup = args.warmup if args.warmup is not None else (0 if quick else 1)
    args.sweep_conns = args.sweep_conns or (QUICK_SWEEP if quick else FULL_SWEEP)
    args.sweep_duration = args.sweep_duration or (1 if quick else 2)
    try:
        args.frontends = sorted({int(n) for n in args.frontends.split(",") if n.strip()})
    except ValueError:
        parser.error(f"--frontends takes a comma list of counts, got {args.frontends!r}")
    if any(n < 1 for n in args.frontends):
        parser.error("--frontends counts must be at least 1")
    return args


def build_targets(args: argparse.Namespace, workdir: pathlib.Path) -> List[servers.Target]:
    """The targets asked for, 'ours' first; unavailable ones are reported and dropped."""
    if args.nvidia_run:
        servers.NVIDIA_RUN = pathlib.Path(args.nvidia_run)
    targets: List[servers.Target] = []
    for name in [n.strip() for n in args.targets.split(",") if n.strip()]:
        if name == "ours":
            targets.append(servers.ours_target(1 if args.frontends else None))
        elif name == "nvidia":
            target = servers.nvidia_target()
            if target is None:
                log(f"NOTE: NVIDIA PyTriton not found at {servers.NVIDIA_RUN}: install it with")
                log("      ../shared/peer/setup-nvidia-pytriton.sh /tmp/nvidia-pytriton  (skipping 'nvidia')")
            else:
                targets.append(target)
        elif name == "asgi":
            if importlib.util.find_spec("uvicorn") is None:
                log("NOTE: uvicorn is not installed (pip install -e \".[bench]\"): skipping the 'asgi' ceiling")
            else:
                targets.append(servers.asgi_target())
        elif name == "asgi-pt":
            targets.append(servers.asgi_pytriton_target())
        elif name in servers.GRPC_ECHOES:
            module = servers.GRPC_ECHOES[name][1]
            if importlib.util.find_spec(module) is None:
                log(f'NOTE: {module} is not installed (pip install -e ".[bench]"): skipping the {name!r} echo')
            else:
                targets.append(servers.grpc_echo_target(name))
        else:
            raise SystemExit(
                f"unknown target {name!r} (ours, nvidia, asgi, asgi-pt, {', '.join(servers.GRPC_ECHOES)};"
                " baseline comes with --baseline-ref)"
            )
    if args.baseline_ref:
        targets.append(servers.baseline_target(args.baseline_ref, workdir))
    rank = {"ours": 0, "nvidia": 1, "baseline": 2, "asgi": 3, "asgi-pt": 4}
    rank.update({name: 5 + index for index, name in enumerate(servers.GRPC_ECHOES)})
    targets.sort(key=lambda t: rank.get(t.name, 9))
    return targets


def _output(argv: List[str], cwd: Optional[str] = None) -> str:
    """First line of a command's output, '' when it fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else ""


def metadata(args: argparse.Namespace, targets: List[servers.Target]) -> Dict[str, Any]:
    """Where and how this session ran."""
    repo = str(servers.REPO_ROOT)
    meta: Dict[str, Any] = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable), "-m", "bench", *sys.argv[1:]]),
        "git_head": _output(["git", "-C", repo, "rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(_output(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"])),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "wrk": _output(["wrk", "--version"]) if shutil.which("wrk") else "missing",
        "h2load": _output(["h2load", "--version"]) if shutil.which("h2load") else "missing",
        "pinning": "off" if args.no_pin else {"servers": args.server_cpus, "load": args.load_cpus},
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "sweep_conns": args.sweep_conns,
        "sweep_duration_s": args.sweep_duration,
        "frontends": args.frontends,
    }
    if any(t.name == "nvidia" for t in targets):
        script = "import importlib.metadata as m; print(m.version('nvidia-pytriton'))"
        meta["nvidia_pytriton"] = _output([str(servers.NVIDIA_RUN), "python", "-c", script], cwd=tempfile.gettempdir())
    return meta


def main(argv: Optional[List[str]] = None) -> int:
    """Run the bench, print the table, write the JSON summary and the sweep plot (`gpu`: the GPU bench)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in SUBCOMMANDS:  # imported only when asked: each may need packages the others don't
        command: Callable[[List[str]], int] = importlib.import_module(SUBCOMMANDS[argv[0]]).main
        return command(argv[1:])
    args = parse_args(argv)
    if args.list:
        for workload in WORKLOADS:
            print(f"{workload.name:<16} [{','.join(workload.groups)}] {workload.description}")
        print(f"{'startup':<16} [startup] process start to ready (fresh start per round), RSS of the process tree")
        print(f"{'sweep':<16} [sweep] identity binary over HTTP at {args.sweep_conns} connections; PNG plot")
        print(f"{'memory':<16} [memory] peak RSS over idle for one 1, 8 and 32 MiB request (HTTP, gRPC), fresh servers")
        for row in perf_analyzer.ROWS:
            shm = ", system shared memory" if row.shared_memory else ""
            shape = f" (FP32 [1,{row.elements}])" if row.elements else ""
            what = f"perf_analyzer -m {row.model}{shape}, {row.protocol}, c{row.concurrency}{shm}"
            print(f"{row.name:<22} [{row.in_group}] {what}")
        return 0
    chosen = select(args.workloads)
    skipped = set(select(args.skip)) if args.skip else set()
    chosen = [name for name in chosen if name not in skipped]
    started = time.perf_counter()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.results_dir / f"logs-{stamp}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        targets = build_targets(args, pathlib.Path(tmp))
        if not targets:
            raise SystemExit("no target to measure")
        pin = (os.cpu_count() or 1) >= 2 and not args.no_pin
        analyzer = perf_analyzer.find(args.perf_analyzer)
        groups = (perf_analyzer.GROUP, perf_analyzer.SWEEP_GROUP)
        if analyzer is None and any(name.startswith("pa_") or name in groups for name in chosen):
            log(f"NOTE: perf_analyzer rows {perf_analyzer.missing_note(args.perf_analyzer)}")
            log("      it installs into /tmp/perf-analyzer, outside the venv (bench/README.md, perf_analyzer)")
        options = Options(
            targets=targets,
            workloads=chosen,
            rounds=args.rounds,
            duration=args.duration,
            warmup=args.warmup,
            sweep_conns=[int(c) for c in args.sweep_conns.split(",")],
            sweep_duration=args.sweep_duration,
            server_cpus=args.server_cpus if pin else None,
            load_cpus=args.load_cpus if pin else None,
            startup_timeout=args.startup_timeout,
            log_dir=log_dir,
            perf_analyzer=analyzer,
            perf_analyzer_missing=perf_analyzer.missing_note(args.perf_analyzer),
            frontends=args.frontends,
        )
        meta = metadata(args, targets)
        meta["loadavg_before"] = round(os.getloadavg()[0], 2)
        if meta["loadavg_before"] > 0.5:
            log(f"WARNING: the machine is busy (1-min load average {meta['loadavg_before']}): figures will be noisy")
        log(f"bench: targets {', '.join(t.name for t in targets)}; workloads {', '.join(chosen)}")
        log(f"       {args.rounds} round(s) x {args.duration}s; pinning {meta['pinning']}; logs in {log_dir}")
        bench = Bench(options)
        try:
            bench.run()
        except KeyboardInterrupt:
            log("interrupted: reporting what was measured")
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    meta["loadavg_after"] = round(os.getloadavg()[0], 2)
    summary = report.summarize(bench, meta)
    if "sweep" in chosen:
        plot_path = args.results_dir / f"sweep-{stamp}.png"
        problem = report.plot_sweep(bench.sweep, {t.name: t.label for t in targets}, plot_path)
        summary["sweep_plot"] = None if problem else str(plot_path)
        if problem:
            log(f"NOTE: sweep plot skipped: {problem}")
    json_path = args.results_dir / f"bench-{stamp}.json"
    report.write_json(summary, json_path)
    print()
    print(report.table(summary))
    shm = report.shm_table(summary)
    if shm:
        print()
        print(shm)
    if bench.sweep:
        print()
        print(report.sweep_table(bench.sweep))
    print()
    print(f"targets: {', '.join(f'{t.name} = {t.label}' for t in bench.all_targets())}")
    print(f"ratios are medians of per-round ours/other ratios; {args.rounds} round(s) of {args.duration}s")
    print(f"summary: {json_path}" + (f"; plot: {summary['sweep_plot']}" if summary.get("sweep_plot") else ""))
    load = f"1-min load average {meta['loadavg_before']} before, {meta['loadavg_after']} after"
    print(f"elapsed: {meta['elapsed_s']:.0f}s; {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
