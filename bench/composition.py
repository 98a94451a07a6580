"""Composition bench: a two-model pipeline composed in-process against the same two models called by the client.

    .venv/bin/python -m bench.composition                    # 1 and 32 clients, 3 rounds x 5 s, ours and Triton's
    .venv/bin/python -m bench.composition --clients 1,8,32 --rounds 1 --duration 3 --targets ours

It starts `bench/composition_server.py` and loads it with KServe JSON requests (FP32 [1,16]) over keep-alive
HTTP/1.1 connections, one per client, from client processes of its own (uvloop when installed), in four modes:

* ``pre alone``: the preprocessing model by itself: one hop, no inner call (the reference for the inner call's cost);
* ``in-process``: ``pipeline``, which runs the same preprocessing and then calls ``identity`` in-process (a sync
  callable: its batch is one inner request);
* ``in-process async``: ``pipeline_async``, the same as an ``async def`` callable;
* ``two hops``: ``pre``, then ``identity`` with ``pre``'s output, each a request of the client.

The ``triton`` target (on unless ``--targets`` leaves it out) runs the same models as hand-written Python-backend
models in nvidia-pytriton's bundled tritonserver (`bench/composition_triton.py`, under NVIDIA's interpreter:
``BENCH_NVIDIA_RUN``, /tmp/nvidia-pytriton/run by default), the pipeline composed with Triton's BLS, with the same
client and the same request bodies, in the same rounds: ``triton pre alone``, ``triton BLS``
(``InferenceRequest.exec()``), ``triton BLS async`` (``await async_exec()`` in an ``async def execute``) and
``triton two hops``. Without NVIDIA's PyTriton the bench says so and measures ours only.

A pipeline is one request in the composed modes, two in the two-hop ones; req/s counts pipelines. p50 is a
pipeline's. "The inner call adds" is a composed p50 minus the same server's pre alone p50. First, without a
client, sync and async callables (and Triton's sync and async ``execute``) call a sync and an async identity 2,000
times in a row: the microseconds of one inner call's whole round trip, each caller kind to each callee kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import orjson

from bench.servers import NVIDIA_RUN

MODES = ("pre alone", "in-process", "in-process async", "two hops")
TRITON_MODES = ("triton pre alone", "triton BLS", "triton BLS async", "triton two hops")
# Each mode's first request; a two-hop mode then sends the first one's output to `identity`.
_PATHS = {
    "pre alone": "/v2/models/pre/infer",
    "in-process": "/v2/models/pipeline/infer",
    "in-process async": "/v2/models/pipeline_async/infer",
    "two hops": "/v2/models/pre/infer",
    "triton pre alone": "/v2/models/pre/infer",
    "triton BLS": "/v2/models/pipeline/infer",
    "triton BLS async": "/v2/models/pipeline_async/infer",
    "triton two hops": "/v2/models/pre/infer",
}
TRITON_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composition_triton.py")
_VALUES = [float(value) for value in range(16)]


def _body(model_input: List[float]) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": model_input}]})


def _request(path: str, body: bytes, port: int) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bytes:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
    return body


async def _client(port: int, mode: str, until: float, latencies: List[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    first = _request(_PATHS[mode], _body(_VALUES), port)
    try:
        while time.perf_counter() < until:
            started = time.perf_counter()
            answer = await _exchange(reader, writer, first)
            if mode.endswith("two hops"):
                data = orjson.loads(answer)["outputs"][0]["data"]
                await _exchange(reader, writer, _request("/v2/models/identity/infer", _body(data), port))
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


def _load(port: int, mode: str, clients: int, duration: float, start_at: float) -> List[float]:
    """One client process: `clients` connections for `duration` seconds from `start_at` (time.time())."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def run() -> List[float]:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        latencies: List[float] = []
        until = time.perf_counter() + duration
        await asyncio.gather(*(_client(port, mode, until, latencies) for _ in range(clients)))
        return latencies

    return asyncio.run(run())


def measure(port: int, mode: str, clients: int, duration: float, processes: int) -> Tuple[float, float]:
    """(pipelines per second, p50 in microseconds) of one run."""
    processes = max(1, min(processes, clients))
    shares = [clients // processes + (1 if index < clients % processes else 0) for index in range(processes)]
    start_at = time.time() + 0.5
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.starmap(_load, [(port, mode, share, duration, start_at) for share in shares])
    latencies = sorted(latency for result in results for latency in result)
    if not latencies:
        raise RuntimeError(f"{mode}: no request completed")
    return len(latencies) / duration, latencies[(len(latencies) - 1) // 2] * 1e6


def _free_port() -> int:
    while True:
        port = random.randint(30000, 45000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def _wait_ready(server: subprocess.Popen[bytes], port: int, models: Tuple[str, ...], timeout: float) -> None:
    """Wait until every model in `models` is ready on `port` (the server killed and an error raised otherwise)."""
    deadline = time.monotonic() + timeout
    pending = list(models)
    while pending and time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{pending[0]}/ready", timeout=1) as answer:
                if answer.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.1)
    if pending:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        raise RuntimeError(f"{pending[0]} did not become ready on port {port} (server exit status {server.poll()})")


def _start_server(port: int) -> subprocess.Popen[bytes]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composition_server.py")
    server = subprocess.Popen(
        [sys.executable, script, "--http-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_ready(server, port, ("async_loop",), 60)
    return server


def _start_triton(port: int) -> subprocess.Popen[bytes]:
    """nvidia-pytriton's tritonserver with the Python-backend pipeline (bench/composition_triton.py)."""
    ports = ["--http-port", str(port), "--grpc-port", str(_free_port()), "--metrics-port", str(_free_port())]
    server = subprocess.Popen(
        [str(NVIDIA_RUN), "python", TRITON_SERVER, *ports],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # Neither the repo root nor PYTHONPATH: NVIDIA's interpreter must not import our package.
        cwd=tempfile.gettempdir(),
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
    )
    _wait_ready(server, port, ("identity", "identity_async", "pre", "pipeline", "pipeline_async", "async_loop"), 180)
    return server


def _stop(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def _check(port: int, modes: Tuple[str, ...]) -> None:
    """Every way gives the same answer: (x * 2 + 1)."""
    expected = [value * 2 + 1 for value in _VALUES]
    for path in {_PATHS[mode] for mode in modes}:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=_body(_VALUES))
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["outputs"][0]["data"] == expected, path


def inner_call_cost(port: int, prefix: str = "") -> Dict[str, float]:
    """Microseconds per inner call, each caller kind to each callee kind, without a client (the median of 3)."""
    costs: Dict[str, float] = {}
    for caller in ("sync_loop", "async_loop"):
        for target in ("identity", "identity_async"):
            document = orjson.loads(_body(_VALUES[:1]))
            document["inputs"][0]["shape"] = [1, 1]
            document["parameters"] = {"target": target}
            runs = []
            for _ in range(3):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v2/models/{caller}/infer", data=orjson.dumps(document)
                )
                with urllib.request.urlopen(request, timeout=120) as answer:
                    runs.append(float(json.loads(answer.read())["outputs"][0]["data"][0]))
            pair = f"{caller.split('_')[0]} -> {'async' if target.endswith('async') else 'sync'}"
            costs[prefix + pair] = sorted(runs)[1]
    return costs


def _median(runs: List[Tuple[float, float]]) -> Tuple[float, float]:
    """The median req/s and the median p50 of a mode's rounds."""
    return sorted(run[0] for run in runs)[len(runs) // 2], sorted(run[1] for run in runs)[len(runs) // 2]


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def _report(counts: List[int], modes: List[str], results: Dict[str, Dict[int, List[Tuple[float, float]]]]) -> Any:
    """Print the table and the ratios; the summary for --json."""
    summary: Dict[str, Any] = {}
    print(f"{'clients':>7}  {'mode':<18}  {'req/s':>9}  {'p50 us':>8}")
    for count in counts:
        medians = {mode: _median(results[mode][count]) for mode in modes}
        for mode in modes:
            print(f"{count:>7}  {mode:<18}  {medians[mode][0]:>9.0f}  {medians[mode][1]:>8.0f}")
        summary[str(count)] = {mode: {"req_s": medians[mode][0], "p50_us": medians[mode][1]} for mode in modes}
        # (composed mode, its one-hop reference, its two-hop comparison)
        pairs = [("in-process", "pre alone", "two hops"), ("in-process async", "pre alone", "two hops")]
        if "triton BLS" in modes:
            pairs += [
                ("triton BLS", "triton pre alone", "triton two hops"),
                ("triton BLS async", "triton pre alone", "triton two hops"),
            ]
        for mode, alone, hops in pairs:
            inner = medians[mode][1] - medians[alone][1]
            ratio = medians[mode][0] / medians[hops][0]
            print(f"{count:>7}  {mode}: the inner call adds {inner:.0f} us of p50; req/s {ratio:.2f}x {hops}")
            summary[str(count)][mode].update(inner_call_p50_us=inner, over_two_hops=ratio)
        if "triton BLS" in modes:
            for ours, theirs in (("in-process", "triton BLS"), ("in-process async", "triton BLS async")):
                rate = medians[ours][0] / medians[theirs][0]
                p50 = medians[ours][1] / medians[theirs][1]
                print(f"{count:>7}  {ours} / {theirs}: req/s {rate:.2f}x, p50 {p50:.2f}x")
                summary[str(count)][ours][f"over_{theirs.replace(' ', '_')}"] = {"req_s": rate, "p50": p50}
    return summary


def main(argv: Optional[List[str]] = None) -> None:
    """Run every mode at every client count; print a table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,32", help="client counts, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--client-processes", type=int, default=2, help="client processes (at most one per client)")
    parser.add_argument("--targets", default="ours,triton", help="ours, triton (Triton's BLS), comma separated")
    parser.add_argument("--json", help="write the results there")
    args = parser.parse_args(argv)
    counts = [int(count) for count in args.clients.split(",")]
    targets = args.targets.split(",")
    if "triton" in targets and not os.access(NVIDIA_RUN, os.X_OK):
        print(f"triton: skipped: NVIDIA's PyTriton not found at {NVIDIA_RUN} (BENCH_NVIDIA_RUN); ours only")
        targets.remove("triton")
    servers: Dict[str, Tuple[subprocess.Popen[bytes], int]] = {}
    modes: List[str] = []
    costs: Dict[str, float] = {}
    started_load = _load_average()
    try:
        if "ours" in targets:
            port = _free_port()
            servers["ours"] = (_start_server(port), port)
            modes += MODES
        if "triton" in targets:
            port = _free_port()
            servers["triton"] = (_start_triton(port), port)
            modes += TRITON_MODES
        for name, (_, port) in servers.items():
            _check(port, MODES if name == "ours" else TRITON_MODES)
            costs.update(inner_call_cost(port, "" if name == "ours" else "triton "))
        results: Dict[str, Dict[int, List[Tuple[float, float]]]] = {
            mode: {count: [] for count in counts} for mode in modes
        }
        for _ in range(args.rounds):
            for count in counts:
                for mode in modes:
                    port = servers["triton" if mode.startswith("triton") else "ours"][1]
                    results[mode][count].append(measure(port, mode, count, args.duration, args.client_processes))
    finally:
        for server, _ in servers.values():
            _stop(server)
    print(f"load average (1, 5, 15 min): {started_load} at the start, {_load_average()} at the end")
    print("an inner call's round trip, caller -> callee (sync or async callables), no client:")
    for pair, cost in costs.items():
        print(f"  {pair:<22} {cost:6.1f} us")
    summary = _report(counts, modes, results)
    summary["inner_call_us"] = costs
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=2)


if __name__ == "__main__":
    main()
