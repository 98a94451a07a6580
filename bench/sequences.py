"""`python -m bench sequences`: what a request of a sequence costs the server against a plain one (issue 38).

One server serves two identity models, FP32 [1, 16]: `plain` (dynamic batcher) and `sequence` (the sequence
batcher, direct strategy, a per-sequence state kept). One HTTP keep-alive client sends requests one at a time,
to `plain`, then to `sequence` as sequences of 8 requests (START on the first, END on the last), model after
model in alternating order, a fixed count per round. The server's CPU (all its threads, from /proc) is read
around each block; the figure is CPU per request, and the ratio is taken within each round.

    python -m bench sequences                 # 5 rounds x 10,000 requests per model
    python -m bench sequences --rounds 3 --requests 4000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

from bench.keepalive import KeepAliveClient, infer_message
from bench.servers import _cpu_seconds, free_ports

SERVER = """
import sys, numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config import SequenceBatcher
from pytriton.triton import Triton, TritonConfig

def plain(requests):
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]

def sequence(requests):
    for request in requests:
        request.sequence_state["seen"] = request.sequence_state.get("seen", 0) + 1
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]

inputs = [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))]
outputs = [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))]
config = TritonConfig(http_port=int(sys.argv[1]), grpc_port=0, metrics_port=0)
with Triton(config=config) as triton:
    triton.bind("plain", plain, inputs, outputs, config=ModelConfig(max_batch_size=64))
    sequences = ModelConfig(max_batch_size=64, sequence_batcher=SequenceBatcher())
    triton.bind("sequence", sequence, inputs, outputs, config=sequences)
    triton.serve()
"""
SEQUENCE_LENGTH = 8


def _run(client: KeepAliveClient, model: str, count: int, first_id: int) -> int:
    """Send `count` requests to `model` (`sequence`: as sequences of SEQUENCE_LENGTH from `first_id`); the next id."""
    if model == "plain":
        message = infer_message("plain")
        for _ in range(count):
            client.send(message)
        return first_id
    sequence_id = first_id
    for index in range(count):
        step = index % SEQUENCE_LENGTH
        if step == 0 and index:
            sequence_id += 1
        start, end = step == 0, step == SEQUENCE_LENGTH - 1
        client.send(
            infer_message("sequence", {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end})
        )
    return sequence_id + 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sequences", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10_000, help="per model per round")
    args = parser.parse_args(argv)
    (port,) = free_ports(1)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        client = KeepAliveClient(port, "sequence")
        next_id = _run(client, "plain", 1000, 1)  # warm-up of both
        next_id = _run(client, "sequence", 1000, next_id)
        cpu: Dict[str, List[float]] = {"plain": [], "sequence": []}
        ratios = []
        for round_ in range(args.rounds):
            order = ["plain", "sequence"] if round_ % 2 == 0 else ["sequence", "plain"]
            for model in order:
                before = _cpu_seconds(server.pid)
                next_id = _run(client, model, args.requests, next_id)
                cpu[model].append((_cpu_seconds(server.pid) - before) / args.requests * 1e6)
            ratios.append(cpu["sequence"][-1] / cpu["plain"][-1])
            print(f"round {round_ + 1}: plain {cpu['plain'][-1]:.1f} us/req, sequence {cpu['sequence'][-1]:.1f} us/req")
        plain, sequence = statistics.median(cpu["plain"]), statistics.median(cpu["sequence"])
        print(
            f"server CPU per request (median of {args.rounds}): plain {plain:.1f} us, sequence {sequence:.1f} us, "
            f"sequence/plain {statistics.median(ratios):.2f}x (median of the rounds' ratios)"
        )
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
