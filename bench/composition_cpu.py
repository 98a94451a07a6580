"""`python -m bench.composition_cpu REF [REF ...]`: the server's CPU per inner call, for several commits, pinned.

A finer measure than `python -m bench.composition`'s loops, whose wall times follow the machine's load. Each
commit's `pytriton` (`git archive`; `.` is this checkout as it is) serves `bench/composition_server.py`, pinned to
one core; a client on another core asks its `sync_loop` and `async_loop` models (a sync and an async callable that
call `identity` or `identity_async` 2,000 times in a row) again and again. The server's CPU (every thread, from
/proc) over those calls gives microseconds per inner call, for each caller -> callee kind; the commits take turns,
in alternating order, round after round.

    python -m bench.composition_cpu 0a8db42 .              # 2 rounds x 50 loops (100,000 calls) per kind
    python -m bench.composition_cpu HEAD~3 . --rounds 4 --loops 20
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Dict, List, Tuple

from bench.keepalive import KeepAliveClient
from bench.pinned_rounds import alternating_rounds, pinned_server
from bench.servers import _cpu_seconds, free_ports

# (caller model, callee model) of each kind.
KINDS: Dict[str, Tuple[str, str]] = {
    "sync -> sync": ("sync_loop", "identity"),
    "sync -> async": ("sync_loop", "identity_async"),
    "async -> sync": ("async_loop", "identity"),
    "async -> async": ("async_loop", "identity_async"),
}
CALLS_PER_LOOP = 2000  # bench/composition_server.py's LOOP_CALLS


def _loop_message(caller: str, target: str) -> bytes:
    """One request to a loop model naming its target."""
    body = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}],
            "parameters": {"target": target},
        }
    ).encode()
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (caller.encode(), len(body))
    ) + body


def _measure(tree: pathlib.Path, loops: int) -> Dict[str, float]:
    """Server CPU in microseconds per inner call of each kind, over `loops` loops after a warm-up loop."""
    (http,) = free_ports(1)
    with pinned_server(tree, "composition_server.py", ["--http-port", str(http)]) as server:
        client = KeepAliveClient(http, "async_loop")
        per_call: Dict[str, float] = {}
        for kind, (caller, target) in KINDS.items():
            message = _loop_message(caller, target)
            client.send(message)
            before = _cpu_seconds(server.pid)
            for _ in range(loops):
                client.send(message)
            per_call[kind] = (_cpu_seconds(server.pid) - before) / (loops * CALLS_PER_LOOP) * 1e6
        return per_call


def main(argv: List[str]) -> None:
    """Measure each commit round after round; print every round, then each kind's median per commit."""
    parser = argparse.ArgumentParser(prog="python -m bench.composition_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("refs", nargs="+", help="commits to compare; '.' is this checkout as it is")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loops", type=int, default=50, help="loops of 2,000 calls per kind and round")
    args = parser.parse_args(argv)
    results: Dict[str, Dict[str, List[float]]] = {ref: {kind: [] for kind in KINDS} for ref in args.refs}
    for round_index, turns in alternating_rounds(args.refs, args.rounds, "composition-cpu-"):
        for ref, tree in turns:
            for kind, value in _measure(tree, args.loops).items():
                results[ref][kind].append(value)
            row = "  ".join(f"{kind} {results[ref][kind][-1]:.1f}" for kind in KINDS)
            print(f"round {round_index + 1}  {ref:>12}  {row}  (us of server CPU per call)", flush=True)
    print(f"{'':>12}  " + "  ".join(f"{kind:>14}" for kind in KINDS))
    for ref in args.refs:
        print(f"{ref:>12}  " + "  ".join(f"{statistics.median(results[ref][kind]):>11.1f} us" for kind in KINDS))


if __name__ == "__main__":
    main(sys.argv[1:])
