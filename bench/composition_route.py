"""Inner calls from a RemoteTriton's custom route handler: microseconds and CPU per call, by input size.

    .venv/bin/python -m bench.composition_route                      # 64 B, 64 KiB, 256 KiB, 1 MiB; 3 rounds
    .venv/bin/python -m bench.composition_route --sizes 1048576 --rounds 5

The server runs in the bench's process with a thread-instance identity model (FP32 [1, n], max_batch_size 64); a
RemoteTriton in a process of its own adds the route /bench/calls, whose sync handler calls the identity `calls`
times in a row with the same input and answers the wall time and its own process's CPU time per call; the bench
adds the server process's CPU time per call. Medians over the rounds: what one inner call's round trip from a
route handler costs, the hop from the RemoteTriton's process to the server and back included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

_INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
_OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


@batch
def identity(x: np.ndarray) -> Dict[str, np.ndarray]:
    """The inner model."""
    return {"y": x}


def calls(request: Any) -> Dict[str, float]:
    """In the RemoteTriton's process: `calls` inner calls of `nbytes` each; µs per call, CPU µs per call here."""
    from pytriton.compose import call_model

    asked = request.json()
    values = np.arange(max(int(asked["nbytes"]) // 4, 1), dtype=np.float32).reshape(1, -1)
    count = int(asked["calls"])
    call_model("identity", {"x": values})  # warm: arenas made
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        call_model("identity", {"x": values})
    return {
        "us": (time.perf_counter() - began) / count * 1e6,
        "cpu_us": (time.process_time() - cpu) / count * 1e6,
    }


def remote(url: str) -> None:
    """The RemoteTriton's process: adds the route, says READY, serves until its standard input ends."""
    from pytriton.remote_triton import RemoteTriton

    with RemoteTriton(url=url) as triton:
        triton.add_route("/bench/calls", calls)
        print("READY", flush=True)
        sys.stdin.read()


def measure(port: int, nbytes: int, count: int) -> Dict[str, float]:
    """One round: µs per call, and CPU µs per call in the RemoteTriton's process and in the server."""
    body = json.dumps({"nbytes": nbytes, "calls": count}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/bench/calls", body, method="POST")
    server_cpu = time.process_time()
    with urllib.request.urlopen(request, timeout=600) as answer:
        measured = json.loads(answer.read())
    server_cpu_us = (time.process_time() - server_cpu) / count * 1e6
    return {"us": measured["us"], "remote_cpu_us": measured["cpu_us"], "server_cpu_us": server_cpu_us}


def main(argv: Optional[List[str]] = None) -> None:
    """Run the bench and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,65536,262144,1048576", help="input bytes, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000, help="calls per round of a small input (1 MiB: a fifth)")
    parser.add_argument("--remote", help=argparse.SUPPRESS)  # the RemoteTriton's process
    args = parser.parse_args(argv)
    if args.remote:
        remote(args.remote)
        return
    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0)
    with Triton(config=config) as triton:
        triton.bind("identity", identity, _INPUTS, _OUTPUTS, config=ModelConfig(max_batch_size=64))
        triton.run()
        assert triton.http_port is not None
        command = [sys.executable, "-m", "bench.composition_route", "--remote", f"127.0.0.1:{triton.http_port}"]
        with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
            assert process.stdin is not None and process.stdout is not None
            if process.stdout.readline().strip() != "READY":
                raise SystemExit("the RemoteTriton did not add its route")
            try:
                print("| input | µs per inner call | RemoteTriton process CPU µs | server CPU µs |")
                print("|---|---|---|---|")
                for nbytes in (int(size) for size in args.sizes.split(",")):
                    count = args.calls if nbytes < (512 << 10) else max(args.calls // 5, 1)
                    rounds = [measure(triton.http_port, nbytes, count) for _ in range(args.rounds)]
                    row = {key: statistics.median(each[key] for each in rounds) for key in rounds[0]}
                    print(
                        f"| {nbytes:,} B | {row['us']:.1f} | {row['remote_cpu_us']:.1f} | {row['server_cpu_us']:.1f} |"
                    )
            finally:
                process.stdin.close()
                process.wait(60)


if __name__ == "__main__":
    main()
