"""Load generators: wrk for HTTP/1.1, h2load for gRPC over h2c. Both are light C tools, pinned apart.

Each run returns a flat dict: ``rps``, ``p50_ms``, ``p99_ms``, ``mean_ms``, ``max_ms``, ``errors``
(non-2xx plus socket errors and timeouts), ``requests``.

* wrk: ``-t1 -c N --latency`` with bench/post.lua; percentiles come from wrk's latency histogram.
* h2load: ``-t1 -c C -m M -D secs`` POSTing a gRPC-framed ModelInferRequest. h2load itself prints
  only min/max/mean/sd per request, so it also writes a per-request log (``--log-file``: start,
  status, elapsed µs) from which p50/p99 are computed exactly. h2load counts a gRPC error (HTTP 200
  with grpc-status != 0 in the trailers) as a success, which is why every workload is verified first.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

BENCH_DIR = pathlib.Path(__file__).resolve().parent
LUA_SCRIPT = BENCH_DIR / "post.lua"

INSTALL_HINT = {
    "wrk": "wrk is missing: install it with `apt-get install -y wrk` (HTTP workloads are skipped).",
    "h2load": "h2load is missing: install it with `apt-get install -y nghttp2-client` (gRPC workloads are skipped).",
}


def missing_tools() -> Dict[str, str]:
    """Install hints for the load generators not on PATH."""
    return {tool: hint for tool, hint in INSTALL_HINT.items() if shutil.which(tool) is None}


def _pinned(argv: List[str], cpus: Optional[str]) -> List[str]:
    """Prefix argv with taskset when a CPU list is given."""
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus, *argv]
    return argv


def run_wrk(
    url: str,
    body: bytes,
    headers: Sequence[Tuple[str, str]],
    connections: int,
    duration: float,
    cpus: Optional[str],
    threads: int = 1,
) -> Dict[str, float]:
    """POST `body` to `url` on `connections` keep-alive connections for `duration` seconds (`threads` of wrk)."""
    with tempfile.NamedTemporaryFile(prefix="bench-body-", suffix=".bin") as body_file:
        body_file.write(body)
        body_file.flush()
        env = dict(os.environ)
        env["BENCH_BODY"] = body_file.name
        env["BENCH_HEADERS"] = "\n".join(f"{name}: {value}" for name, value in headers)
        argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{_secs(duration)}", "--timeout", "10s", "--latency"]
        argv += ["-s", str(LUA_SCRIPT), url]
        proc = subprocess.run(
            _pinned(argv, cpus), env=env, capture_output=True, text=True, timeout=duration + 60, check=False
        )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"[:500])
    raw = json.loads(line.split(" ", 1)[1])
    secs = raw["duration_us"] / 1e6
    errors = sum(raw[key] for key in raw if key.endswith("_errors"))
    return {
        "rps": raw["requests"] / secs,
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "mean_ms": raw["mean_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": float(errors),
        "requests": float(raw["requests"]),
    }


def _secs(duration: float) -> str:
    """wrk/h2load accept whole seconds (at least 1)."""
    return f"{max(1, round(duration))}s"


_H2_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout"
)
_H2_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_H2_TIME = re.compile(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def run_h2load(
    url: str,
    body: bytes,
    headers: Sequence[Tuple[str, str]],
    connections: int,
    streams: int,
    duration: float,
    cpus: Optional[str],
    threads: int = 1,
) -> Dict[str, float]:
    """POST `body` over h2c: `connections` connections, `streams` concurrent streams each, `duration` secs."""
    with tempfile.TemporaryDirectory(prefix="bench-h2-") as tmp:
        body_path = pathlib.Path(tmp, "body.bin")
        body_path.write_bytes(body)
        log_path = pathlib.Path(tmp, "requests.log")
        argv = ["h2load", f"-t{threads}", f"-c{connections}", f"-m{streams}", "-D", _secs(duration)[:-1]]
        argv += ["-d", str(body_path), "--log-file", str(log_path)]
        for name, value in headers:
            argv += ["-H", f"{name}: {value}"]
        argv.append(url)
        proc = subprocess.run(_pinned(argv, cpus), capture_output=True, text=True, timeout=duration + 60, check=False)
        out = proc.stdout
        found = _H2_REQUESTS.search(out)
        finished = _H2_FINISHED.search(out)
        if proc.returncode != 0 or not found or not finished:
            raise RuntimeError(f"h2load failed ({proc.returncode}): {proc.stderr.strip() or out.strip()}"[-500:])
        elapsed = _elapsed_from_log(log_path)
    _total, _started, done, succeeded, _failed, errored, timeouts = (int(x) for x in found.groups())
    timing = _H2_TIME.search(out)
    result = {
        "rps": float(finished.group(3)),
        "errors": float(done - succeeded + errored + timeouts),
        "requests": float(succeeded),
    }
    if elapsed:
        elapsed.sort()
        result["p50_ms"] = _percentile(elapsed, 50) / 1000
        result["p99_ms"] = _percentile(elapsed, 99) / 1000
        result["mean_ms"] = sum(elapsed) / len(elapsed) / 1000
        result["max_ms"] = elapsed[-1] / 1000
    if timing:
        result["h2load_mean_ms"] = _ms(timing.group(3))
        result["h2load_sd_ms"] = _ms(timing.group(4))
    return result


def _elapsed_from_log(path: pathlib.Path) -> List[float]:
    """Per-request elapsed µs from h2load's log (start, status, elapsed), 2xx only."""
    values = []
    try:
        with open(path) as log:
            for line in log:
                parts = line.split()
                if len(parts) >= 3 and parts[1].startswith("2"):
                    values.append(float(parts[2]))
    except OSError:
        return []
    return values


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of sorted values."""
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def _ms(text: str) -> float:
    """h2load's '12.34ms' / '567us' / '1.2s' as milliseconds."""
    match = re.match(r"([\d.]+)(us|ms|s)", text)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
