"""Where a served point's time goes: the server's CPU (its loop process by thread, its instance processes) and
the statistics extension's per-request queue and compute times, as differences over the measured window.

Read between two snapshots, so that a point says which of the server's parts was saturated: a loop thread at one
core, instance processes at one core each, or none (the GPU, or the load).
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
import urllib.request
from typing import Any, Dict, Optional

from bench.servers import _cpu_seconds, descendants

STAT_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def thread_seconds(pid: int) -> Dict[int, float]:
    """CPU seconds of each thread of `pid` (utime + stime of /proc/PID/task/TID/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: Dict[int, float] = {}
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def _inference_stats(base_url: str, model: str, token: str) -> Dict[str, Dict[str, int]]:
    """The model's inference_stats ({phase: {count, ns}}), empty when unavailable."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/stats", headers={"triton-access-token": token})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read())["model_stats"][0]["inference_stats"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}


class Usage:
    """Two snapshots of the server process tree's CPU and the model's statistics, taken by a thread at two
    wall-clock times (the measured window); `delta()` compares them."""

    def __init__(self, pid: int, base_url: str, model: str, token: str) -> None:
        self.pid, self.base_url, self.model, self.token = pid, base_url, model, token
        self._start: Optional[Dict[str, Any]] = None
        self._end: Optional[Dict[str, Any]] = None
        self._thread: Optional[threading.Thread] = None

    def window(self, begin: float, end: float) -> None:
        """Take the snapshots at the wall-clock times `begin` and `end`, in the background."""
        self._start = self._end = None
        self._thread = threading.Thread(target=self._take, args=(begin, end), daemon=True)
        self._thread.start()

    def _take(self, begin: float, end: float) -> None:
        time.sleep(max(begin - time.time(), 0.0))
        self._start = self._snapshot()
        time.sleep(max(end - time.time(), 0.0))
        self._end = self._snapshot()

    def _snapshot(self) -> Dict[str, Any]:
        children = descendants(self.pid)
        frontends = [child for child in children if _is_frontend(child)]
        return {
            "at": time.perf_counter(),
            "threads": thread_seconds(self.pid),
            "children": {child: _cpu_seconds(child) for child in children if child not in frontends},
            "frontends": {child: _cpu_seconds(child) for child in frontends},
            "stats": _inference_stats(self.base_url, self.model, self.token),
        }

    def delta(self) -> Dict[str, Any]:
        """Cores used in the window (the loop process, its busiest threads, the instance processes) and the
        mean milliseconds per request in each statistics phase; waits for the window's end."""
        assert self._thread is not None
        self._thread.join()
        begin, end = self._start, self._end
        assert begin is not None and end is not None
        elapsed = end["at"] - begin["at"]
        threads = sorted(
            ((seconds - begin["threads"].get(tid, 0.0)) / elapsed for tid, seconds in end["threads"].items()),
            reverse=True,
        )
        children = [(seconds - begin["children"].get(pid, 0.0)) / elapsed for pid, seconds in end["children"].items()]
        frontends = [
            (seconds - begin["frontends"].get(pid, 0.0)) / elapsed for pid, seconds in end["frontends"].items()
        ]
        per_request: Dict[str, float] = {}
        for phase in STAT_PHASES:
            before, after = begin["stats"].get(phase, {}), end["stats"].get(phase, {})
            count = int(after.get("count", 0)) - int(before.get("count", 0))
            if count > 0:
                per_request[phase] = (int(after.get("ns", 0)) - int(before.get("ns", 0))) / count / 1e6
        return {
            "front_cpu": round(sum(threads), 3),
            "front_threads": [round(value, 3) for value in threads[:4]],
            "instances_cpu": [round(value, 3) for value in sorted(children, reverse=True)],
            "frontends_cpu": [round(value, 3) for value in sorted(frontends, reverse=True)],
            "per_request_ms": {phase: round(value, 3) for phase, value in per_request.items()},
        }


def _is_frontend(pid: int) -> bool:
    """Whether process `pid` is a frontend process (pytriton/runtime/frontends/process.py)."""
    try:
        return b"pytriton.runtime.frontends.process" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def summary_line(usage: Dict[str, Any]) -> str:
    """One printed line: the cores each part used and the per-request phases."""
    threads = "/".join(f"{value:.2f}" for value in usage["front_threads"])
    instances = "/".join(f"{value:.2f}" for value in usage["instances_cpu"]) or "-"
    phases = " ".join(f"{phase} {value:.2f}" for phase, value in usage["per_request_ms"].items())
    cores = f"loop process {usage['front_cpu']:.2f} cores (threads {threads}), instances {instances}"
    if usage.get("frontends_cpu"):
        cores += ", frontends " + "/".join(f"{value:.2f}" for value in usage["frontends_cpu"])
    return f"    server CPU: {cores}; ms/request: {phases}"
