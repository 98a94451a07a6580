"""Where the `pytriton` logger's records go: log_verbose, log_file, and stderr when nothing else is set up.

The root logger is never touched. An application that configured logging (a handler on the root or
the `pytriton` logger) keeps its setup; one that did not still sees the server's log, as uvicorn's
and tritonserver's users do: INFO and above on stderr, in the format of `log_format` ("default").
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import Optional

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STDERR_HANDLER_NAME = "pytriton-stderr"


def configure_logging(log_verbose: Optional[int], log_file: Optional[pathlib.Path]) -> None:
    """log_file adds a file handler, which gets INFO and above at least; verbose levels >= 1 log at DEBUG.

    Without a log file, and unless logging is set up, records go to stderr (see `use_default_logging`).
    """
    if log_file:
        path = os.path.abspath(log_file)
        if not any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in LOGGER.handlers):
            try:
                handler = logging.FileHandler(path)
            except OSError as error:  # a missing directory, a read-only one: a bad option, not a crash
                raise PyTritonValidationError(
                    f"TritonConfig.log_file: cannot open {path}: {error.strerror or error}"
                ) from None
            handler.setFormatter(logging.Formatter(_FORMAT))
            LOGGER.addHandler(handler)
        _log_info()
    use_default_logging()
    if log_verbose:
        LOGGER.setLevel(logging.DEBUG)
        LOGGER.warning("log_verbose=%d: verbose logging slows inference down", log_verbose)


def use_default_logging() -> None:
    """Unless logging is set up (a handler on the root or `pytriton` logger), log INFO and above to stderr.

    Should the application configure the root logger later, this handler stands aside (its records
    reach the root's handlers), so nothing is logged twice.
    """
    if LOGGER.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(STDERR_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(lambda _record: not logging.getLogger().handlers)
    LOGGER.addHandler(handler)
    _log_info()


def _log_info() -> None:
    """Let INFO records through unless a level was chosen for the `pytriton` logger."""
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
