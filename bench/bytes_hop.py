"""What a long BYTES tensor costs the hub when it crosses from a frontend process and back: CPU and loop stall.

`python -m bench.bytes_hop [--strings 1000,100000,1000000] [--frontends 3]`: a server (bench/json_stall.serve: an
identity model `bytes`, one input of shape [-1], no batching) with frontend processes; requests of so many 8-byte
strings over HTTP (binary tensors, tritonclient) and gRPC (raw contents). Per request: its time, the hub's CPU
(the server's own process, read from /proc: every thread of it) and frontends' CPU, and the hub loop's worst gap
between two turns while it ran (json_stall._probe_loop). With 3 frontends the hub serves no connection itself
(options/frontends.py), so every request makes the hop; with 2 its first connections are its own.

`--small`: a client of each frontend sends small requests (model `fp32`, HTTP JSON) all along, and each row adds the
worst time one of them took while the long requests ran, on each frontend (`small_worst_ms`, highest first): the
frontend serving the long request answers none while its loop is held (the CPU columns then count theirs too).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from bench.json_stall import LAG_FILE_ENV, loop_worst_ms, serving
from tests.frontend_processes import frontend_pids, one_connection_each

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (every thread), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _repeats(count: int) -> int:
    return 40 if count <= 1000 else 10 if count <= 100_000 else 4


_SMALL = json.dumps({"inputs": [{"name": "in", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
# Each small request's (start, seconds), by frontend.
Samples = Dict[int, List[Tuple[float, float]]]


@contextlib.contextmanager
def small_requests(port: int, frontends: List[int]) -> Iterator[Samples]:
    """Small requests to each frontend, one after another on a connection of its own, until the block ends."""
    connections = one_connection_each(port, frontends, timeout_s=600)
    samples: Samples = {pid: [] for pid in connections}
    stop = threading.Event()

    def send(pid: int, connection: http.client.HTTPConnection) -> None:
        while not stop.is_set():
            begin = time.monotonic()
            connection.request("POST", "/v2/models/fp32/infer", _SMALL, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200, "a small request failed"
            samples[pid].append((begin, time.monotonic() - begin))
            stop.wait(0.002)

    threads = [threading.Thread(target=send, args=item, daemon=True) for item in connections.items()]
    for thread in threads:
        thread.start()
    try:
        yield samples
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for connection in connections.values():
            connection.close()


def _small_worst(samples: Optional[Samples], windows: List[Tuple[float, float]]) -> Optional[List[float]]:
    """The worst time of a small request begun while a long one ran, on each frontend, highest first."""
    if samples is None:
        return None
    worst = [
        max((spent for at, spent in taken if any(begin <= at <= end for begin, end in windows)), default=0.0)
        for taken in samples.values()
    ]
    return sorted((round(spent * 1000, 1) for spent in worst), reverse=True)


def measure(port: int, server_pid: int, strings: List[int], small: bool = False) -> List[Dict[str, Any]]:
    """Each protocol and count: median request time, hub and frontends CPU per request, worst loop stall.

    `small`: and the worst time of other clients' small requests to each frontend meanwhile (`small_requests`).
    """
    frontends = frontend_pids(server_pid)
    with small_requests(port, frontends) if small else contextlib.nullcontext() as samples:
        return _measure(port, server_pid, frontends, strings, samples)


def _measure(
    port: int, server_pid: int, frontends: List[int], strings: List[int], samples: Optional[Samples]
) -> List[Dict[str, Any]]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=600, connection_timeout=600)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 1}")
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
            windows: List[Tuple[float, float]] = []
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
                windows.append((begin, end))
                stalls.append(loop_worst_ms(os.environ[LAG_FILE_ENV], begin, end))
                answer = result.as_numpy("out")
                assert answer.shape == (count,) and answer[-1] == array[-1], "wrong answer"
            # CPU from /proc ticks (10 ms): a per-request figure is the mean over the repeats
            row: Dict[str, Any] = {
                "protocol": protocol,
                "strings": count,
                "request_ms": round(statistics.median(times) * 1000, 2),
                "hub_cpu_ms": round(statistics.mean(hub) * 1000, 2),
                "frontends_cpu_ms": round(statistics.mean(front) * 1000, 2),
                "hub_loop_worst_ms": max(stalls),
                "repeats": len(times),
            }
            if samples is not None:
                row["small_worst_ms"] = _small_worst(samples, windows)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strings", default="1000,100000,1000000")
    parser.add_argument("--frontends", type=int, default=3)
    parser.add_argument("--port", type=int, default=18970)
    parser.add_argument("--small", action="store_true", help="other clients' small requests meanwhile (see above)")
    args = parser.parse_args()
    os.environ[LAG_FILE_ENV] = tempfile.mktemp(prefix="bytes_hop_lag_")
    env = dict(os.environ, PYTRITON_FRONTENDS=str(args.frontends))
    command = [sys.executable, "-m", "bench.json_stall", "--serve", "--port", str(args.port)]
    with serving(command, args.port, env) as pid:
        measure(args.port, pid, [int(count) for count in args.strings.split(",") if count], args.small)


if __name__ == "__main__":
    main()
