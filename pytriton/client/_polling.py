"""Deadlines and pauses for the readiness loops of the sync and asyncio helpers."""

from __future__ import annotations

import time

DEFAULT_SERVER_READY_TIMEOUT_S = 60.0
DEFAULT_MODEL_READY_TIMEOUT_S = 300.0
_FIRST_PAUSE_S = 0.05
_LONGEST_PAUSE_S = 1.0
# A probe is never given less time than this, so that a deadline of zero still allows one real check.
_SHORTEST_PROBE_TIMEOUT_S = 1.0


class Deadline:
    """A monotonic deadline with growing pauses between probes (50 ms doubling up to 1 s)."""

    def __init__(self, timeout_s: float) -> None:
        """Start counting `timeout_s` seconds from now."""
        self.timeout_s = timeout_s
        self._end = time.monotonic() + timeout_s
        self._pause = _FIRST_PAUSE_S

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self.remaining() <= 0.0

    def probe_timeout(self) -> float:
        """The time one probe may take."""
        return max(self.remaining(), _SHORTEST_PROBE_TIMEOUT_S)

    def next_pause(self) -> float:
        """How long to wait before the next probe; the pauses grow, and never pass the deadline."""
        pause = min(self._pause, self.remaining())
        self._pause = min(self._pause * 2, _LONGEST_PAUSE_S)
        return pause
