"""`python -m bench cpu_ab REF [REF ...]`: the server's CPU per small request for several commits, side by side.

A finer measure than req/s for a change on the request path. Each commit's `pytriton` (`git archive`; `.` is this
checkout as it is) serves `bench/model_server.py`'s `identity` model, pinned to one core, and one keep-alive HTTP
client on another core sends FP32 [1, 16] binary requests one at a time. The server's CPU (every thread, from
/proc) over a fixed count of requests gives microseconds per request; the commits take turns, in alternating order,
round after round. Unpinned, this 2-core VM's figures fall in two modes about 20 us apart: keep the pinning.

    python -m bench cpu_ab 168758b .              # 6 rounds x 20,000 requests each
    python -m bench cpu_ab HEAD~3 HEAD~1 . --rounds 8
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from typing import Dict, List, Optional

from bench.keepalive import KeepAliveClient, infer_message
from bench.pinned_rounds import alternating_rounds, pinned_server
from bench.servers import _cpu_seconds, free_ports


def _measure(tree: pathlib.Path, requests: int) -> float:
    """Server CPU in microseconds per request, over `requests` after a warm-up."""
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with pinned_server(tree, "model_server.py", ports) as server:
        client = KeepAliveClient(http, "identity")
        message = infer_message("identity")
        for _ in range(2000):
            client.send(message)
        before = _cpu_seconds(server.pid)
        for _ in range(requests):
            client.send(message)
        return (_cpu_seconds(server.pid) - before) / requests * 1e6


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_ab", description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="git commits ('.' is this checkout as it is)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=20_000, help="per commit per round")
    args = parser.parse_args(argv)
    figures: Dict[str, List[float]] = {ref: [] for ref in args.refs}
    for round_, turns in alternating_rounds(args.refs, args.rounds, "bench-cpu-ab-"):
        for ref, tree in turns:
            figures[ref].append(_measure(tree, args.requests))
        print(f"round {round_ + 1}: " + ", ".join(f"{ref} {figures[ref][-1]:.1f} us" for ref in args.refs))
    print(f"server CPU per request, median of {args.rounds} rounds (min):")
    for ref, values in figures.items():
        print(f"  {ref:12s} {statistics.median(values):6.1f} us ({min(values):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
