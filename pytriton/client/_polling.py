"""The readiness loop of the sync and asyncio helpers, without IO: deadlines, pauses, which probe comes next.

`readiness_plan` is a generator that yields the steps of a wait, a `Probe` to run (the driver sends back whether
it succeeded) or a `Pause` to sleep, and raises PyTritonClientTimeoutError when the deadline passes. The blocking
driver (`_readiness.py`) and the asyncio one (`asyncio_utils.py`) only run the probes and sleep.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Generator, Optional, Union

from pytriton.client._state import ModelRef
from pytriton.client.exceptions import PyTritonClientTimeoutError

DEFAULT_SERVER_READY_TIMEOUT_S = 60.0
DEFAULT_MODEL_READY_TIMEOUT_S = 300.0
_FIRST_PAUSE_S = 0.05
_LONGEST_PAUSE_S = 1.0
# A probe is never given less time than this, so that a deadline of zero still allows one real check.
_SHORTEST_PROBE_TIMEOUT_S = 1.0


class Deadline:
    """A monotonic deadline with growing pauses between probes (50 ms doubling up to 1 s), or fixed ones.

    A timeout of None never expires (nvidia-pytriton 0.7's asyncio waits, which their caller bounds).
    """

    def __init__(self, timeout_s: Optional[float], pause_s: Optional[float] = None) -> None:
        """Start counting `timeout_s` seconds from now; `pause_s` fixes the pause between probes."""
        self.timeout_s = timeout_s
        self._end = math.inf if timeout_s is None else time.monotonic() + timeout_s
        self._pause = _FIRST_PAUSE_S if pause_s is None else pause_s
        self._fixed_pause = pause_s is not None

    def remaining(self) -> float:
        """Seconds left, never negative (infinite without a timeout)."""
        return max(0.0, self._end - time.monotonic())

    def remaining_or_none(self) -> Optional[float]:
        """Seconds left, or None without a timeout (as `asyncio.wait_for` takes it)."""
        return None if self.timeout_s is None else self.remaining()

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self.remaining() <= 0.0

    def probe_timeout(self) -> float:
        """The time one probe may take."""
        return max(self.remaining(), _SHORTEST_PROBE_TIMEOUT_S)

    def next_pause(self) -> float:
        """How long to wait before the next probe; growing pauses never pass the deadline."""
        pause = min(self._pause, self.remaining())
        if not self._fixed_pause:
            self._pause = min(self._pause * 2, _LONGEST_PAUSE_S)
        return pause

    def timeout_error(self, what: str) -> PyTritonClientTimeoutError:
        """The error for a wait for `what` that ran out of time.

        In 0.7's words: "Waiting for server to be ready timed out.", "Waiting for model m/<latest> to be ready
        timed out.".
        """
        return PyTritonClientTimeoutError(f"Waiting for {what} timed out.")


@dataclasses.dataclass(frozen=True)
class Probe:
    """Run one check: that the model version is ready, or without a model that the server is live and ready."""

    model: Optional[ModelRef] = None


@dataclasses.dataclass(frozen=True)
class Pause:
    """Sleep this long before the next step."""

    seconds: float


# Steps out, and back in after a Probe whether it succeeded (a probe that raised counts as a failure).
Plan = Generator[Union[Probe, Pause], Optional[bool], None]


def readiness_plan(deadline: Deadline, model: Optional[ModelRef] = None, *, server: bool = True) -> Plan:
    """Probe the server until it is ready, then (given a model) the model; `server=False` skips the server.

    Raises:
        PyTritonClientTimeoutError: once the deadline passes before a probe succeeds.
    """
    if server:
        yield from _until_ready(Probe(), "server to be ready", deadline)
    if model is not None:
        yield from _until_ready(Probe(model), f"{model.describe()} to be ready", deadline)


def _until_ready(probe: Probe, what: str, deadline: Deadline) -> Plan:
    """Run `probe` until it succeeds, pausing after each failure."""
    while not (yield probe):
        if deadline.expired():
            raise deadline.timeout_error(what)
        yield Pause(deadline.next_pause())
