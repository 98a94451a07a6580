"""What no split of the I/O can beat on this machine: two independent servers against one, no hub and no hop.

    python -m bench.frontends_ceiling                  # 3 rounds x 4 s, HTTP binary, identity [1,16]
    python -m bench.frontends_ceiling --rounds 5 --connections 64

One server of one process (bench/model_server.py) under wrk with `--connections`, then two such servers, each
with its own model on its own port, each under its own wrk with half the connections, both at once, unpinned (the
load generators share the cores, as in `python -m bench frontends`). The pair's summed req/s over the one server's
is the best that frontend processes could reach here if their hop to the model cost nothing: the bound on issue
35's "2 frontends at least 1.3x one" for this machine (docs/performance.md#frontend-processes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from typing import List, Optional

from bench import loadgen
from bench.frontends import LOG_DIR
from bench.payloads import Payload, http_body
from bench.servers import ServerProcess, ours_target
from bench.workloads import SMALL_SHAPE

BODY, HEADERS = http_body(Payload("identity", "binary", SMALL_SHAPE))


def _url(server: ServerProcess) -> str:
    return f"{server.base_url}/v2/models/identity/infer"


def _started(count: int) -> List[ServerProcess]:
    servers = [ServerProcess(ours_target(None), None, LOG_DIR) for _ in range(count)]
    for server in servers:
        server.wait_ready(120)
    return servers


def _at_once(servers: List[ServerProcess], connections: int, seconds: float) -> List[float]:
    """Each server's req/s under its own wrk, all loaded at the same time."""
    rates = [0.0] * len(servers)

    def load(index: int) -> None:
        rates[index] = loadgen.run_wrk(_url(servers[index]), BODY, HEADERS, connections, seconds, None)["rps"]

    threads = [threading.Thread(target=load, args=(index,)) for index in range(len(servers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rates


def measure(connections: int, seconds: float, warmup: float) -> float:
    """One round: the pair's req/s over the single server's."""
    results = []
    for count in (1, 2):
        servers = _started(count)
        try:
            _at_once(servers, connections // count, warmup)
            rates = _at_once(servers, connections // count, seconds)
        finally:
            for server in servers:
                server.stop()
        results.append(rates)
    one, two = results[0][0], sum(results[1])
    rates_text = " + ".join(f"{rate:,.0f}" for rate in results[1])
    print(f"one server {one:,.0f} req/s; two independent {rates_text} = {two:,.0f}: {two / one:.2f}x", flush=True)
    return two / one


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.frontends_ceiling", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=32, help="the one server's; each of the two gets half")
    args = parser.parse_args(argv)
    ratios = [measure(args.connections, args.duration, args.warmup) for _ in range(args.rounds)]
    print(
        f"two independent servers / one: median {statistics.median(ratios):.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
