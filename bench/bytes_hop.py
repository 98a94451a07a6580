"""What a long BYTES tensor costs the hub when it crosses from a frontend process and back: CPU and loop stall.

`python -m bench.bytes_hop [--strings 1000,100000,1000000] [--frontends 3]`: a server (bench/json_stall.serve: an
identity model `bytes`, one input of shape [-1], no batching) with frontend processes; requests of so many 8-byte
strings over HTTP (binary tensors, tritonclient) and gRPC (raw contents). Per request: its time, the hub's CPU
(the server's own process, read from /proc: every thread of it) and frontends' CPU, and the hub loop's worst gap
between two turns while it ran (json_stall._probe_loop). With 3 frontends the hub serves no connection itself
(options/frontends.py), so every request makes the hop; with 2 its first connections are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

from bench.json_stall import LAG_FILE_ENV, loop_worst_ms, serving
from tests.frontend_processes import frontend_pids

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (every thread), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _repeats(count: int) -> int:
    return 40 if count <= 1000 else 10 if count <= 100_000 else 4


def measure(port: int, server_pid: int, strings: List[int]) -> List[Dict[str, Any]]:
    """Each protocol and count: median request time, hub and frontends CPU per request, worst loop stall."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=600, connection_timeout=600)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 1}")
    frontends = frontend_pids(server_pid)
    rows = []
    for count in strings:
        array = np.array([b"s%07d" % (index % 10_000_000) for index in range(count)], np.object_)
        for protocol in ("http", "grpc"):
            if protocol == "http":
                tensor: Any = httpclient.InferInput("in", [count], "BYTES")
                tensor.set_data_from_numpy(array, binary_data=True)
                outputs: Any = [httpclient.InferRequestedOutput("out", binary_data=True)]
                client: Any = http
            else:
                tensor = grpcclient.InferInput("in", [count], "BYTES")
                tensor.set_data_from_numpy(array)
                outputs = [grpcclient.InferRequestedOutput("out")]
                client = grpc
            client.infer("bytes", [tensor], outputs=outputs)  # warm
            times, hub, front, stalls = [], [], [], []
            for _ in range(_repeats(count)):
                hub_before = cpu_seconds(server_pid)
                front_before = sum(cpu_seconds(pid) for pid in frontends)
                begin = time.monotonic()
                result = client.infer("bytes", [tensor], outputs=outputs)
                end = time.monotonic()
                time.sleep(0.15)  # the hub's last work (the probe's log, freeing) lands in this request's count
                hub.append(cpu_seconds(server_pid) - hub_before)
                front.append(sum(cpu_seconds(pid) for pid in frontends) - front_before)
                times.append(end - begin)
                stalls.append(loop_worst_ms(os.environ[LAG_FILE_ENV], begin, end))
                answer = result.as_numpy("out")
                assert answer.shape == (count,) and answer[-1] == array[-1], "wrong answer"
            # CPU from /proc ticks (10 ms): a per-request figure is the mean over the repeats
            row = {
                "protocol": protocol,
                "strings": count,
                "request_ms": round(statistics.median(times) * 1000, 2),
                "hub_cpu_ms": round(statistics.mean(hub) * 1000, 2),
                "frontends_cpu_ms": round(statistics.mean(front) * 1000, 2),
                "hub_loop_worst_ms": max(stalls),
                "repeats": len(times),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strings", default="1000,100000,1000000")
    parser.add_argument("--frontends", type=int, default=3)
    parser.add_argument("--port", type=int, default=18970)
    args = parser.parse_args()
    os.environ[LAG_FILE_ENV] = tempfile.mktemp(prefix="bytes_hop_lag_")
    env = dict(os.environ, PYTRITON_FRONTENDS=str(args.frontends))
    command = [sys.executable, "-m", "bench.json_stall", "--serve", "--port", str(args.port)]
    with serving(command, args.port, env) as pid:
        measure(args.port, pid, [int(count) for count in args.strings.split(",") if count])


if __name__ == "__main__":
    main()
