"""The GPU's limit for a model: the same batch callable the server runs, called directly in a loop.

    python -m bench.gpu.direct --model resnet50 --size full --device cuda --batches 1,8,64 --duration 5

Each call takes a numpy batch and gives a numpy output (one copy to the device, the model, one copy back), as the
served model does; prints one JSON line per batch size: calls, samples/s, p50/p99 per call, mean GPU utilisation.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List

import numpy as np

from bench.gpu.models import batch_callable, build
from bench.gpu.sampler import GpuSampler
from pytriton.core.tensors.host_arrays import host_array


def measure(run: Any, batch: np.ndarray, duration_s: float, sampler: GpuSampler) -> Dict[str, Any]:
    """Call `run` on `batch` for `duration_s` (after a few warm-up calls)."""
    for _ in range(3):
        host_array(run(batch))
    times: List[float] = []
    sampler.start()
    deadline = time.perf_counter() + duration_s
    while True:
        started = time.perf_counter()
        if started >= deadline:
            break
        host_array(run(batch))
        times.append(time.perf_counter() - started)
    utilization = sampler.stop()
    elapsed = np.asarray(times) * 1000
    return {
        "batch": len(batch),
        "calls": len(times),
        "samples_per_s": len(times) * len(batch) / duration_s,
        "p50_ms": float(np.percentile(elapsed, 50)),
        "p99_ms": float(np.percentile(elapsed, 99)),
        "gpu_utilization": utilization,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--half", action="store_true")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    spec = build(args.model, args.size)
    run = batch_callable(spec, args.device, args.half)
    sampler = GpuSampler()
    for size in (int(value) for value in args.batches.split(",")):
        print(json.dumps(measure(run, spec.sample(size), args.duration, sampler)), flush=True)


if __name__ == "__main__":
    main()
