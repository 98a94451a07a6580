"""The GPU bench's serving path without a GPU: what the server's loop spends on each request.

    python -m bench.gpu.standin --protocol http --in-flight 256            # this machine's Python
    python -m bench.gpu.standin --python /path/to/python3.12 --protocol grpc
    python -m bench.gpu.standin --pytriton /tmp/older-checkout               # the same with another commit

On a GPU the served ResNet-50 is held back by the server's loop thread at one core (docs/performance.md,
"On a GPU"). This stands in for it on any machine: ResNet-50's request and response (one UINT8 image
[3, 224, 224] in, 1000 FP32 logits out), two process instances of a model that sleeps as long as a GPU
batch takes, and the GPU bench's own load generator. It prints the loop process's cores and CPU per
request, the figure to bring down.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sleeper() -> Callable[..., Any]:
    """An instance process's model: sleeps like a GPU batch (4 ms + 0.12 ms a sample), answers zeros."""
    from pytriton.decorators import batch

    logits = np.zeros((64, 1000), np.float32)

    @batch
    def infer(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
        time.sleep(0.004 + 0.00012 * len(INPUT))
        return {"OUTPUT": logits[: len(INPUT)]}

    return infer


def serve(instances: int) -> None:
    """The server process: prints `READY {ports}`, serves until stdin closes."""
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1", http_port=0, grpc_port=0, metrics_port=0)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="resnet50",
            infer_func=ProcessInstances(factory=_sleeper, count=instances),
            inputs=[Tensor(name="INPUT", dtype=np.uint8, shape=(3, 224, 224))],
            outputs=[Tensor(name="OUTPUT", dtype=np.float32, shape=(1000,))],
            config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
        )
        triton.run()
        print("READY " + json.dumps({"http": triton.http_port, "grpc": triton.grpc_port}), flush=True)
        sys.stdin.read()


def _process_seconds(pid: int) -> float:
    """CPU seconds of all of `pid`'s threads."""
    from bench.gpu.usage import thread_seconds

    return sum(thread_seconds(pid).values())


def measure(args: argparse.Namespace) -> Dict[str, float]:
    """Start the server, load it, and read its loop process's CPU over the measured window."""
    from bench.gpu import load

    paths = [*([str(args.pytriton)] if args.pytriton else []), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    # Run as a script, not with -m: the working directory would come first on sys.path, before --pytriton.
    command = [args.python, __file__, "--serve", "--instances", str(args.instances)]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert server.stdout is not None and server.stdin is not None
    ports = next(json.loads(line[6:]) for line in server.stdout if line.startswith("READY "))
    sample = np.random.default_rng(0).integers(0, 256, (1, 3, 224, 224), dtype=np.uint8)
    start_at = time.time() + 2.0
    loop: List[float] = []

    def window() -> None:  # the loop process's CPU seconds at the window's start and end
        time.sleep(max(start_at + args.warmup - time.time(), 0.0))
        began, cpu = time.perf_counter(), _process_seconds(server.pid)
        time.sleep(args.duration)
        loop.append((_process_seconds(server.pid) - cpu) / (time.perf_counter() - began))

    reader = threading.Thread(target=window)
    reader.start()
    try:
        point = load.Load(
            args.protocol, ports[args.protocol], "resnet50", sample, args.in_flight, args.warmup, args.duration
        )
        result = load.run(point, start_at, args.load_processes)
        reader.join()
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    cores = loop[0]
    return {**result, "loop_cores": cores, "loop_us_per_request": 1e6 * cores / result["rps"] if result["rps"] else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--python", default=sys.executable, help="the server's interpreter")
    parser.add_argument("--pytriton", type=pathlib.Path, help="serve with the pytriton of this checkout (an A/B)")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--load-processes", type=int, default=1)
    args = parser.parse_args()
    if args.serve:
        serve(args.instances)
        return
    point = measure(args)
    print(
        f"{args.protocol} {args.in_flight} in flight: {point['rps']:,.0f} req/s, p50 {point['p50_ms']:.1f} ms; "
        f"loop process {point['loop_cores']:.2f} cores = {point['loop_us_per_request']:.0f} us/request; "
        f"load {point['load_cpu']:.2f} cores"
    )


if __name__ == "__main__":
    main()
