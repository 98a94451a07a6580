"""The lame-duck phase of a stop: unready but still serving, while clients are steered elsewhere.

A balancer (HAProxy's health checks, a Kubernetes Service's endpoints) keeps sending to a replica
until it sees the replica unready, up to one check interval after SIGTERM. A replica that refused
requests at once would fail those: over gRPC as UNAVAILABLE in trailers under `:status 200`, which
no balancer can retry. So, for `ServerLimits.lame_duck_s` before the drain, readiness is false while
every request is still served; each frontend tells its clients to reconnect (HTTP/1.1 answers with
`Connection: close`, gRPC sends a graceful GOAWAY), so that their next connection goes through the
balancer to another replica. This is what a Kubernetes `preStop` sleep or a gRPC server's
"lame duck" mode does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, Sequence

from pytriton.core.engine import Engine, Phase

LOGGER = logging.getLogger("pytriton")


class Leaving(Protocol):
    """A frontend that can ask its clients to go elsewhere while it still serves them."""

    async def steer(self) -> None:
        """From now on, answers ask their clients to reconnect elsewhere; return once they do."""

    async def leave(self) -> None:
        """Keep serving, but ask the clients connected now to reconnect; return once they have been told."""


async def lame_duck(engine: Engine, frontends: Sequence[Leaving], delay_s: float) -> None:
    """Be unready and steer clients away for `delay_s` seconds while serving (nothing when 0 or the server failed).

    Clients are told twice: at once, and at the end for connections opened meanwhile (while a balancer had not
    yet seen the replica unready). A gRPC connection told to go away at the moment it opens would be closed
    before its first call, and a gRPC client backs off before it reconnects after that, so new connections are
    served until the end.
    """
    if delay_s <= 0 or not engine.live or engine.phase is not Phase.SERVING:
        return
    # Before readiness turns false: a frontend process answers its clients itself, and the readiness it forwards
    # to the hub must not say unready while its own answers still keep the connection.
    await asyncio.gather(*(frontend.steer() for frontend in frontends))
    engine.phase = Phase.LEAVING
    LOGGER.info("stopping: unready, still serving for %.1f s (lame duck) before draining", delay_s)
    await asyncio.gather(*(frontend.leave() for frontend in frontends), asyncio.sleep(delay_s))
    await asyncio.gather(*(frontend.leave() for frontend in frontends))
