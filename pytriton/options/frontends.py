"""How many processes serve the HTTP and gRPC ports: this project's own option, not TritonConfig's.

Set with `Triton(frontends=N)`, the PYTRITON_FRONTENDS environment variable, or `pytriton serve --frontends N`.
With 1 (the default) the server's loop serves both ports in its own process, as it always did. With N >= 2 the
server runs in N processes, one a core: its own, which keeps the models (their batchers take the requests of
every frontend), and N - 1 frontend processes that parse and answer requests. With 2 the server's own process
also serves 1 in HUB_SHARE of each port's open connections, and at least HUB_KEEPS of them (a client alone
gets them); with more its batchers have every frontend's requests to take, and it serves none
(docs/deployment.md says when frontends pay, docs/performance.md shows why).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from pytriton.exceptions import PyTritonValidationError

ENV_VARIABLE = "PYTRITON_FRONTENDS"
DEFAULT_FRONTENDS = 1
MAX_FRONTENDS = 256
# With frontends=2 the server's own process serves 1 in HUB_SHARE of a port's open connections. On two
# cores, a request it serves itself costs the machine ~60-70 us of CPU and one through the other process ~110
# (the hop's two sides); its loop also takes the other's requests, so it must keep the smaller share. On the
# 2-core VM of docs/performance.md, 2 / 1 frontends (HTTP binary, HTTP JSON, gRPC 4x8) measured 0.89-1.13x,
# 1.03-1.29x and 1.24-1.49x with 1 in 4, 0.85-1.18x, 0.96-1.24x and 1.00-1.35x with 1 in 3, where two frontend
# processes and the hub serving none gave 0.72-0.95x, 0.80-1.12x and 0.88-1.20x. With 3 or more, its batchers'
# share of every request (15-35 us) is already a frontend's load.
HUB_SHARE = 4
# Below its share, the server's own process also takes a new HTTP connection while it holds fewer than
# HUB_KEEPS["http"] of them: a client alone often holds two, one it asks the model's metadata and statistics on and
# one it infers on. perf_analyzer opens its inference connection while its last metadata connection is still open
# (1.5 ms apart): with 1 in 4 alone that connection went to the frontend, and served at 0.65x of one process at
# concurrency 1 (1,906-1,966 infer/s against 2,952-3,012). An HTTP/1.1 connection carries one request at a time,
# so two cost the hub's loop little; a gRPC connection carries any number (a proxy's, a channel's), so the share
# alone places those, the first one to the hub.
HUB_KEEPS = {"http": 2, "grpc": 1}


def frontend_processes(frontends: int) -> int:
    """How many frontend processes serve beside the server's own (none with 1)."""
    return frontends - 1 if frontends > 1 else 0


def hub_serves_connections(frontends: int) -> bool:
    """Whether, with frontend processes, the server's own process serves a share of the connections too."""
    return frontends == 2


def resolve_frontends(explicit: Optional[int], environ: Mapping[str, str] = os.environ) -> int:
    """The number of processes serving the ports: `explicit` when given, else PYTRITON_FRONTENDS, else 1.

    Raises:
        PyTritonValidationError: not a whole number from 1 to MAX_FRONTENDS (naming where it came from).
    """
    if explicit is not None:
        source, value = "frontends", explicit
    elif environ.get(ENV_VARIABLE, "").strip():
        source, text = ENV_VARIABLE, environ[ENV_VARIABLE].strip()
        try:
            value = int(text)
        except ValueError:
            raise PyTritonValidationError(f"{ENV_VARIABLE}={text!r} is not a number of frontend processes") from None
    else:
        return DEFAULT_FRONTENDS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FRONTENDS:
        raise PyTritonValidationError(
            f"{source}: {value!r} is not a number of frontend processes (1 to {MAX_FRONTENDS})"
        )
    return value
