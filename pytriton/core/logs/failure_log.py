"""Logging, at the server, why a model's requests failed, without letting a failing model flood the log.

The client gets the error message; the operator gets the cause: the traceback of what the callable
raised (the other process's, when it ran in one), or the output check that refused what it returned.
A model may fail every request it gets: each model logs at most `burst` failures per `interval_s`,
and when the interval ends, one line counts those it held back. An output the callable returns that the
config does not declare fails nothing (without `strict` it is left out); it is logged once per output name.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Set

from pytriton.core.errors import BatchNotRun, InferenceError, OutputsNotTaken, Status, exception_text, utf8_safe
from pytriton.core.logs.log_budget import BURST, INTERVAL_S, LogBudget
from pytriton.core.logs.traceback_text import bounded_traceback, cut_lines, is_deep
from pytriton.exceptions import PyTritonUnrecoverableError

LOGGER = logging.getLogger("pytriton.model")

# Of a failure's message, and of each line of its traceback, this many characters are logged, then how many more
# there were: a callable raising an error of a 10 MB message logged 20 MB a failure (the line and the traceback).
# Its client still gets the whole message, as Triton sends it. Of the traceback's lines, the first and last are
# logged (core/logs/traceback_text.py): one of a 100,000-frame deep recursion had 300,000.
LOGGED_CHARS = 16 * 1024


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
        self._budget = LogBudget(self._held_back, burst=burst, interval_s=interval_s, clock=clock)
        self._undeclared: Set[str] = set()
        self._unreturned: Set[str] = set()

    def callable_raised(self, error: BaseException, requests: int) -> None:
        """The callable raised `error`, failing `requests` requests: log it with its traceback at ERROR.

        An error from another process carries that process's formatted traceback as `remote_traceback`;
        it is logged instead of the local one, which shows only where the error was re-raised here.
        """
        unrecoverable = isinstance(error, PyTritonUnrecoverableError)
        text = exception_text(error)  # its str() may raise: the request still gets its answer
        summary = f"{type(error).__name__}: {text}" if text else type(error).__name__
        if not unrecoverable and not self._budget.admit(summary):
            return
        remote = getattr(error, "remote_traceback", None)
        trace = remote if isinstance(remote, str) and remote else None
        safe_summary = utf8_safe(summary)
        if trace is None and (safe_summary != summary or len(summary) > LOGGED_CHARS or is_deep(error)):
            # Lone surrogates in the message: a handler writing UTF-8 (a file, a log shipper) fails on the record
            # ("--- Logging error ---"), so the traceback goes as escaped text, as the client's message does; a
            # long message, to be cut; a deep stack's, to keep its first and last frames (it may have 100,000).
            trace = bounded_traceback(error)
        if trace is not None and len(trace) > LOGGED_CHARS:
            trace = "\n".join(_cut(line) for line in cut_lines(trace).split("\n"))
        safe_summary = _cut(safe_summary)
        LOGGER.error(
            "model %s: the inference callable raised %s (%s failed)%s",
            self._model,
            safe_summary,
            _requests(requests),
            "\n" + utf8_safe(trace).rstrip("\n") if trace is not None else "",
            exc_info=error if trace is None else None,
        )

    def batch_not_run(self, error: BatchNotRun, requests: int) -> None:
        """An instance could not take a batch of `requests` requests (the callable never ran): log why, no traceback.

        The message names the instance and the cause (e.g. "can't start new thread"); where it was raised says
        nothing more.
        """
        if not self._budget.admit(str(error)):
            return
        LOGGER.error("model %s: a batch was not run (%s failed): %s", self._model, _requests(requests), error)

    def outputs_not_taken(self, error: OutputsNotTaken, requests: int) -> None:
        """The server could not take what the callable returned for `requests` requests (it ran): log why.

        As for a batch not run, the message names the instance and the cause; no traceback.
        """
        if not self._budget.admit(str(error)):
            return
        LOGGER.error(
            "model %s: the server could not take a batch's outputs (%s failed): %s",
            self._model,
            _requests(requests),
            error,
        )

    def outputs_refused(self, error: InferenceError, requests: int) -> None:
        """What the callable returned failed PyTriton's output checks for `requests` requests: log why.

        Only the model's faults (INTERNAL) are logged; a request stopped by the server's stop or by its
        client is not a fault.
        """
        if error.status is not Status.INTERNAL or not self._budget.admit(error.message):
            return
        LOGGER.error(
            "model %s: the inference callable's outputs were refused (%s failed): %s",
            self._model,
            _requests(requests),
            error.message,
        )

    def undeclared_output(self, name: str) -> None:
        """The callable returned output `name`, which the config does not declare: WARNING, the first time only.

        It is left out of the responses (what NVIDIA's PyTriton does, silently); a client that expects it sees
        nothing, so the operator is told once where it went, not on every request.
        """
        if name in self._undeclared:
            return
        self._undeclared.add(name)
        LOGGER.warning(
            "model %s: the inference callable returned output '%s', which the model config does not declare; "
            "it is left out of the responses (declare it in `outputs`, or bind with strict=True to refuse it). "
            "Logged once for this output.",
            self._model,
            name,
        )

    def unreturned_output(self, name: str) -> None:
        """A request asked for output `name`, which the callable did not return: WARNING, the first time only.

        It is left out of the response (what NVIDIA's PyTriton and Triton do: HTTP 200 without it), so the
        operator is told once, not on every request.
        """
        if name in self._unreturned:
            return
        self._unreturned.add(name)
        LOGGER.warning(
            "model %s: a request asked for output '%s', which the inference callable did not return; it is left "
            "out of the response, as Triton leaves it out. Logged once for this output.",
            self._model,
            name,
        )

    def flush(self) -> None:
        """Log the count of failures held back so far (the server stops)."""
        self._budget.flush()

    def _held_back(self, count: int, last: str) -> None:
        """Log how many failures were held back since the last summary, and the last one's cause."""
        LOGGER.error(
            "model %s: ... and %d more %s not logged (at most %d every %g s are); the last: %s",
            self._model,
            count,
            "failure" if count == 1 else "failures",
            self._budget.burst,
            self._budget.interval_s,
            last,
        )


def _cut(text: str) -> str:
    """`text`, or its first LOGGED_CHARS characters and how many more there were."""
    if len(text) <= LOGGED_CHARS:
        return text
    return f"{text[:LOGGED_CHARS]}... ({len(text) - LOGGED_CHARS} more characters)"


def _requests(count: int) -> str:
    """'1 request' or 'n requests'."""
    return f"{count} request" if count == 1 else f"{count} requests"
