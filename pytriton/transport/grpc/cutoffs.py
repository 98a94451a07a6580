"""Warnings about the connections the gRPC server cuts off, without letting a client flood the log with them.

A connection ended for what its client did (a connection error: a flood answered GOAWAY
ENHANCE_YOUR_CALM, a frame HTTP/2 forbids, a window overrun; no preface in time; one over
grpc_max_connections) is logged once, at WARNING, with its peer and the reason: the client learns it from
the GOAWAY, the operator from this line. A client may open connection after connection only to be cut
off: at most `burst` lines are logged per `interval_s`, and when the interval ends one line counts those
held back.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from pytriton.core.logs.log_budget import BURST, INTERVAL_S, LogBudget

LOGGER = logging.getLogger(__name__)


class CutoffLog:
    """The cut-off connections of one gRPC server; every method runs on the server's event loop."""

    def __init__(
        self, *, burst: int = BURST, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Log at most `burst` cut-offs per `interval_s`."""
        self._budget = LogBudget(self._held_back, burst=burst, interval_s=interval_s, clock=clock)

    def cut_off(self, peer: str, reason: str) -> None:
        """The connection from `peer` was cut off for `reason`: log it now, or count it for the interval's summary."""
        line = f"gRPC connection from {peer} cut off: {reason}"
        if self._budget.admit(line):
            LOGGER.warning("%s", line)

    def flush(self) -> None:
        """Log the count of cut-offs held back so far (the server stops)."""
        self._budget.flush()

    def _held_back(self, count: int, last: str) -> None:
        """Log how many cut-offs were held back since the last summary, and the last one."""
        LOGGER.warning(
            "... and %d more gRPC connections cut off (at most %d every %g s are logged); the last: %s",
            count,
            self._budget.burst,
            self._budget.interval_s,
            last,
        )
