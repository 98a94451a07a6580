"""Triton's perf_analyzer against the `simple` model: finding the binary, one measured run, the rows.

perf_analyzer is the client Triton's users measure with. It ships in tritonclient 2.40.0's wheel; the bench
installs nothing: bench/install_perf_analyzer.sh puts it (with the two libraries it loads) into
/tmp/perf-analyzer, and `--perf-analyzer PATH` (or BENCH_PERF_ANALYZER) points elsewhere.

A run is `perf_analyzer -m simple -u 127.0.0.1:PORT -i http|grpc --concurrency-range N:N` with exactly
three measurement windows of a third of the bench's duration each (`--max-trials 3`) and its stability
check off (`-s 10000`: on a busy two-core machine even `-s 100` failed runs), so a run takes the bench's
duration plus perf_analyzer's start; the rounds give the medians, as for wrk and h2load. Its CSV (`-f`)
gives infer/s and the p50/p99 latencies of those windows. The server's CPU per inference is measured
around the run: the process tree's CPU time over the count of inferences the server's statistics say it
served.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional

from bench.payloads import model_stats
from bench.servers import ACCESS_TOKEN, ServerProcess

DEFAULT_PATH = pathlib.Path(os.environ.get("BENCH_PERF_ANALYZER", "/tmp/perf-analyzer/perf_analyzer"))
INSTALL_HINT = (
    "install it with `bash bench/install_perf_analyzer.sh` (into /tmp/perf-analyzer), or pass --perf-analyzer"
)
MODEL = "simple"
WIDE_MODEL = "wide"  # `simple` in FP32 of any length (bench/model_server.py): the shared-memory sweep's
GROUP = "perf_analyzer"
# The rows that show from which tensor size shared memory beats sending the bytes (not in GROUP: 12 rows).
SWEEP_GROUP = "perf_analyzer_shm_sweep"
SWEEP_ELEMENTS = (1024, 16384, 262144)  # FP32 per tensor: 4 KiB, 64 KiB, 1 MiB


@dataclasses.dataclass(frozen=True)
class Row:
    """One perf_analyzer configuration."""

    protocol: str  # "http" or "grpc"
    concurrency: int
    shared_memory: bool = False
    elements: int = 0  # 0: `simple` (INT32 [1,16]); else `wide` with this many FP32 per tensor

    @property
    def name(self) -> str:
        """The workload name the report shows: pa_http_c8, pa_grpc_c8_shm, pa_grpc_c8_64KiB_shm, ..."""
        size = f"_{size_label(self.elements * 4)}" if self.elements else ""
        return f"pa_{self.protocol}_c{self.concurrency}{size}" + ("_shm" if self.shared_memory else "")

    @property
    def model(self) -> str:
        """The model the row measures."""
        return WIDE_MODEL if self.elements else MODEL

    def arguments(self) -> List[str]:
        """perf_analyzer's arguments for the model and its tensors."""
        shapes = [f"--shape=INPUT{index}:{self.elements}" for index in range(2)] if self.elements else []
        if not self.shared_memory:
            return ["-m", self.model, *shapes]
        # perf_analyzer's output regions hold 100 KiB unless told more
        room = [f"--output-shared-memory-size={self.elements * 4}"] if self.elements * 4 > 102400 else []
        return ["-m", self.model, *shapes, "--shared-memory", "system", *room]

    @property
    def in_group(self) -> str:
        """The group of workloads the row belongs to."""
        return SWEEP_GROUP if self.elements else GROUP


def size_label(size: int) -> str:
    """4KiB, 64KiB, 1MiB."""
    return f"{size >> 20}MiB" if size >= 1 << 20 and not size % (1 << 20) else f"{size >> 10}KiB"


ROWS: List[Row] = [
    *[Row(protocol, concurrency) for protocol in ("http", "grpc") for concurrency in (1, 8, 32)],
    Row("http", 8, shared_memory=True),
    Row("grpc", 8, shared_memory=True),
    *[
        Row(protocol, 8, shared, elements)
        for elements in SWEEP_ELEMENTS
        for protocol in ("http", "grpc")
        for shared in (False, True)
    ],
]


def find(path: Optional[str]) -> Optional[pathlib.Path]:
    """The perf_analyzer to run (`path`, else the default location, else PATH), None when there is none."""
    candidates = [pathlib.Path(path)] if path else [DEFAULT_PATH]
    if not path and shutil.which("perf_analyzer"):
        candidates.append(pathlib.Path(str(shutil.which("perf_analyzer"))))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def missing_note(path: Optional[str]) -> str:
    """The status of the perf_analyzer rows when there is no perf_analyzer: what to run to get them."""
    where = f" at {path}" if path else ""
    return f"skipped: perf_analyzer not found{where} (bash bench/install_perf_analyzer.sh, or --perf-analyzer PATH)"


def run(
    binary: pathlib.Path,
    server: ServerProcess,
    row: Row,
    duration: float,
    cpus: Optional[str],
) -> Dict[str, float]:
    """One measured perf_analyzer run of `row` against `server`: infer/s, p50/p99 ms, server CPU us per inference."""
    port = server.http_port if row.protocol == "http" else server.grpc_port
    interval_ms = max(200, int(duration * 1000 / 3))
    before = model_stats(server.base_url, row.model, ACCESS_TOKEN)
    cpu_before = server.cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="bench-pa-") as tmp:
        report = pathlib.Path(tmp) / "pa.csv"
        argv = [str(binary), *row.arguments(), "-u", f"127.0.0.1:{port}", "-i", row.protocol]
        argv += ["--concurrency-range", f"{row.concurrency}:{row.concurrency}"]
        argv += ["--measurement-interval", str(interval_ms), "--stability-percentage", "10000", "--max-trials", "3"]
        argv += ["-f", str(report)]
        if cpus and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=duration * 4 + 60, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"perf_analyzer did not finish within {duration * 4 + 60:.0f}s") from None
        if done.returncode != 0 or not report.exists():
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise RuntimeError(f"perf_analyzer exited with {done.returncode}: {tail}")
        result = parse_csv(report.read_text())
    cpu_after = server.cpu_seconds()
    after = model_stats(server.base_url, row.model, ACCESS_TOKEN)
    if before and after and after[0] > before[0]:
        result["cpu_us_req"] = (cpu_after - cpu_before) * 1e6 / (after[0] - before[0])
    return result


def parse_csv(text: str) -> Dict[str, float]:
    """infer/s and the p50/p99 latencies in ms from perf_analyzer's `-f` report."""
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise RuntimeError("perf_analyzer wrote an empty report")
    last = rows[-1]
    try:
        rate = float(last["Inferences/Second"])
        return {
            "infer_s": rate,
            "p50_ms": float(last["p50 latency"]) / 1000,
            "p99_ms": float(last["p99 latency"]) / 1000,
        }
    except (KeyError, ValueError) as error:
        raise RuntimeError(f"unexpected perf_analyzer report ({error}): {text[:200]!r}") from None


def verify(server: ServerProcess) -> Optional[str]:
    """None when `simple` answers the sum and the difference of its inputs over HTTP; else what is wrong."""
    try:
        import numpy as np
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        try:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            b = np.full((1, 16), 3, dtype=np.int32)
            inputs = [
                httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                httpclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer(MODEL, inputs)
            if not (
                np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
            ):
                return "wrong sum or difference"
        finally:
            client.close()
    except Exception as error:  # noqa: BLE001 - reported as the pair's status
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None
