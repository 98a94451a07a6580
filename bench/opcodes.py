"""`python -m bench opcodes`: which Python functions a small request runs, in bytecodes, per process of the server.

Where `instr_ab` says how many instructions a request costs, this says where its Python goes: the server
(`bench/model_server.py` of this checkout, with `--frontends N` its frontend processes too) runs under a tracer
that counts, per function, the bytecodes executed and the calls made, in every thread; a client sends one
request at a time. Two runs, `--requests` apart after the same warm-up, give the counts of those requests
alone. Counts are exact: they do not move with this shared machine's load, and a cut of one bytecode a request
shows. The tracer makes the server some 20 times slower, and bytecodes are not time: a C call (pickle, a
system call, numpy) is one bytecode here, whatever it costs. A run takes about 20 s.

    python -m bench opcodes                                  # `simple` over HTTP, one process
    python -m bench opcodes --frontends 3 --top 40           # the hub and its serving frontend, side by side
    python -m bench opcodes --protocol grpc --model identity
    python -m bench opcodes --frontends 3 --model identity --load 10   # under wrk, 32 connections: batches form

With `--load SECONDS` the counted requests are wrk's (HTTP binary to the identity model, `--connections` at
once), so that batches form as they do under load and a batch's work is shared by its requests. The tracer
slows the server so much that wrk's count is a few thousand; the counts are exact for that run, but the
batches' sizes move with the machine from run to run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pathlib
import sys
import tempfile
from typing import Callable, Counter, List, Optional, Tuple

from bench import loadgen
from bench.instructions_ab import serve_and_send
from bench.payloads import Payload, http_body
from bench.pinned_rounds import ROOT
from bench.servers import free_ports
from bench.workloads import SMALL_SHAPE

WARM_UP = 200
BASE_REQUESTS = 100

# Imported by every Python process of the server (its folder comes first on PYTHONPATH): counts each function's
# bytecodes and calls in every thread, and writes them when the process ends.
_TRACER = """
import os
if os.environ.get("BENCH_OPCODES_DIR"):
    import atexit, collections, sys, threading
    _ops = collections.Counter()
    _calls = collections.Counter()

    def _opcode(frame, event, arg, _ops=_ops):
        if event == "opcode":
            code = frame.f_code
            _ops[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        return _opcode

    def _call(frame, event, arg, _calls=_calls):
        code = frame.f_code
        _calls[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        frame.f_trace_opcodes = True
        return _opcode

    sys.settrace(_call)
    threading.settrace(_call)

    def _write():
        sys.settrace(None)
        import json
        path = os.path.join(os.environ["BENCH_OPCODES_DIR"], "%d.json" % os.getpid())
        with open(path, "w") as out:
            json.dump({"argv": sys.argv, "ops": list(_ops.items()), "calls": list(_calls.items())}, out)

    atexit.register(_write)
"""

Function = Tuple[str, int, str]  # file, first line, name
Counts = Tuple[str, Counter[Function], Counter[Function]]  # process, bytecodes, calls


def _wrk_load(model: str, seconds: float, connections: int) -> Callable[[int], int]:
    """After the warm-up, wrk's HTTP binary requests to `model` for `seconds`; answers how many it sent."""
    payload = Payload(model, "binary", SMALL_SHAPE)

    def load(http: int) -> int:
        body, extra = http_body(payload)
        url = f"http://127.0.0.1:{http}/v2/models/{model}/infer"
        return int(loadgen.run_wrk(url, body, extra, connections, seconds, None, 1)["requests"])

    return load


def _counted_run(
    requests: int,
    protocol: str,
    model: str,
    frontends: int,
    scratch: pathlib.Path,
    load: Optional[Callable[[int], int]] = None,
) -> Tuple[List[Counts], int]:
    """Each process's counts over WARM_UP + `requests` (and `load`'s), the server's process first, then its frontends
    by size; and how many requests `load` sent."""
    out = scratch / f"{requests}-{load is not None}"
    out.mkdir()
    http, grpc, metrics = free_ports(3)
    env = dict(
        os.environ,
        PYTHONPATH=f"{scratch}{os.pathsep}{ROOT}",
        PYTRITON_FRONTENDS=str(frontends),
        BENCH_OPCODES_DIR=str(out),
    )
    command = [sys.executable, str(ROOT / "bench" / "model_server.py")]
    command += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    after = None if load is None else functools.partial(load, http)
    loaded = serve_and_send(command, env, (http, grpc), protocol, model, WARM_UP + requests, after=after)
    processes: List[Counts] = []
    for path in out.glob("*.json"):
        data = json.loads(path.read_text())
        role = "server" if "model_server" in " ".join(data["argv"]) else "frontend"
        ops = collections.Counter({tuple(key): count for key, count in data["ops"]})
        calls = collections.Counter({tuple(key): count for key, count in data["calls"]})
        processes.append((role, ops, calls))
    expected = frontends  # the server's process and frontends - 1 frontend processes
    if len(processes) != expected:
        raise SystemExit(f"{len(processes)} processes wrote counts; {expected} expected")
    return sorted(processes, key=lambda p: (p[0] != "server", -sum(p[1].values()))), loaded


def _where(function: Function) -> str:
    path, line, _ = function
    for prefix in (str(ROOT) + os.sep, os.path.dirname(os.__file__) + os.sep):
        if path.startswith(prefix):
            path = path[len(prefix) :]
    return f"{path}:{line}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench opcodes", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="the longer run's extra requests")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--model", choices=("simple", "identity"), default="simple")
    parser.add_argument("--frontends", type=int, default=1, help="PYTRITON_FRONTENDS; every process is counted")
    parser.add_argument("--top", type=int, default=25, help="functions listed per process")
    parser.add_argument("--load", type=float, default=0, help="seconds of wrk's load to count (HTTP binary)")
    parser.add_argument("--connections", type=int, default=32, help="wrk's connections with --load")
    args = parser.parse_args(argv)
    if args.load and (args.protocol, args.model) != ("http", "identity"):
        parser.error("--load sends the identity model's HTTP requests: --model identity")
    with tempfile.TemporaryDirectory(prefix="bench-opcodes-") as scratch:
        folder = pathlib.Path(scratch)
        (folder / "sitecustomize.py").write_text(_TRACER)
        if args.load:
            base, _ = _counted_run(BASE_REQUESTS, args.protocol, args.model, args.frontends, folder)
            loaded, counted = _counted_run(
                BASE_REQUESTS,
                args.protocol,
                args.model,
                args.frontends,
                folder,
                _wrk_load(args.model, args.load, args.connections),
            )
            runs = [base, loaded]
            how = f"{counted:,} requests of wrk's {args.connections} connections counted"
        else:
            runs = [
                _counted_run(requests, args.protocol, args.model, args.frontends, folder)[0]
                for requests in (BASE_REQUESTS, BASE_REQUESTS + args.requests)
            ]
            counted = args.requests
            how = f"{counted} requests counted, one at a time"
    what = f"{args.protocol}, {args.model}, {args.frontends} frontend{'s' if args.frontends > 1 else ''}"
    print(f"Python bytecodes and calls per request ({what}; {how})")
    total = 0.0
    for (role, ops_before, calls_before), (_, ops, calls) in zip(*runs):
        ops.subtract(ops_before)
        calls.subtract(calls_before)
        per_request = sum(ops.values()) / counted
        if role == "frontend" and per_request < 1:
            continue  # a frontend that served no connection
        total += per_request
        print(f"\n{role}: {per_request:,.0f} bytecodes, {sum(calls.values()) / counted:,.1f} calls")
        for function, count in ops.most_common(args.top):
            if count >= counted:
                print(
                    f"  {count / counted:7,.0f} {calls[function] / counted:6.1f}  {function[2]:30s} {_where(function)}"
                )
    if args.frontends > 1:
        print(f"\nall processes: {total:,.0f} bytecodes a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
