"""At most so many log lines per interval for one source, and one line counting those held back.

A failing model or an abusive client can cause a line per request or per connection; the operator
needs the first few and a count, not a flooded log.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

BURST = 10  # lines per interval
INTERVAL_S = 60.0


class LogBudget:
    """Admits `burst` lines per `interval_s`; every method runs on the event loop.

    Lines held back are counted, and when their interval ends (or at `flush`) `held_back(count, last)`
    is called once with how many there were and the last of them.
    """

    def __init__(
        self,
        held_back: Callable[[int, str], None],
        *,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """A budget reporting what it held back through `held_back`."""
        self.burst = burst
        self.interval_s = interval_s
        self._held_back_line = held_back
        self._clock = clock
        self._window_start = -interval_s
        self._logged = 0
        self._held_back = 0
        self._last_held_back = ""
        self._summary: Optional[asyncio.TimerHandle] = None

    def admit(self, line: str) -> bool:
        """Whether `line` may be logged now; one that may not is counted for the interval's summary."""
        now = self._clock()
        if now - self._window_start >= self.interval_s:
            self._window_start = now
            self._logged = 0
        if self._logged < self.burst:
            self._logged += 1
            return True
        self._held_back += 1
        self._last_held_back = line
        if self._summary is None:
            delay_s = max(self._window_start + self.interval_s - now, 0.0)
            self._summary = asyncio.get_running_loop().call_later(delay_s, self._summarize)
        return False

    def flush(self) -> None:
        """Report what is held back so far (the server stops)."""
        if self._summary is not None:
            self._summary.cancel()
        self._summarize()

    def _summarize(self) -> None:
        self._summary = None
        if self._held_back:
            count, self._held_back = self._held_back, 0
            self._held_back_line(count, self._last_held_back)
