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
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_cpu_s(pid: int) -> float:
    """User + system CPU of every thread of the process."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        fields = open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _request(model: str, parameters: Optional[Dict[str, object]]) -> bytes:
    head: Dict[str, object] = {
        "inputs": [{"name": "INPUT_1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
        "outputs": [{"name": "OUTPUT_1", "parameters": {"binary_data": True}}],
    }
    if parameters:
        head["parameters"] = parameters
    json_part = json.dumps(head).encode()
    body = json_part + bytes(64)
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
        b"Content-Length: %d\r\n\r\n" % (model.encode(), len(json_part), len(body))
    ) + body


class _Client:
    """A keep-alive HTTP client that sends one request at a time and reads its whole answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sequence_id = 0

    def ready(self, model: str) -> bool:
        """Whether the model is ready (GET /v2/models/{model}/ready)."""
        return self.send(b"GET /v2/models/%s/ready HTTP/1.1\r\nHost: x\r\n\r\n" % model.encode(), check=False)

    def send(self, message: bytes, check: bool = True) -> bool:
        """Send a request and read its whole answer; whether it was a 200 (an error raises when `check`)."""
        self.sock.sendall(message)
        got = b""
        while b"\r\n\r\n" not in got:
            got += self.sock.recv(65536)
        head, rest = got.split(b"\r\n\r\n", 1)
        ok = head.startswith(b"HTTP/1.1 200")
        if check and not ok:
            raise RuntimeError((head + b"\n" + rest).decode(errors="replace"))
        length = int(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(rest) < length:
            rest += self.sock.recv(65536)
        return ok

    def run(self, model: str, count: int) -> None:
        plain = _request("plain", None)
        for index in range(count):
            if model == "plain":
                self.send(plain)
                continue
            step = index % SEQUENCE_LENGTH
            if step == 0:
                self.sequence_id += 1
            parameters = {"sequence_id": self.sequence_id, "sequence_start": step == 0}
            parameters["sequence_end"] = step == SEQUENCE_LENGTH - 1
            self.send(_request("sequence", parameters))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sequences", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10_000, help="per model per round")
    args = parser.parse_args(argv)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client = _Client(port)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    why = server.stderr.read().decode() if server.stderr else ""
                    raise SystemExit(f"the server did not start: {why}") from None
                time.sleep(0.05)
        while not client.ready("sequence"):
            if time.monotonic() > deadline:
                raise SystemExit("the models did not become ready")
            time.sleep(0.05)
        client.run("plain", 1000)  # warm-up of both
        client.run("sequence", 1000)
        cpu: Dict[str, List[float]] = {"plain": [], "sequence": []}
        ratios = []
        for round_ in range(args.rounds):
            order = ["plain", "sequence"] if round_ % 2 == 0 else ["sequence", "plain"]
            for model in order:
                before = _server_cpu_s(server.pid)
                client.run(model, args.requests)
                cpu[model].append((_server_cpu_s(server.pid) - before) / args.requests * 1e6)
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
