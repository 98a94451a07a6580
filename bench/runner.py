"""The bench loop: start the targets, verify, run rounds (targets alternating), sweep, stop everything."""

from __future__ import annotations

import dataclasses
import pathlib
import signal
import sys
from typing import Any, Callable, Dict, List, Optional

from bench import loadgen, memory
from bench import perf_analyzer as pa
from bench.payloads import verify_grpc, verify_http
from bench.servers import ServerProcess, Target, ours_target
from bench.workloads import IDENTITY_C64, WORKLOADS, Workload, by_name, measure, runner_for

SWEEP_WORKLOAD = dataclasses.replace(IDENTITY_C64, name="sweep_http_bin")


@dataclasses.dataclass
class Options:
    """What to run and how."""

    targets: List[Target]
    workloads: List[str]
    rounds: int
    duration: float
    warmup: float
    sweep_conns: List[int]
    sweep_duration: float
    server_cpus: Optional[str]
    load_cpus: Optional[str]
    startup_timeout: float
    log_dir: pathlib.Path
    perf_analyzer: Optional[pathlib.Path] = None  # the binary; None: the perf_analyzer rows are skipped
    perf_analyzer_missing: str = ""  # their status then
    frontends: List[int] = dataclasses.field(default_factory=list)  # --frontends: ours-fN for the perf_analyzer rows


@dataclasses.dataclass
class Cell:
    """One (workload, target) pair: its status and its per-round metrics."""

    status: str = "ok"
    rounds: List[Dict[str, float]] = dataclasses.field(default_factory=list)
    verified: bool = False


def log(message: str) -> None:
    """Progress to stderr, so stdout keeps only the report."""
    print(message, file=sys.stderr, flush=True)


class Bench:
    """Runs one bench session and collects raw results."""

    def __init__(self, options: Options) -> None:
        self.o = options
        self.servers: Dict[str, ServerProcess] = {}
        self.cells: Dict[str, Dict[str, Cell]] = {}
        self.startup: Dict[str, Dict[str, Any]] = {}
        self.rss_after_load: Dict[str, Dict[str, float]] = {}
        self.sweep: Dict[str, List[Dict[str, float]]] = {}
        self.memory: Dict[str, Dict[str, Dict[str, float]]] = {}  # target -> "http 32 MiB" -> peak over idle
        self.grpc: Dict[str, bool] = {}
        self.missing = loadgen.missing_tools()
        # ours with N frontend processes (--frontends, N > 1): servers of their own, for the perf_analyzer rows
        self.variants: List[Target] = [ours_target(n) for n in options.frontends if n != 1]
        self.pa_verified: Dict[str, Optional[str]] = {}

    def all_targets(self) -> List[Target]:
        """The targets, with the frontend variants of ours right after it."""
        ordered: List[Target] = []
        for target in self.o.targets:
            ordered.append(target)
            if target.name == "ours":
                ordered += self.variants
        return ordered

    def run(self) -> None:
        """Everything, stopping the servers whatever happens."""
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
        try:
            for hint in self.missing.values():
                log(f"NOTE: {hint}")
            self._start_all()
            self._load_rounds()
            if {pa.GROUP, pa.SWEEP_GROUP} & set(self.o.workloads) or any(
                row.name in self.o.workloads for row in pa.ROWS
            ):
                self._perf_analyzer()
            if "sweep" in self.o.workloads:
                self._sweep()
            if "memory" in self.o.workloads:
                self._memory()
            for name, server in self.servers.items():
                self.rss_after_load[name] = server.rss()
        finally:
            self._stop_all()
            signal.signal(signal.SIGTERM, previous)

    # -- servers -------------------------------------------------------------------------------

    def _start_all(self) -> None:
        """Start every target (measuring startup/RSS, fresh each round when 'startup' is selected)."""
        rounds = self.o.rounds if "startup" in self.o.workloads else 1
        for round_index in range(rounds):
            last = round_index == rounds - 1
            for target in self._order(round_index):
                if round_index and target.name not in self.startup:
                    continue  # it failed to start before
                server = self._start(target)
                if server is None:
                    continue
                if last:
                    self.servers[target.name] = server
                else:
                    server.stop()
        for name, server in self.servers.items():
            self.grpc[name] = server.grpc_available()
            if server.target.grpc and not self.grpc[name]:
                log(f"  {name}: gRPC port {server.grpc_port} does not answer: gRPC workloads 'not available'")

    def _start(self, target: Target) -> Optional[ServerProcess]:
        """Start one server and wait until it is ready; None (and a status) when it fails."""
        server = ServerProcess(target, self.o.server_cpus, self.o.log_dir)
        try:
            seconds = server.wait_ready(self.o.startup_timeout)
        except (RuntimeError, TimeoutError) as error:
            log(f"  {target.name}: failed to start: {error}")
            server.stop()
            self.startup.setdefault(target.name, {"status": f"failed to start: {str(error)[:200]}", "rounds": []})
            return None
        memory = server.rss()
        entry = self.startup.setdefault(target.name, {"status": "ok", "rounds": []})
        entry["rounds"].append({"startup_s": seconds, **memory})
        log(f"  {target.name}: ready in {seconds:.2f}s, RSS {memory['rss_mib']:.0f} MiB ({memory['processes']} procs)")
        return server

    def _stop_all(self) -> None:
        """Stop every server still running."""
        for server in self.servers.values():
            server.stop()

    def _order(self, round_index: int) -> List[Target]:
        """Targets in alternating order: A B C, then C B A, ..."""
        targets = list(self.o.targets)
        return targets if round_index % 2 == 0 else targets[::-1]

    # -- load ----------------------------------------------------------------------------------

    def _load_rounds(self) -> None:
        """Every load workload, every round, targets alternating."""
        workloads = [by_name(w.name) for w in WORKLOADS if w.name in self.o.workloads]
        for round_index in range(self.o.rounds):
            for workload in workloads:
                for target in self._order(round_index):
                    self._run_cell(workload, target, round_index)

    def _run_cell(self, workload: Workload, target: Target, round_index: int) -> None:
        """One measured run of `workload` on `target` (verifying and warming up the first time)."""
        cell = self.cells.setdefault(workload.name, {}).setdefault(target.name, Cell())
        if round_index == 0:
            cell.status = self._check(workload, target)
        if cell.status != "ok":
            if round_index == 0:
                log(f"[{workload.name}] {target.name}: {cell.status}")
            return
        server = self.servers[target.name]
        run = runner_for(workload)
        self._measured_run(
            cell,
            workload.name,
            target,
            round_index,
            lambda seconds: measure(workload, server, seconds, self.o.load_cpus),
            lambda seconds: run(workload, server, seconds, self.o.load_cpus),
        )

    def _measured_run(
        self,
        cell: Cell,
        name: str,
        target: Target,
        round_index: int,
        warm_up: Callable[[float], object],
        run: Callable[[float], Dict[str, float]],
    ) -> None:
        """Warm up (the first round), then one measured run into `cell`; a failed run or a dead server marks it."""
        server = self.servers[target.name]
        try:
            if round_index == 0 and self.o.warmup > 0:
                warm_up(self.o.warmup)
            result = run(self.o.duration)
        except (RuntimeError, OSError) as error:
            cell.status = f"error: {str(error)[:200]}"
            log(f"[{name}] {target.name}: {cell.status}")
            return
        if server.proc.poll() is not None:
            cell.status = f"server died (exit {server.proc.returncode})"
        cell.rounds.append(result)
        log(f"[r{round_index + 1}/{self.o.rounds}] {name:<14} {target.name:<8} {_brief(result)}")

    def _startup_status(self, target: Target) -> str:
        """Why a target that is not among the servers is not: it failed to start, or was never started."""
        return str(self.startup.get(target.name, {}).get("status", "not started"))

    def _check(self, workload: Workload, target: Target) -> str:
        """'ok' when `workload` can run on `target` and answers correctly; else why not."""
        if target.name not in self.servers:
            return self._startup_status(target)
        tool = "h2load" if workload.grpc else "wrk"
        if tool in self.missing:
            return f"skipped: {tool} not installed"
        if workload.batching and not target.models:
            return "n/a"
        if (workload.grpc and not target.grpc) or (not workload.grpc and not target.http):
            return "n/a"
        if workload.grpc and not self.grpc.get(target.name):
            return "not available"
        server = self.servers[target.name]
        tritonclient = target.models or workload.payload.model == "identity"
        if workload.grpc:
            problem = verify_grpc(server.grpc_port, workload.payload)
        else:
            problem = verify_http(server.base_url, workload.payload, use_tritonclient=tritonclient)
        return f"verify failed: {problem}" if problem else "ok"

    # -- perf_analyzer -------------------------------------------------------------------------

    def _perf_analyzer(self) -> None:
        """Triton's perf_analyzer against `simple`: every row every round, targets alternating."""
        if self.variants and self.o.perf_analyzer is not None and "ours" in self.servers:
            for variant in self.variants:
                server = self._start(variant)
                if server is not None:
                    self.servers[variant.name] = server
                    self.grpc[variant.name] = server.grpc_available()
        targets = self.all_targets()
        rows = [row for row in pa.ROWS if row.in_group in self.o.workloads or row.name in self.o.workloads]
        if self.o.perf_analyzer is None:  # noted once at the start
            for row in rows:
                for target in targets:
                    status = self.o.perf_analyzer_missing if target.models else "n/a"
                    self.cells.setdefault(row.name, {})[target.name] = Cell(status=status)
            return
        for round_index in range(self.o.rounds):
            for row in rows:
                for target in targets if round_index % 2 == 0 else targets[::-1]:
                    self._run_pa_cell(row, target, round_index)

    def _run_pa_cell(self, row: pa.Row, target: Target, round_index: int) -> None:
        """One measured perf_analyzer run of `row` on `target` (checked, and warmed up, the first time)."""
        cell = self.cells.setdefault(row.name, {}).setdefault(target.name, Cell())
        if round_index == 0:
            cell.status = self._check_pa(row, target)
            if cell.status != "ok":
                log(f"[{row.name}] {target.name}: {cell.status}")
        binary = self.o.perf_analyzer
        if cell.status != "ok" or binary is None:  # (None: the rows were marked skipped before)
            return
        server = self.servers[target.name]

        def run(seconds: float) -> Dict[str, float]:
            return pa.run(binary, server, row, seconds, self.o.load_cpus)

        self._measured_run(cell, row.name, target, round_index, run, run)

    def _check_pa(self, row: pa.Row, target: Target) -> str:
        """'ok' when perf_analyzer can measure `row` on `target`; else why not."""
        if not target.models:
            return "n/a"
        if target.name not in self.servers:
            return self._startup_status(target)
        if row.protocol == "grpc" and not self.grpc.get(target.name):
            return "not available"
        if target.name not in self.pa_verified:
            self.pa_verified[target.name] = pa.verify(self.servers[target.name])
        problem = self.pa_verified[target.name]
        return f"verify failed: {problem}" if problem else "ok"

    # -- sweep ---------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Identity [1,16] binary over HTTP at each concurrency, targets alternating per point."""
        if "wrk" in self.missing:
            return
        for index, conns in enumerate(self.o.sweep_conns):
            for target in self._order(index):
                server = self.servers.get(target.name)
                if server is None or not target.http:
                    continue
                if target.name not in self.sweep:
                    problem = verify_http(server.base_url, SWEEP_WORKLOAD.payload)
                    if problem:
                        log(f"[sweep] {target.name}: verify failed: {problem}")
                        self.sweep[target.name] = []
                        continue
                    self.sweep[target.name] = []
                try:
                    result = measure(SWEEP_WORKLOAD, server, self.o.sweep_duration, self.o.load_cpus, conns)
                except (RuntimeError, OSError) as error:
                    log(f"[sweep c{conns}] {target.name}: {error}")
                    continue
                self.sweep[target.name].append({"connections": float(conns), **result})
                log(f"[sweep c{conns:<3}] {target.name:<8} {_brief(result)}")

    # -- memory --------------------------------------------------------------------------------

    def _memory(self) -> None:
        """Peak RSS over idle while serving one 1, 8 and 32 MiB request, each on a fresh server (bench/memory.py)."""
        for mib in memory.SIZES_MIB:
            for protocol in memory.PROTOCOLS:
                for target in self._order(mib):
                    if (protocol == "grpc" and not target.grpc) or (protocol == "http" and not target.http):
                        continue
                    if target.name not in self.servers or not target.models:
                        continue  # it failed to start, or it is an echo without the identity model
                    row = f"{protocol} {mib} MiB"
                    try:
                        result = memory.peak_over_idle(
                            target, protocol, mib, self.o.server_cpus, self.o.log_dir, self.o.startup_timeout
                        )
                    except Exception as error:  # noqa: BLE001 - reported, the other rows still run
                        log(f"[memory {row}] {target.name}: {str(error)[:200]}")
                        continue
                    self.memory.setdefault(target.name, {})[row] = result
                    log(
                        f"[memory {row:<12}] {target.name:<8} peak over idle {result['peak_over_idle_mib']:6.1f} MiB"
                        f"  ({result['x_tensor']:.2f}x the tensor)"
                    )


def _brief(result: Dict[str, float]) -> str:
    """A one-line summary of a run."""
    text = f"{result['rps']:9.0f} req/s" if "rps" in result else f"{result['infer_s']:9.0f} infer/s"
    if "p50_ms" in result:
        text += f"  p50 {result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms"
    if "mib_s" in result:
        text += f"  {result['mib_s']:7.1f} MiB/s"
    if "cpu_us_req" in result:
        text += f"  server CPU {result['cpu_us_req']:6.1f} us/req"
    if "avg_batch" in result:
        text += f"  avg batch {result['avg_batch']:.1f}"
    if "vs_identity" in result:
        text += f"  vs identity@64 {result['vs_identity']:.2f}"
    if result.get("errors"):
        text += f"  ERRORS {result['errors']:.0f}"
    return text


def _raise_interrupt(*_: Any) -> None:
    """SIGTERM: unwind like Ctrl-C so the servers are stopped."""
    raise KeyboardInterrupt
