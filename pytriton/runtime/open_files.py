"""The open-file limit the server needs: each connection, shared-memory region and instance pipe holds descriptors.

Many systems start a process with a soft limit of 1024 open files and a far higher hard limit. Left at 1024, a
client holding a thousand idle connections (or registering shared-memory regions) leaves the server no
descriptor for anyone else's connection, long before `max_connections` refuses anything. The server raises the
soft limit up to the hard limit once, as it starts (frontend and instance processes inherit it), and warns when
even the hard limit is below what its caps may take.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

from pytriton.options.limits import METRICS_MAX_CONNECTIONS, OVER_CAP_HELD, ServerLimits

LOGGER = logging.getLogger(__name__)

# Descriptors besides connections: listening sockets, instance pipes and processes, registered shared-memory
# regions (up to 512, each held open and mapped), log files, the clients' buffers in frontend processes.
OTHER_DESCRIPTORS = 2048


def descriptors_needed(limits: ServerLimits) -> int:
    """Descriptors the server may hold at once under `limits`: every connection the caps allow, and the rest.

    The HTTP, gRPC and metrics ports each hold up to OVER_CAP_HELD connections over their caps, to answer them.
    """
    caps = limits.max_connections + limits.grpc_max_connections + METRICS_MAX_CONNECTIONS
    return caps + 3 * OVER_CAP_HELD + OTHER_DESCRIPTORS


def raise_open_files_limit(limits: ServerLimits) -> Optional[Tuple[int, int]]:
    """Raise this process's soft open-file limit toward what `limits` needs (never above the hard limit, never down).

    Returns (the soft limit before, after), or None where there is no such limit (Windows) or it could not be read.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    needed = descriptors_needed(limits)
    unlimited = resource.RLIM_INFINITY
    now = soft
    if soft != unlimited and soft < needed:
        target = needed if hard == unlimited else min(hard, needed)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                now = target
                LOGGER.debug("raised the open-file limit from %d to %d (hard limit %s)", soft, target, hard)
            except (OSError, ValueError) as error:
                LOGGER.debug("could not raise the open-file limit from %d to %d: %s", soft, target, error)
        if now < needed:
            _warn(now, needed, limits)
    return soft, now


def _warn(limit: int, needed: int, limits: ServerLimits) -> None:
    """The limit stays below what the caps need: connections past it are refused at accept, not by the caps."""
    LOGGER.warning(
        "the open-file limit is %d, below the %d the server may need (max_connections %d + grpc_max_connections "
        "%d + %d for the metrics port, %d over the caps, %d for the rest): connections past it are refused at "
        "accept, before the caps answer them; raise the hard limit (ulimit -Hn) or lower the caps (ServerLimits)",
        limit,
        needed,
        limits.max_connections,
        limits.grpc_max_connections,
        METRICS_MAX_CONNECTIONS,
        3 * OVER_CAP_HELD,
        OTHER_DESCRIPTORS,
    )
