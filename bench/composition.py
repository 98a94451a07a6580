"""Composition bench: a two-model pipeline composed in-process against the same two models called by the client.

    .venv/bin/python -m bench.composition                    # 1 and 32 clients, 3 rounds x 5 s
    .venv/bin/python -m bench.composition --clients 1,8,32 --rounds 1 --duration 3

It starts `bench/composition_server.py` and loads it with KServe JSON requests (FP32 [1,16]) over keep-alive
HTTP/1.1 connections, one per client, from client processes of its own (uvloop when installed), in three modes:

* ``pre alone``: the preprocessing model by itself: one hop, no inner call (the reference for the inner call's cost);
* ``in-process``: ``pipeline``, which runs the same preprocessing and then calls ``identity`` in-process (a sync
  callable: its batch is one inner request);
* ``in-process async``: ``pipeline_async``, the same as an ``async def`` callable;
* ``two hops``: ``pre``, then ``identity`` with ``pre``'s output, each a request of the client.

A pipeline is one request in the first two modes, two in the last; req/s counts pipelines. p50 is a pipeline's.
"The inner call adds" is an in-process p50 minus pre alone's: what the in-process call to ``identity`` adds.
First, without a client, sync and async callables call a sync and an async identity 2,000 times in a row: the
microseconds of one inner call's whole round trip, each caller kind to each callee kind.
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
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import orjson

MODES = ("pre alone", "in-process", "in-process async", "two hops")
_PATHS = {
    "pre alone": "/v2/models/pre/infer",
    "in-process": "/v2/models/pipeline/infer",
    "in-process async": "/v2/models/pipeline_async/infer",
    "two hops": "/v2/models/pre/infer",
}
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
    first = _request(
        "/v2/models/pipeline/infer" if mode == "in-process" else "/v2/models/pre/infer", _body(_VALUES), port
    )
    try:
        while time.perf_counter() < until:
            started = time.perf_counter()
            answer = await _exchange(reader, writer, first)
            if mode == "two hops":
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


def _start_server(port: int) -> subprocess.Popen[bytes]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composition_server.py")
    server = subprocess.Popen(
        [sys.executable, script, "--http-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("the composition server did not become ready")


def _check(port: int) -> None:
    """Both ways give the same answer: (x * 2 + 1)."""
    expected = [value * 2 + 1 for value in _VALUES]
    for path in set(_PATHS.values()):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=_body(_VALUES))
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["outputs"][0]["data"] == expected, path


def inner_call_cost(port: int) -> Dict[str, float]:
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
            costs[f"{caller.split('_')[0]} -> {'async' if target.endswith('async') else 'sync'}"] = sorted(runs)[1]
    return costs


def main(argv: Optional[List[str]] = None) -> None:
    """Run every mode at every client count; print a table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,32", help="client counts, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--client-processes", type=int, default=2, help="client processes (at most one per client)")
    parser.add_argument("--json", help="write the results there")
    args = parser.parse_args(argv)
    counts = [int(count) for count in args.clients.split(",")]
    port = _free_port()
    server = _start_server(port)
    results: Dict[str, Dict[int, List[Tuple[float, float]]]] = {mode: {count: [] for count in counts} for mode in MODES}
    try:
        _check(port)
        costs = inner_call_cost(port)
        for _ in range(args.rounds):
            for count in counts:
                for mode in MODES:
                    results[mode][count].append(measure(port, mode, count, args.duration, args.client_processes))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    summary: Dict[str, Any] = {"inner_call_us": costs}
    print("an inner call's round trip, caller -> callee (sync or async callables), no client:")
    for pair, cost in costs.items():
        print(f"  {pair:<15} {cost:6.1f} us")
    print(f"{'clients':>7}  {'mode':<11}  {'req/s':>9}  {'p50 us':>8}")
    for count in counts:
        medians = {}
        for mode in MODES:
            runs = results[mode][count]
            rate = sorted(run[0] for run in runs)[len(runs) // 2]
            p50 = sorted(run[1] for run in runs)[len(runs) // 2]
            medians[mode] = (rate, p50)
            print(f"{count:>7}  {mode:<11}  {rate:>9.0f}  {p50:>8.0f}")
        summary[str(count)] = {mode: {"req_s": medians[mode][0], "p50_us": medians[mode][1]} for mode in MODES}
        for mode in ("in-process", "in-process async"):
            inner = medians[mode][1] - medians["pre alone"][1]
            ratio = medians[mode][0] / medians["two hops"][0]
            print(f"{count:>7}  {mode}: the inner call adds {inner:.0f} us of p50; req/s {ratio:.2f}x two hops")
            summary[str(count)][mode].update(inner_call_p50_us=inner, over_two_hops=ratio)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=2)


if __name__ == "__main__":
    main()
