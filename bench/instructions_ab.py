"""`python -m bench instr_ab REF [REF ...]`: the server's instructions per small request for several commits.

What `cpu_ab` measures in microseconds, counted in instructions instead: each commit's `pytriton` (`git archive`;
`.` is this checkout as it is) serves `bench/model_server.py` under valgrind's callgrind, and a client sends one
request at a time. A run with `--requests` more requests than another, the same warm-up before both, gives the
instructions of those requests alone (every thread of the server; start-up and shutdown cancel out). A count does
not move with the machine's load: on this shared 2-core VM, where `cpu_ab`'s rounds spread by +-1.5 us (about 2 %)
and req/s by far more, two rounds of the same tree agreed within 0.3 %, so a change of 1 % shows. It says nothing
of what an instruction costs (cache misses, system calls, switches between processes): a change that trades
instructions for those still needs `cpu_ab` and the main bench. Needs valgrind (`apt-get install valgrind`); a
run takes about 30 s a commit a round.

    python -m bench instr_ab 6eab9c7 .                      # `simple` as perf_analyzer sends it, over HTTP
    python -m bench instr_ab HEAD~1 . --protocol grpc --model identity --rounds 3
    python -m bench instr_ab HEAD~1 . --frontends 3         # the server and its frontend processes, all counted
    python -m bench instr_ab HEAD~1 . --json                # `simple` with JSON tensors both ways
    python -m bench instr_ab HEAD~1 . --shared-memory system  # `simple` in shared memory, against its bytes
    python -m bench instr_ab main . --composition            # per sync -> sync inner call (2,000 a request)
    python -m bench instr_ab main . --composition async-async  # an async callable calling an async model

`--composition [KIND]` counts one in-process inner call instead: `bench/composition_server.py`'s `sync_loop` model,
a sync callable calling the sync `identity` 2,000 times in a row, asked `--requests` times more in one run than in
the other (each request's instructions divided by its 2,000 calls; the loop's own Python and the request around
it, one in 2,000, are counted too). KIND names the caller's and the model's kinds: sync-sync (the default),
sync-async, async-sync or async-async (`async_loop` and `identity_async`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from bench.keepalive import KeepAliveClient, infer_message
from bench.pinned_rounds import ROOT, alternating_rounds
from bench.servers import ACCESS_TOKEN, RESTRICTED_ENDPOINTS, free_ports

WARM_UP = 300
# How often a run asks whether the model is ready. Every ask the server answers is counted, and under valgrind it
# listens before its model is ready (0.8 s of 7.4 s, 2026-12-05: 6 asks answered at 0.05 s), longer on a loaded
# machine: asked less often, that start costs about the same in both runs of a commit.
READY_POLL_S = 1.0
BASE_REQUESTS = 200  # the shorter run's requests after the warm-up
SIMPLE_BYTES = 64  # each tensor of `simple`: INT32 [1, 16]
COMPOSITION_WARM_UP = 2  # requests to `sync_loop` (2,000 inner calls each)
COMPOSITION_BASE = 1
CALLS_PER_LOOP = 2000  # bench/composition_server.py's LOOP_CALLS


def simple_message() -> bytes:
    """Triton's `simple` (two INT32 [1, 16] inputs, both outputs asked in binary) as perf_analyzer sends it."""
    tensors = [
        {"name": f"INPUT{index}", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
        for index in (0, 1)
    ]
    outputs = [{"name": f"OUTPUT{index}", "parameters": {"binary_data": True}} for index in (0, 1)]
    json_part = json.dumps({"id": "", "inputs": tensors, "outputs": outputs}, separators=(",", ":")).encode()
    body = json_part + np.arange(32, dtype=np.int32).tobytes()
    return (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nUser-Agent: libcurl-agent/1.0\r\nAccept: */*\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
        % (len(json_part), len(body))
    ) + body


def simple_json_message() -> bytes:
    """`simple` with its tensors as JSON both ways (`--json`: the JSON codec's small-request path)."""
    tensors = [
        {"name": f"INPUT{index}", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for index in (0, 1)
    ]
    outputs = [{"name": f"OUTPUT{index}", "parameters": {"binary_data": False}} for index in (0, 1)]
    body = json.dumps({"id": "", "inputs": tensors, "outputs": outputs}, separators=(",", ":")).encode()
    return (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


# `--json`: `simple` is sent with JSON tensors.
JSON_TENSORS = False


def simple_shm_message(regions: Dict[str, str]) -> bytes:
    """`simple` as perf_analyzer sends it with `--shared-memory system`: every tensor named by its region."""

    def where(region: str) -> Dict[str, Any]:
        return {"shared_memory_region": region, "shared_memory_byte_size": SIMPLE_BYTES}

    tensors = [
        {"name": f"INPUT{index}", "datatype": "INT32", "shape": [1, 16], "parameters": where(regions[f"INPUT{index}"])}
        for index in (0, 1)
    ]
    outputs = [{"name": f"OUTPUT{index}", "parameters": where(regions[f"OUTPUT{index}"])} for index in (0, 1)]
    json_part = json.dumps({"id": "", "inputs": tensors, "outputs": outputs}, separators=(",", ":")).encode()
    return (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nUser-Agent: libcurl-agent/1.0\r\nAccept: */*\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
        % (len(json_part), len(json_part))
    ) + json_part


class SimpleRegions:
    """perf_analyzer's regions for `simple`: one POSIX segment per input and per output, each a region of 64 bytes.

    Region names are perf_analyzer's (INPUT0_0_0, ..., OUTPUT0); the segments' keys carry this process's id.
    The inputs hold their data from the start, as perf_analyzer writes them once.
    """

    def __init__(self) -> None:
        import tritonclient.utils.shared_memory as shm

        self.names = {"INPUT0": "INPUT0_0_0", "INPUT1": "INPUT1_0_0", "OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
        self.keys = {region: f"/instr_ab_{os.getpid()}_{region}" for region in self.names.values()}
        self.handles = [shm.create_shared_memory_region(region, key, SIMPLE_BYTES) for region, key in self.keys.items()]
        for handle in self.handles[:2]:
            shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32).reshape(1, 16)])

    def close(self) -> None:
        """Unlink the segments."""
        import tritonclient.utils.shared_memory as shm

        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


def _http_sender(port: int, model: str, regions: Optional[SimpleRegions]) -> Callable[[], None]:
    """One keep-alive connection sending the model's bench request (in `regions`, registered first, if given)."""
    client = KeepAliveClient(port, model, timeout_s=600, poll_s=READY_POLL_S)
    if regions is not None:
        for region, key in regions.keys.items():
            body = json.dumps({"key": key, "offset": 0, "byte_size": SIMPLE_BYTES}, separators=(",", ":")).encode()
            client.send(
                b"POST /v2/systemsharedmemory/region/%s/register HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                % (region.encode(), len(body))
                + body
            )
        message = simple_shm_message(regions.names)
    else:
        simple = simple_json_message() if JSON_TENSORS else simple_message()
        message = simple if model == "simple" else infer_message(model)

    def send() -> None:
        client.send(message)

    return send


# `--composition`'s kinds: the loop model that calls and the model it calls.
LOOPS = {
    "sync-sync": ("sync_loop", "identity"),
    "sync-async": ("sync_loop", "identity_async"),
    "async-sync": ("async_loop", "identity"),
    "async-async": ("async_loop", "identity_async"),
}
LOOP_MODEL = "loop:"  # a `model` of this prefix names a kind of LOOPS: the composition bench's server serves it


def _loop_sender(port: int, kind: str) -> Callable[[], None]:
    """One keep-alive connection asking a loop model for 2,000 inner calls (`kind`: a key of LOOPS)."""
    from bench.composition_cpu import _loop_message

    caller, target = LOOPS[kind]
    client = KeepAliveClient(port, caller, timeout_s=600, poll_s=READY_POLL_S)
    message = _loop_message(caller, target)

    def send() -> None:
        client.send(message)

    return send


def _grpc_sender(http_port: int, grpc_port: int, model: str, regions: Optional[SimpleRegions]) -> Callable[[], None]:
    """tritonclient's gRPC client sending the model's bench request (binary tensors, or in `regions`, registered
    first), once the model is ready."""
    import tritonclient.grpc as grpcclient

    KeepAliveClient(http_port, model, timeout_s=600, poll_s=READY_POLL_S).sock.close()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    if regions is not None:
        for region, key in regions.keys.items():
            client.register_system_shared_memory(region, key, SIMPLE_BYTES)
        inputs = [grpcclient.InferInput(f"INPUT{index}", [1, 16], "INT32") for index in (0, 1)]
        outputs = [grpcclient.InferRequestedOutput(f"OUTPUT{index}") for index in (0, 1)]
        for tensor in [*inputs, *outputs]:
            tensor.set_shared_memory(regions.names[tensor.name()], SIMPLE_BYTES)
        return lambda: client.infer(model, inputs, outputs=outputs) and None
    if model == "simple":
        inputs = [grpcclient.InferInput(f"INPUT{index}", [1, 16], "INT32") for index in (0, 1)]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    else:
        inputs = [grpcclient.InferInput("INPUT_1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    return lambda: client.infer(model, inputs) and None


def serve_and_send(
    command: List[str],
    env: Dict[str, str],
    ports: Tuple[int, int],
    protocol: str,
    model: str,
    requests: int,
    regions: Optional[SimpleRegions] = None,
    cwd: Optional[pathlib.Path] = None,
    after: Optional[Callable[[], int]] = None,
) -> int:
    """Start the server `command`, send it `requests` of the model's bench request one at a time, and stop it.

    `after`, if given, runs a load of its own once those requests were answered (bench/opcodes.py's --load): what it
    answers (the requests it sent) is returned, else 0.

    `ports` are its HTTP and gRPC ports; a loop model (LOOP_MODEL) is asked over HTTP (`--composition`). `cwd`:
    the server's working directory, the tree whose `pytriton` it runs: its frontend processes start as
    `python -m ...`, which puts the working directory first on their path.
    """
    http, grpc = ports
    server = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if model.startswith(LOOP_MODEL):
            send = _loop_sender(http, model[len(LOOP_MODEL) :])
        elif protocol == "grpc":
            send = _grpc_sender(http, grpc, model, regions)
        else:
            send = _http_sender(http, model, regions)
        for _ in range(requests):
            send()
        return after() if after is not None else 0
    finally:
        server.terminate()
        server.wait(300)


def _instructions(
    tree: pathlib.Path,
    requests: int,
    protocol: str,
    model: str,
    frontends: int,
    scratch: pathlib.Path,
    regions: Optional[SimpleRegions] = None,
) -> int:
    """The server's instructions (Ir, every thread) from its start to its stop, over the warm-up + `requests`.

    With `frontends` > 1, valgrind follows the processes the server spawns: its frontends are counted too. The
    model of LOOP_MODEL is the composition bench's server's (`--composition`).
    """
    http, grpc, metrics = free_ports(3)
    out = f"callgrind.{tree.name}.{requests}"
    if model.startswith(LOOP_MODEL):
        server_args = [str(ROOT / "bench" / "composition_server.py"), "--http-port", str(http)]
        warm_up = COMPOSITION_WARM_UP
    else:
        server_args = [str(ROOT / "bench" / "model_server.py"), "--http-port", str(http)]
        server_args += ["--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        warm_up = WARM_UP
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={scratch / out}.%p",
        f"--trace-children={'yes' if frontends > 1 else 'no'}",
        "-q",
        sys.executable,
        *server_args,
    ]
    env = dict(os.environ, PYTHONPATH=str(tree), PYTRITON_FRONTENDS=str(frontends))
    # The APIs guarded as in the main bench: the shared-memory ones open, as perf_analyzer needs them.
    env.update(BENCH_ACCESS_TOKEN=ACCESS_TOKEN, BENCH_RESTRICTED_ENDPOINTS=RESTRICTED_ENDPOINTS)
    # numpy's OpenBLAS threads spin for as long as the scheduler lets them: 13,000 instructions a request, more or
    # less from run to run (callgrind_annotate's blas_thread_server), where no request does linear algebra.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    serve_and_send(command, env, (http, grpc), protocol, model, warm_up + requests, regions, cwd=tree)
    files = list(scratch.glob(f"{out}.*"))
    if len(files) < frontends:  # the server's process and frontends - 1 frontend processes (a tree before
        # 532f304 runs `frontends` of them besides the server's)
        raise SystemExit(f"{len(files)} processes counted; at least {frontends} expected (the server's among them)")
    total = 0
    for path in files:
        match = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.MULTILINE)
        if match is None:
            raise SystemExit(f"no instruction count in {path}")
        total += int(match.group(1))
        path.unlink()
    return total


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench instr_ab", description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="git commits ('.' is this checkout as it is)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1000, help="the longer run's extra requests")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--model", choices=("simple", "identity"), default="simple")
    parser.add_argument("--frontends", type=int, default=1, help="PYTRITON_FRONTENDS; every process is counted")
    parser.add_argument("--json", action="store_true", help="HTTP `simple` with JSON tensors both ways")
    parser.add_argument(
        "--shared-memory",
        choices=("none", "system"),
        default="none",
        help="system: `simple` in perf_analyzer's regions, counted beside the same request sending its bytes",
    )
    parser.add_argument(
        "--composition",
        nargs="?",
        const="sync-sync",
        choices=sorted(LOOPS),
        help="per inner call of KIND (default sync-sync): `--requests` (default 4) more requests of 2,000 calls",
    )
    args = parser.parse_args(argv)
    global JSON_TENSORS
    JSON_TENSORS = args.json
    if args.composition:
        if args.shared_memory != "none":
            raise SystemExit("--composition counts inner calls: no --shared-memory")
        args.model, args.protocol = LOOP_MODEL + args.composition, "http"
        args.requests = 4 if args.requests == 1000 else args.requests
    base, per = (COMPOSITION_BASE, CALLS_PER_LOOP) if args.composition else (BASE_REQUESTS, 1)
    if shutil.which("valgrind") is None:
        raise SystemExit("instr_ab needs valgrind: apt-get install valgrind")
    if args.shared_memory == "system" and args.model != "simple":
        raise SystemExit("--shared-memory system counts the `simple` model only")
    # Each ref's figures by how the tensors travel: "bytes" in the request, "shm" in regions.
    modes = ["bytes", "shm"] if args.shared_memory == "system" else ["bytes"]
    figures: Dict[str, Dict[str, List[float]]] = {ref: {mode: [] for mode in modes} for ref in args.refs}
    regions = SimpleRegions() if args.shared_memory == "system" else None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-instr-ab-") as scratch:
            for round_, turns in alternating_rounds(args.refs, args.rounds, "bench-instr-ab-trees-"):
                for ref, tree in turns:
                    for mode in modes:
                        counts = [
                            _instructions(
                                tree,
                                requests,
                                args.protocol,
                                args.model,
                                args.frontends,
                                pathlib.Path(scratch),
                                regions if mode == "shm" else None,
                            )
                            for requests in (base, base + args.requests)
                        ]
                        figures[ref][mode].append((counts[1] - counts[0]) / (args.requests * per))
                line = ", ".join(
                    f"{ref} {' / '.join(f'{figures[ref][mode][-1]:,.0f}' for mode in modes)}" for ref in args.refs
                )
                print(f"round {round_ + 1}: {line}{' (bytes / shm)' if regions else ''}", flush=True)
    finally:
        if regions is not None:
            regions.close()
    what = f"{args.protocol}, {args.model}, {args.frontends} frontend{'s' if args.frontends > 1 else ''}"
    unit = f"{args.composition.replace('-', ' -> ')} inner call" if args.composition else "request"
    print(f"server instructions per {unit} ({what}), median of {args.rounds} rounds:")
    for mode in modes:
        first = statistics.median(figures[args.refs[0]][mode])
        for ref in args.refs:
            values = figures[ref][mode]
            median = statistics.median(values)
            spread = f"rounds {min(values):,.0f}-{max(values):,.0f}"
            against = f", {median / statistics.median(figures[ref]['bytes']):.3f}x its bytes" if mode == "shm" else ""
            print(
                f"  {mode:5s} {ref:12s} {median:10,.0f}  {median / first:.3f}x of {args.refs[0]}{against}  ({spread})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
