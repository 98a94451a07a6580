"""Warnings about the connections the gRPC server cuts off, without letting a client flood the log with them.

A connection ended for what its client did (a connection error: a flood answered GOAWAY
ENHANCE_YOUR_CALM, a frame HTTP/2 forbids, a window overrun; no preface in time; one over
grpc_max_connections) is logged once, at WARNING, with its peer and the reason: the client learns it from
the GOAWAY, the operator from this line. A client may open connection after connection only to be cut
off: at most `burst` lines are logged per `interval_s`, and when the interval ends one line counts those
held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

LOGGER = logging.getLogger(__name__)

BURST = 10  # connections logged per interval
INTERVAL_S = 60.0


class CutoffLog:
    """The cut-off connections of one gRPC server; every method runs on the server's event loop."""

    def __init__(
        self, *, burst: int = BURST, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Log at most `burst` cut-offs per `interval_s`."""
        self._burst = burst
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = -interval_s
        self._logged = 0
        self._held_back = 0
        self._last_held_back = ""
        self._summary: Optional[asyncio.TimerHandle] = None

    def cut_off(self, peer: str, reason: str) -> None:
        """The connection from `peer` was cut off for `reason`: log it now, or count it for the interval's summary."""
        line = f"gRPC connection from {peer} cut off: {reason}"
        now = self._clock()
        if now - self._window_start >= self._interval_s:
            self._window_start = now
            self._logged = 0
        if self._logged < self._burst:
            self._logged += 1
            LOGGER.warning("%s", line)
            return
        self._held_back += 1
        self._last_held_back = line
        if self._summary is None:
            delay_s = max(self._window_start + self._interval_s - now, 0.0)
            self._summary = asyncio.get_running_loop().call_later(delay_s, self._summarize)

    def flush(self) -> None:
        """Log the count of cut-offs held back so far (the server stops)."""
        if self._summary is not None:
            self._summary.cancel()
        self._summarize()

    def _summarize(self) -> None:
        """Log how many cut-offs were held back since the last summary, and the last one."""
        self._summary = None
        if not self._held_back:
            return
        LOGGER.warning(
            "... and %d more gRPC connections cut off (at most %d every %g s are logged); the last: %s",
            self._held_back,
            self._burst,
            self._interval_s,
            self._last_held_back,
        )
        self._held_back = 0
