"""What a connection waits for from its client, and until when: one timer follows the deadline (both servers)."""

from __future__ import annotations

import asyncio
import math
from typing import Callable, Optional

APP = 0  # waiting for nothing from the client (the server is answering): no deadline; other phases are the server's


class PhaseDeadline:
    """The phase a connection is in and its deadline.

    A connection moves through the phases on every request, so the deadline moves without touching
    the timer: the timer is re-armed only when it would fire too late, and when it fires early it
    follows the deadline. `expired(phase)` is called once the deadline of `phase` has passed. Phases
    are small integers each server names for itself (what it waits for); APP (0) waits for nothing.
    """

    __slots__ = ("_deadline", "_expired", "_loop", "_timer", "_timer_at", "phase")

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[int], None]) -> None:
        """A deadline in phase APP (none) that calls `expired(phase)` when one passes."""
        self._loop = loop
        self._expired = expired
        self.phase = APP
        self._deadline = math.inf
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = 0.0

    def enter(self, phase: int, timeout_s: float) -> None:
        """Wait for the client in `phase` for at most `timeout_s` (0: no limit)."""
        self.phase = phase
        self._deadline = self._loop.time() + timeout_s if timeout_s else math.inf
        if timeout_s and (self._timer is None or self._deadline < self._timer_at):
            self._arm()

    def cancel(self) -> None:
        """Stop watching: no deadline applies any more."""
        self.phase = APP
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """(Re)arm the timer for the current deadline."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self._deadline
        self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def _on_timer(self) -> None:
        """The timer fired: report the phase if its deadline passed, else follow the deadline."""
        self._timer = None
        if self.phase == APP:
            return
        if self._loop.time() < self._deadline:
            if self._deadline != math.inf:
                self._arm()
            return
        self._expired(self.phase)
