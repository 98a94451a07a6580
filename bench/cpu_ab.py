"""`python -m bench cpu_ab REF [REF ...]`: the server's CPU per small request for several commits, side by side.

A finer measure than req/s for a change on the request path. Each commit's `pytriton` (`git archive`; `.` is this
checkout as it is) serves `bench/model_server.py`'s `identity` model, pinned to one core, and one keep-alive HTTP
client on another core sends FP32 [1, 16] binary requests one at a time. The server's CPU (every thread, from
/proc) over a fixed count of requests gives microseconds per request; the commits take turns, in alternating order,
round after round. Unpinned, this 2-core VM's figures fall in two modes about 20 us apart: keep the pinning.

    python -m bench cpu_ab 168758b .              # 6 rounds x 20,000 requests each
    python -m bench cpu_ab HEAD~3 HEAD~1 . --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = "1", 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU of every thread of the process."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        fields = open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _request() -> bytes:
    head = json.dumps(
        {
            "inputs": [
                {"name": "INPUT_1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
            ],
            "outputs": [{"name": "OUTPUT_1", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = head + bytes(64)
    return (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
        b"Content-Length: %d\r\n\r\n" % (len(head), len(body))
    ) + body


def _tree(ref: str, into: pathlib.Path) -> pathlib.Path:
    """A folder whose `pytriton` is the commit's (`.`: this checkout's)."""
    if ref == ".":
        return ROOT
    folder = into / ref.replace("/", "_")
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pytriton"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def _measure(tree: pathlib.Path, requests: int) -> float:
    """Server CPU in microseconds per request, over `requests` after a warm-up."""
    port = _free_port()
    command = ["taskset", "-c", SERVER_CPU, sys.executable, str(ROOT / "bench" / "model_server.py")]
    command += ["--http-port", str(port), "--grpc-port", str(_free_port()), "--metrics-port", str(_free_port())]
    server = subprocess.Popen(
        command, env=dict(os.environ, PYTHONPATH=str(tree)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        message = _request()
        deadline = time.monotonic() + 60
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port))
                _send(sock, b"GET /v2/models/identity/ready HTTP/1.1\r\nHost: x\r\n\r\n", check=True)
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the server of {tree} did not start") from None
                time.sleep(0.05)
        for _ in range(2000):
            _send(sock, message)
        before = _cpu_s(server.pid)
        for _ in range(requests):
            _send(sock, message)
        return (_cpu_s(server.pid) - before) / requests * 1e6
    finally:
        server.terminate()
        server.wait(10)


def _send(sock: socket.socket, message: bytes, check: bool = True) -> None:
    """Send one request and read its whole answer (a non-200 raises when `check`)."""
    sock.sendall(message)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        got += chunk
    head, rest = got.split(b"\r\n\r\n", 1)
    if check and not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
    )
    while len(rest) < length:
        rest += sock.recv(65536)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_ab", description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="git commits ('.' is this checkout as it is)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=20_000, help="per commit per round")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CPU})
    with tempfile.TemporaryDirectory(prefix="bench-cpu-ab-") as scratch:
        trees = {ref: _tree(ref, pathlib.Path(scratch)) for ref in args.refs}
        figures: Dict[str, List[float]] = {ref: [] for ref in args.refs}
        for round_ in range(args.rounds):
            for ref in args.refs if round_ % 2 == 0 else reversed(args.refs):
                figures[ref].append(_measure(trees[ref], args.requests))
            print(f"round {round_ + 1}: " + ", ".join(f"{ref} {figures[ref][-1]:.1f} us" for ref in args.refs))
    print(f"server CPU per request, median of {args.rounds} rounds (min):")
    for ref, values in figures.items():
        print(f"  {ref:12s} {statistics.median(values):6.1f} us ({min(values):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
