"""The workloads: what each one sends, to which model, at which concurrency, and how one run is measured."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence

from bench import loadgen
from bench.payloads import GRPC_PATH, Payload, batching_counters, grpc_frame, grpc_message, http_body, model_stats
from bench.perf_analyzer import ROWS
from bench.servers import ACCESS_TOKEN, ServerProcess

MIB = 2**20
LARGE_SHAPE = (1, MIB // 4)  # 1 MiB of FP32
SMALL_SHAPE = (1, 16)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One load configuration; `groups` are the names `--workloads` also accepts."""

    name: str
    payload: Payload
    connections: int
    streams: int = 1  # gRPC: concurrent streams per connection (h2load -m)
    groups: Sequence[str] = ()
    description: str = ""

    @property
    def grpc(self) -> bool:
        """Whether it runs over gRPC (h2load) rather than HTTP (wrk)."""
        return self.payload.protocol == "grpc"

    @property
    def batching(self) -> bool:
        """Whether it is the batching-efficiency workload."""
        return self.payload.model == "batching"

    @property
    def large(self) -> bool:
        """Whether throughput is also reported in MiB/s."""
        return self.payload.tensor_bytes >= MIB

    @property
    def in_flight(self) -> int:
        """Requests in flight at once."""
        return self.connections * self.streams


def _identity(protocol: str, shape: tuple = SMALL_SHAPE) -> Payload:  # type: ignore[type-arg]
    return Payload("identity", protocol, shape)


WORKLOADS: List[Workload] = [
    Workload("http_json_c1", _identity("json"), 1, groups=("http",), description="identity [1,16] JSON, 1 conn"),
    Workload("http_json_c32", _identity("json"), 32, groups=("http",), description="identity [1,16] JSON, 32 conns"),
    Workload("http_bin_c1", _identity("binary"), 1, groups=("http",), description="identity [1,16] binary, 1 conn"),
    Workload("http_bin_c32", _identity("binary"), 32, groups=("http",), description="identity [1,16] binary, 32"),
    Workload("grpc_c1", _identity("grpc"), 1, 1, groups=("grpc",), description="identity [1,16] gRPC, 1 in flight"),
    Workload("grpc_m32", _identity("grpc"), 1, 32, groups=("grpc",), description="identity gRPC, 1 conn x 32 streams"),
    Workload(
        "http_bin_1mib", _identity("binary", LARGE_SHAPE), 4, groups=("http", "large"), description="1 MiB, 4 conns"
    ),
    Workload(
        "grpc_1mib", _identity("grpc", LARGE_SHAPE), 1, 4, groups=("grpc", "large"), description="1 MiB, 1x4 streams"
    ),
    Workload(
        "batching_c64",
        Payload("batching", "binary", SMALL_SHAPE),
        64,
        groups=("batching", "http"),
        description="2 ms/call model, 64 conns, vs identity at 64",
    ),
]
EXTRA_GROUPS = ("startup", "sweep", "memory", "perf_analyzer")
# Groups only named ones run (not in `all`): the shared-memory sweep's 12 perf_analyzer rows
OPT_IN_GROUPS = ("perf_analyzer_shm_sweep",)
# perf_analyzer's rows, which `--workloads` also takes one by one (bench/perf_analyzer.py's ROWS)
PA_ROW_NAMES = tuple(row.name for row in ROWS)
IDENTITY_C64 = Workload("http_bin_c64", _identity("binary"), 64, description="identity binary, 64 conns")


def select(spec: str) -> List[str]:
    """Workload and pseudo-workload names from a comma list of names or groups ('all' for everything)."""
    names: List[str] = []
    for item in (part.strip() for part in spec.split(",") if part.strip()):
        if item == "all":
            matched = [w.name for w in WORKLOADS] + list(EXTRA_GROUPS)
        elif item in EXTRA_GROUPS or item in OPT_IN_GROUPS or item in PA_ROW_NAMES:
            matched = [item]
        else:
            matched = [w.name for w in WORKLOADS if item == w.name or item in w.groups]
        if not matched:
            raise ValueError(f"unknown workload or group {item!r}")
        names += [name for name in matched if name not in names]
    return names


def by_name(name: str) -> Workload:
    """The workload called `name`."""
    return next(w for w in WORKLOADS if w.name == name)


def measure(
    workload: Workload, server: ServerProcess, duration: float, cpus: Optional[str], connections: int = 0
) -> Dict[str, float]:
    """Run `workload` once against `server` (optionally at another concurrency) and return its metrics."""
    conns = connections or workload.connections
    cpu_before = server.cpu_seconds()
    if workload.grpc:
        body = grpc_frame(grpc_message(workload.payload))
        headers = [("content-type", "application/grpc"), ("te", "trailers")]
        url = f"http://127.0.0.1:{server.grpc_port}{GRPC_PATH}"
        result = loadgen.run_h2load(url, body, headers, conns, workload.streams, duration, cpus)
    else:
        body, headers = http_body(workload.payload)
        url = f"{server.base_url}/v2/models/{workload.payload.model}/infer"
        result = loadgen.run_wrk(url, body, headers, conns, duration, cpus)
    if workload.large:
        result["mib_s"] = result["rps"] * workload.payload.tensor_bytes / MIB
        requests = result["rps"] * duration
        if requests:  # the whole tree's CPU over the run, per round trip (both directions of the tensor)
            result["cpu_us_req"] = (server.cpu_seconds() - cpu_before) * 1e6 / requests
    return result


def measure_batching(
    workload: Workload, server: ServerProcess, duration: float, cpus: Optional[str]
) -> Dict[str, float]:
    """Identity at 64 conns, then the 2 ms batching model at 64 conns; the average batch it saw; their ratio."""
    reference = measure(IDENTITY_C64, server, duration, cpus)
    counters_before = batching_counters(server.base_url)
    stats_before = model_stats(server.base_url, "batching", ACCESS_TOKEN)
    result = measure(workload, server, duration, cpus)
    time.sleep(0.3)  # let requests still queued when wrk stopped finish
    stats_after = model_stats(server.base_url, "batching", ACCESS_TOKEN)
    counters_after = batching_counters(server.base_url)
    result["identity_c64_rps"] = reference["rps"]
    result["vs_identity"] = result["rps"] / reference["rps"] if reference["rps"] else float("nan")
    if counters_before and counters_after:
        # the "after" probe is one more call of one row
        calls = counters_after[0] - counters_before[0] - 1
        rows = counters_after[1] - counters_before[1] - 1
        if calls > 0:
            result["avg_batch"] = rows / calls
            result["model_calls"] = float(calls)
    if stats_before and stats_after:
        executions = stats_after[1] - stats_before[1]
        if executions > 0:
            result["avg_batch_stats"] = (stats_after[0] - stats_before[0]) / executions
    return result


Runner = Callable[[Workload, ServerProcess, float, Optional[str]], Dict[str, float]]


def runner_for(workload: Workload) -> Runner:
    """The function measuring one run of `workload`."""
    return measure_batching if workload.batching else measure
