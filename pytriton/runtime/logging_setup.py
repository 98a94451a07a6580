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
from typing import Dict, NamedTuple, Optional

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STDERR_HANDLER_NAME = "pytriton-stderr"
# A frontend process's handler on its root logger, which sends other loggers' records to the hub
# (runtime/frontends/log_records.py): not a handler the application set up.
HUB_HANDLER_NAME = "pytriton-hub"
# Whether the `pytriton` logger's INFO level is this module's default (no one chose a level for it).
_default_level = False
# The servers that log to each log file (its absolute path) now: its handler goes when the last of them stops.
_log_file_users: Dict[str, int] = {}
# The servers with log_verbose now, and the `pytriton` logger's level before the first: it comes back after the last.
_verbose_users = 0
_level_before_verbose = logging.NOTSET


class LogUse(NamedTuple):
    """What a server's options added to the `pytriton` logger, given back by `release_logging` when it stops."""

    log_file: Optional[str]  # the log file's absolute path
    verbose: bool


def configure_logging(log_verbose: Optional[int], log_file: Optional[pathlib.Path], warn: bool = True) -> LogUse:
    """log_file adds a file handler, which gets INFO and above at least; verbose levels >= 1 log at DEBUG.

    Without a log file, and unless logging is set up, records go to stderr (see `use_default_logging`).
    `warn`: say that a verbose level slows inference down (the server's own process does; its frontend
    processes, logging as it does, do not say it again).

    Returns:
        What was added, for `release_logging` once the server stops.
    """
    global _verbose_users, _level_before_verbose
    path: Optional[str] = None
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
        _log_file_users[path] = _log_file_users.get(path, 0) + 1
        _log_info()
    use_default_logging()
    if log_verbose:
        if _verbose_users == 0:
            _level_before_verbose = LOGGER.level
        _verbose_users += 1
        LOGGER.setLevel(logging.DEBUG)
        if warn:
            LOGGER.warning("log_verbose=%d: verbose logging slows inference down", log_verbose)
    return LogUse(path, bool(log_verbose))


def release_logging(use: LogUse) -> None:
    """A server stopped: its log file's handler goes (closed) and its verbose level ends, unless another uses them."""
    global _verbose_users
    if use.verbose and _verbose_users > 0:
        _verbose_users -= 1
        if _verbose_users == 0 and LOGGER.level == logging.DEBUG:  # a level set since stays
            LOGGER.setLevel(_level_before_verbose)
    _release_log_file(use.log_file)


def _release_log_file(path: Optional[str]) -> None:
    """A server that logged to `path` stopped: its file handler goes (closed) unless another server logs there."""
    if path is None or path not in _log_file_users:
        return
    _log_file_users[path] -= 1
    if _log_file_users[path] > 0:
        return
    del _log_file_users[path]
    for handler in [h for h in LOGGER.handlers if isinstance(h, logging.FileHandler) and h.baseFilename == path]:
        LOGGER.removeHandler(handler)
        handler.close()


def use_default_logging() -> None:
    """Unless logging is set up (a handler on the root or `pytriton` logger), log INFO and above to stderr.

    Should the application configure the root logger later, this handler stands aside (its records
    reach the root's handlers), so nothing is logged twice; once this is called again (as the server
    starts and stops) the default INFO level goes too, and the application's levels apply.
    """
    if LOGGER.hasHandlers():
        _stand_aside_for_the_root()
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(STDERR_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(lambda _record: not _root_handlers())
    LOGGER.addHandler(handler)
    _log_info()


def _stand_aside_for_the_root() -> None:
    """The application configured the root logger after the stderr handler came: drop it, and its INFO level."""
    global _default_level
    ours = [handler for handler in LOGGER.handlers if handler.get_name() == STDERR_HANDLER_NAME]
    if not ours or not _root_handlers():
        return
    for handler in ours:
        LOGGER.removeHandler(handler)
    # A level someone set since (the server's runtime log settings among them), or one a log file wants, stays.
    if _default_level and LOGGER.level == logging.INFO and not LOGGER.handlers:
        LOGGER.setLevel(logging.NOTSET)
    _default_level = False


def _root_handlers() -> bool:
    """Whether the application set up a handler on the root logger."""
    handlers = logging.getLogger().handlers
    return bool(handlers) and any(handler.get_name() != HUB_HANDLER_NAME for handler in handlers)


def _log_info() -> None:
    """Let INFO records through unless a level was chosen for the `pytriton` logger."""
    global _default_level
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
        _default_level = True
