"""Inner calls from a process instance: microseconds and CPU per call, by input size.

    .venv/bin/python -m bench.composition_process                      # 64 B, 64 KiB, 256 KiB, 1 MiB; 3 rounds
    .venv/bin/python -m bench.composition_process --sizes 64,1048576 --rounds 5

A `ProcessInstances` callable (a sync one, in its own process) calls a thread-instance identity model of the server
(FP32 [1, n], max_batch_size 64) `calls` times in a row with the same input and answers the wall time and its own
CPU time per call; the bench adds the server process's CPU time per call (its whole process: the engine's loop and
the identity's instance thread; the client's one request is noise). Medians over the rounds. Without a client in
the way: what one inner call's round trip costs, the hop from the instance process to the server and back included.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List, Optional

import numpy as np

from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

_INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
_OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


@batch
def identity(x: np.ndarray) -> Dict[str, np.ndarray]:
    """The inner model."""
    return {"y": x}


def caller(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """In the instance process: `calls` inner calls of `nbytes` each; answers [µs per call, CPU µs per call here]."""
    from pytriton.compose import call_model

    parameters = requests[0].parameters or {}
    values = np.arange(max(int(parameters["nbytes"]) // 4, 1), dtype=np.float32).reshape(1, -1)
    calls = int(parameters["calls"])
    call_model("identity", {"x": values})  # warm: arenas made
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call_model("identity", {"x": values})
    wall_us = (time.perf_counter() - began) / calls * 1e6
    cpu_us = (time.process_time() - cpu) / calls * 1e6
    return [{"y": np.array([[wall_us, cpu_us]], np.float32)}]


def measure(url: str, nbytes: int, calls: int) -> Dict[str, float]:
    """One round: µs per call, and CPU µs per call in the instance process and in the server."""
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(url, network_timeout=600) as client:
        given = httpclient.InferInput("x", [1, 1], "FP32")
        given.set_data_from_numpy(np.zeros((1, 1), np.float32))
        server_cpu = time.process_time()
        result = client.infer("caller", [given], parameters={"nbytes": nbytes, "calls": calls})
        server_cpu_us = (time.process_time() - server_cpu) / calls * 1e6
    wall_us, child_cpu_us = (float(value) for value in result.as_numpy("y")[0])
    return {"us": wall_us, "child_cpu_us": child_cpu_us, "server_cpu_us": server_cpu_us}


def main(argv: Optional[List[str]] = None) -> None:
    """Run the bench and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,65536,262144,1048576", help="input bytes, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000, help="calls per round of a small input (1 MiB: a fifth)")
    args = parser.parse_args(argv)
    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0)
    with Triton(config=config) as triton:
        triton.bind("identity", identity, _INPUTS, _OUTPUTS, config=ModelConfig(max_batch_size=64))
        triton.bind("caller", ProcessInstances(caller), _INPUTS, _OUTPUTS, config=ModelConfig(max_batch_size=8))
        triton.run()
        url = f"127.0.0.1:{triton.http_port}"
        print("| input | µs per inner call | instance process CPU µs | server CPU µs |")
        print("|---|---|---|---|")
        for nbytes in (int(size) for size in args.sizes.split(",")):
            calls = args.calls if nbytes < (512 << 10) else max(args.calls // 5, 1)
            rounds = [measure(url, nbytes, calls) for _ in range(args.rounds)]
            row = {key: statistics.median(each[key] for each in rounds) for key in rounds[0]}
            print(f"| {nbytes:,} B | {row['us']:.1f} | {row['child_cpu_us']:.1f} | {row['server_cpu_us']:.1f} |")


if __name__ == "__main__":
    main()
