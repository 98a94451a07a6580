"""GPU bench: torch models served with dynamic batching over HTTP and gRPC, against the same model called directly.

    python -m bench gpu                                   # ResNet-50 and the encoder on cuda (see bench/README.md)
    python -m bench gpu --device cpu --size tiny --in-flight 1,4 --duration 1 --warmup 0.5   # smoke test on a CPU

For each model: the direct-call limit (the batch callable in a loop at each batch size, numpy in and out), then
the server at rising numbers of requests in flight (one sample each), with req/s, its share of the limit, p50/p99,
the average batch the server formed and the GPU's utilisation. Writes a JSON summary and a plot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import secrets
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from bench.gpu import load, report
from bench.gpu.models import build
from bench.gpu.sampler import GpuSampler
from bench.gpu.usage import Usage, summary_line
from bench.payloads import model_stats

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "results"
TOKEN = secrets.token_urlsafe(16)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="resnet50,encoder")
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--half", action="store_true", help="FP16 weights and activations (both sides)")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--in-flight", default="1,2,4,8,16,32,64,128,256", help="requests in flight per point")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument(
        "--frontends", default="1", help="frontend process counts, each served in turn (PYTRITON_FRONTENDS; 1: none)"
    )
    parser.add_argument(
        "--process-instances", action="store_true", help="instances in processes of their own (each its own GIL)"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measured window")
    parser.add_argument("--load-processes", type=int, default=0, help="load generator processes (0: from the CPUs)")
    parser.add_argument("--direct-batches", default="", help="batch sizes of the direct calls (default: 1, 2 ... max)")
    parser.add_argument(
        "--py-spy",
        type=pathlib.Path,
        help="record the server's GIL holders with py-spy in each window, into this folder",
    )
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def _model_args(args: argparse.Namespace, model: str) -> List[str]:
    return ["--model", model, "--size", args.size, "--device", args.device, *(["--half"] if args.half else [])]


def direct_calls(args: argparse.Namespace, model: str) -> List[Dict[str, Any]]:
    """The direct-call rows, from a process of their own (the GPU is the server's alone afterwards)."""
    powers = (2**power for power in range(args.max_batch.bit_length()) if 2**power <= args.max_batch)
    batches = args.direct_batches or ",".join(str(size) for size in powers)
    command = [sys.executable, "-m", "bench.gpu.direct", *_model_args(args, model), "--batches", batches]
    command += ["--duration", str(args.duration)]
    print(f"direct calls of {model} at batch sizes {batches}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


class Server:
    """The model server process: started with the bench's access token, stopped by closing its stdin."""

    def __init__(self, args: argparse.Namespace, model: str, frontends: int = 1) -> None:
        command = [sys.executable, "-m", "bench.gpu.serve", *_model_args(args, model)]
        command += ["--max-batch", str(args.max_batch), "--queue-delay-us", str(args.queue_delay_us)]
        command += ["--instances", str(args.instances), *(["--process-instances"] if args.process_instances else [])]
        env = dict(os.environ, BENCH_ACCESS_TOKEN=TOKEN, PYTRITON_FRONTENDS=str(frontends))
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("READY "):
                self.ports: Dict[str, int] = json.loads(line[len("READY ") :])
                return
        raise SystemExit(f"the {model} server exited with {self.process.wait()} before it was ready")

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def round_trip_ms(port: int, count: int = 300) -> float:
    """p50 of GET /v2/health/ready on one keep-alive connection: the round trip without a model."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("GET", "/v2/health/ready")
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    connection.close()
    return float(np.percentile(times, 50) * 1000)


def served(args: argparse.Namespace, model: str, server: Server) -> Dict[str, List[Dict[str, Any]]]:
    """Every (protocol, requests in flight) point against the running server."""
    sample = build(model, args.size).sample(1)
    base_url = f"http://127.0.0.1:{server.ports['http']}"
    sampler = GpuSampler()
    usage = Usage(server.process.pid, base_url, model, TOKEN)
    points: Dict[str, List[Dict[str, Any]]] = {}
    for protocol in args.protocols.split(","):
        for in_flight in (int(value) for value in args.in_flight.split(",")):
            before = model_stats(base_url, model, TOKEN)
            start_at = time.time() + 2.0
            window = (start_at + args.warmup, start_at + args.warmup + args.duration)
            sampler.start(*window)
            usage.window(*window)
            profiler = None
            if args.py_spy:
                profile = args.py_spy / f"{model}-{protocol}-{in_flight}.txt"
                profiler = threading.Thread(target=_py_spy, args=(server.process.pid, window, profile), daemon=True)
                profiler.start()
            point: Dict[str, Any] = load.run(
                load.Load(protocol, server.ports[protocol], model, sample, in_flight, args.warmup, args.duration),
                start_at,
                args.load_processes,
            )
            point["gpu_utilization"] = sampler.stop()
            point["usage"] = usage.delta()
            if profiler is not None:
                profiler.join()
            after = model_stats(base_url, model, TOKEN)
            if before and after and after[1] > before[1]:
                point["avg_batch"] = (after[0] - before[0]) / (after[1] - before[1])
            print(f"  {protocol} {in_flight:>4} in flight: {point['rps']:,.1f} req/s, p50 {point['p50_ms']:.2f} ms")
            print(summary_line(point["usage"]) + f"; load {point['load_cpu']:.2f} cores", flush=True)
            points.setdefault(protocol, []).append(point)
    return points


def _py_spy(pid: int, window: Tuple[float, float], path: pathlib.Path) -> None:
    """py-spy's collapsed stacks of the threads holding the GIL in `pid` over the wall-clock `window`."""
    time.sleep(max(window[0] - time.time(), 0.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    seconds = str(max(1, int(window[1] - window[0])))
    beside = pathlib.Path(sys.executable).with_name("py-spy")  # a venv's, when the venv is not activated
    executable = str(beside) if beside.exists() else "py-spy"
    command = [executable, "record", "--pid", str(pid), "--gil", "--rate", "250", "--duration", seconds]
    subprocess.run([*command, "--format", "raw", "--nonblocking", "-o", str(path)], capture_output=True, check=False)


def gpu_name(device: str) -> str:
    """The device's name as torch reports it."""
    if not device.startswith("cuda"):
        return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)"
    import torch

    return str(torch.cuda.get_device_name(torch.device(device)))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    device = gpu_name(args.device)
    summaries = []
    for model in args.models.split(","):
        direct = direct_calls(args, model)
        for frontends in (int(count) for count in args.frontends.split(",")):
            label = model if frontends == 1 else f"{model}, {frontends} frontends"
            print(f"{label}:", flush=True)
            server = Server(args, model, frontends)
            try:
                rtt = round_trip_ms(server.ports["http"])
                summaries.append(report.summarize(model, direct, served(args, model, server), rtt))
                summaries[-1]["label"] = label
                summaries[-1]["frontends"] = frontends
            finally:
                server.stop()
            print(report.table(summaries[-1]), flush=True)
    meta = {"started": stamp, "device": device, "command": " ".join(["python -m bench gpu", *(argv or sys.argv[2:])])}
    meta.update({key: str(value) for key, value in vars(args).items()})
    summary_path = args.results_dir / f"gpu-{stamp}.json"
    summary_path.write_text(json.dumps({"meta": meta, "models": summaries}, indent=2))
    plot_path = args.results_dir / f"gpu-{stamp}.png"
    problem = report.plot(summaries, device, plot_path)
    print(f"device: {device}\nsummary: {summary_path}")
    print(f"no plot: {problem}" if problem else f"plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
