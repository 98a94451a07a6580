"""Logging, at the server, why a model's requests failed, without letting a failing model flood the log.

The client gets the error message; the operator gets the cause: the traceback of what the callable
raised (the other process's, when it ran in one), or the output check that refused what it returned.
A model may fail every request it gets: each model logs at most `burst` failures per `interval_s`,
and when the interval ends, one line counts those it held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from pytriton.core.errors import InferenceError, Status
from pytriton.exceptions import PyTritonUnrecoverableError

LOGGER = logging.getLogger("pytriton.model")

BURST = 10  # failures logged per model and interval
INTERVAL_S = 60.0


class FailureLog:
    """The failure log of one model version; every method runs on the engine's event loop."""

    def __init__(
        self,
        model: str,
        *,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Log the failures of `model` (a name such as "'m' version 1"), `burst` per `interval_s` at most."""
        self._model = model
        self._burst = burst
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = -interval_s
        self._logged = 0
        self._held_back = 0
        self._last_held_back = ""
        self._summary: Optional[asyncio.TimerHandle] = None

    def callable_raised(self, error: BaseException, requests: int) -> None:
        """The callable raised `error`, failing `requests` requests: log it with its traceback at ERROR.

        An error from another process carries that process's formatted traceback as `remote_traceback`;
        it is logged instead of the local one, which shows only where the error was re-raised here.
        """
        unrecoverable = isinstance(error, PyTritonUnrecoverableError)
        summary = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if not unrecoverable and not self._admit(summary):
            return
        remote = getattr(error, "remote_traceback", None)
        from_elsewhere = isinstance(remote, str) and bool(remote)
        LOGGER.error(
            "model %s: the inference callable raised %s (%s failed)%s",
            self._model,
            summary,
            _requests(requests),
            "\n" + str(remote).rstrip("\n") if from_elsewhere else "",
            exc_info=None if from_elsewhere else error,
        )

    def outputs_refused(self, error: InferenceError, requests: int) -> None:
        """What the callable returned failed PyTriton's output checks for `requests` requests: log why.

        Only the model's faults (INTERNAL) are logged; a request stopped by the server's stop or by its
        client is not a fault.
        """
        if error.status is not Status.INTERNAL or not self._admit(error.message):
            return
        LOGGER.error(
            "model %s: the inference callable's outputs were refused (%s failed): %s",
            self._model,
            _requests(requests),
            error.message,
        )

    def flush(self) -> None:
        """Log the count of failures held back so far (the server stops)."""
        if self._summary is not None:
            self._summary.cancel()
        self._summarize()

    def _admit(self, summary: str) -> bool:
        """Whether a failure may be logged now; one that may not is counted for the interval's summary."""
        now = self._clock()
        if now - self._window_start >= self._interval_s:
            self._window_start = now
            self._logged = 0
        if self._logged < self._burst:
            self._logged += 1
            return True
        self._held_back += 1
        self._last_held_back = summary
        if self._summary is None:
            delay_s = max(self._window_start + self._interval_s - now, 0.0)
            self._summary = asyncio.get_running_loop().call_later(delay_s, self._summarize)
        return False

    def _summarize(self) -> None:
        """Log how many failures were held back since the last summary, and the last one's cause."""
        self._summary = None
        if not self._held_back:
            return
        LOGGER.error(
            "model %s: ... and %d more failures not logged (at most %d every %g s are); the last: %s",
            self._model,
            self._held_back,
            self._burst,
            self._interval_s,
            self._last_held_back,
        )
        self._held_back = 0


def _requests(count: int) -> str:
    """'1 request' or 'n requests'."""
    return f"{count} request" if count == 1 else f"{count} requests"
