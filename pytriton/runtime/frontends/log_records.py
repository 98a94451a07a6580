"""A frontend process's log records, handled by the hub's loggers: the server logs as one process does.

A frontend process is a fresh interpreter: the logging the application set up (its handlers, formats, levels, a
file of its own) is the hub's alone. Logged there, a frontend's records went to stderr in pytriton's default format
(to `log_file` through a handler of its own), past the application's handlers; those of other loggers (asyncio's
"Exception in callback", a chat template's own logger) went to stderr bare, through `logging.lastResort`, and
those below WARNING nowhere. Once its link to the hub is up, a frontend sends each record of the `pytriton` loggers
to the hub (LOG), which hands it to the logger of its name there, as if logged there; before, and once the hub is
gone, it logs as it did. Other loggers' records reach the hub the same way, from a handler on the frontend's root
logger: at most `OTHERS_BURST` a second, each text cut at `OTHERS_CHARS`, and a line (pytriton's) counts those held
back, so that a library logging in a loop floods neither the channel nor the hub's log.

A frontend's loggers take the levels of the hub's (`logger_levels`, `pytriton`'s among them), and again whenever
one changes there (`LevelWatch`, `follow_levels`): the runtime log settings (`/v2/logging`, gRPC `LogSettings`)
set the `pytriton` logger's level, and so does an application, at any time. Which records of a level pass (log_info,
log_warning, log_error) and their format are the hub's to apply, as to its own records: a frontend makes a record
only where the hub's logger of its name would, and the hub decides the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Dict, List, Optional

from pytriton.core.logs.log_budget import LogBudget
from pytriton.core.logs.traceback_text import cut_lines
from pytriton.runtime.frontends.protocol import LOG
from pytriton.runtime.logging_setup import HUB_HANDLER_NAME

LOGGER = logging.getLogger("pytriton")

_PLAIN = (str, int, float, bool, type(None))
# Records of other loggers sent to the hub: at most this many a second for each frontend, each text field cut here.
OTHERS_BURST = 100
OTHERS_CHARS = 16 * 1024


def record_fields(record: logging.LogRecord, formatter: logging.Formatter) -> Dict[str, Any]:
    """What crosses of a record: its message merged with its arguments, its traceback as text, plain values."""
    fields = {}
    for key, value in record.__dict__.items():
        fields[key] = value if isinstance(value, _PLAIN) else str(value)
    fields["msg"] = record.getMessage()
    fields["args"] = None
    fields["exc_info"] = None
    if record.exc_info and not record.exc_text:
        fields["exc_text"] = formatter.formatException(record.exc_info)
    return fields


class HubLogHandler(logging.Handler):
    """Sends a frontend's records to the hub (`post`), from any thread; logs with `fallback` while it cannot.

    With a `budget`, records are admitted by it on the loop (those held back are counted there) and their long
    texts cut: another library's records, which nothing else bounds.
    """

    def __init__(
        self,
        post: Callable[[Any], None],
        closed: Callable[[], bool],
        loop: asyncio.AbstractEventLoop,
        fallback: List[logging.Handler],
        budget: Optional[LogBudget] = None,
    ) -> None:
        """Post (LOG, fields) with `post` on `loop`; `closed()`: the hub is gone, `fallback` handles the records."""
        super().__init__()
        self._post = post
        self._closed = closed
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the frontend's loop
        self._fallback = fallback
        self._formatter = logging.Formatter()
        self._budget = budget

    def emit(self, record: logging.LogRecord) -> None:
        """Send the record to the hub, or log it here when the hub is gone."""
        if self._closed():
            self._here(record)
            return
        try:
            on_loop = threading.get_ident() == self._loop_thread
            if on_loop and self._budget is not None and not self._budget.admit(_line(record.name, record.msg)):
                return
            fields = record_fields(record, self._formatter)
            if self._budget is not None:
                _cut_fields(fields)
            if on_loop:
                self._post((LOG, fields))
            elif self._budget is not None:
                self._loop.call_soon_threadsafe(self._admit_and_post, fields)
            else:
                self._loop.call_soon_threadsafe(self._post_if_open, (LOG, fields))
        except RuntimeError:  # the loop has closed: this process ends
            self._here(record)
        except Exception:  # noqa: BLE001 - a handler reports its own failures, as logging's do
            self.handleError(record)

    def _post_if_open(self, head: Any) -> None:
        if not self._closed():
            self._post(head)

    def _admit_and_post(self, fields: Dict[str, Any]) -> None:
        """On the loop: a record of another thread, sent if the budget admits it."""
        assert self._budget is not None
        if self._budget.admit(_line(str(fields.get("name")), fields.get("msg"))):
            self._post_if_open((LOG, fields))

    def _here(self, record: logging.LogRecord) -> None:
        for handler in self._fallback:
            if record.levelno >= handler.level:
                handler.handle(record)


def send_to_hub(
    logger: logging.Logger, post: Callable[[Any], None], closed: Callable[[], bool], loop: asyncio.AbstractEventLoop
) -> HubLogHandler:
    """Send `logger`'s records (the frontend's `pytriton`) to the hub; its handlers so far log them while it cannot."""
    before = list(logger.handlers)
    handler = HubLogHandler(post, closed, loop, before)
    for old in before:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False  # the hub's loggers pass them up to the application's handlers
    return handler


def send_others_to_hub(
    post: Callable[[Any], None],
    closed: Callable[[], bool],
    loop: asyncio.AbstractEventLoop,
    frontend: int,
) -> HubLogHandler:
    """Send the records of the frontend's other loggers (those that reach its root logger) to the hub.

    Once the hub is gone, records go where they went before (`logging.lastResort`: stderr, WARNING and above).
    """
    root = logging.getLogger()
    fallback = list(root.handlers) or ([logging.lastResort] if logging.lastResort is not None else [])

    def held_back(count: int, last: str) -> None:
        LOGGER.warning(
            "frontend %d: %d more log %s of other loggers not sent to the hub (at most %d a second are); the last: %s",
            frontend,
            count,
            "record" if count == 1 else "records",
            OTHERS_BURST,
            last,
        )

    budget = LogBudget(held_back, burst=OTHERS_BURST, interval_s=1.0)
    handler = HubLogHandler(post, closed, loop, fallback, budget)
    handler.set_name(HUB_HANDLER_NAME)
    root.addHandler(handler)
    return handler


def logger_levels() -> Dict[str, int]:
    """The levels set on this process's loggers (the root's under "", `pytriton`'s even unset): frontends take them."""
    levels = {"": logging.getLogger().level, "pytriton": logging.getLogger("pytriton").level}
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels


class LevelWatch:
    """This process's loggers' levels, and a generation that moves when one changes (the frontends compare it).

    Walking every logger (hundreds, with a large library imported) at each check would cost each forwarded request
    that much; `logging` clears each logger's cache of `isEnabledFor` answers whenever any level changes
    (`Logger.setLevel`, `logging.disable`, CPython 3.7 and later), so a cache kept filled on one logger of its own
    says whether they may have: only then are they walked and compared. Where loggers keep no such cache, they are
    walked each time. One watch serves every server of the process (`LEVELS`): a second one's check would fill the
    probe's cache and hide a change from the first.
    """

    def __init__(self, probe: str) -> None:
        """Take the levels now (generation 0); `probe`: the name of the logger whose cache is watched."""
        self._probe = logging.getLogger(probe)
        self._lock = threading.Lock()  # servers' loops in several threads check at once
        self.generation = 0
        self.levels = self._take()

    def check(self) -> int:
        """The generation, moved if a level changed since the last check."""
        with self._lock:
            cache = getattr(self._probe, "_cache", None)
            if isinstance(cache, dict) and cache:
                return self.generation  # no level changed since the probe's cache was filled
            levels = self._take()
            if levels != self.levels:
                self.levels = levels
                self.generation += 1
            return self.generation

    def _take(self) -> Dict[str, int]:
        # Filled before the walk: a change made during it empties the cache again, and is seen at the next check.
        self._probe.isEnabledFor(logging.CRITICAL)
        return logger_levels()


LEVELS = LevelWatch("pytriton.frontends-level-watch")


def follow_levels(levels: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    """Set the hub's levels (`logger_levels`) on this process's loggers; those set from `before` and not now, unset.

    Returns:
        The levels set, the next call's `before`.
    """
    for name in before:
        if name and name not in levels:
            logging.getLogger(name).setLevel(logging.NOTSET)
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    return levels


def handle_frontend_record(fields: Dict[str, Any]) -> None:
    """A frontend's record, handled by the hub's logger of its name, as if logged here (its levels apply)."""
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


def _cut_fields(fields: Dict[str, Any]) -> None:
    """Cut a record's long texts: its traceback to its first and last lines, each text to OTHERS_CHARS."""
    exc_text = fields.get("exc_text")
    if isinstance(exc_text, str):
        fields["exc_text"] = cut_lines(exc_text)
    for key, value in fields.items():
        if isinstance(value, str) and len(value) > OTHERS_CHARS:
            fields[key] = f"{value[:OTHERS_CHARS]}... ({len(value) - OTHERS_CHARS} more characters)"


def _line(name: str, msg: Any) -> str:
    """A record, in the line that counts those held back: its logger and its message's first 200 characters."""
    text = msg if isinstance(msg, str) else repr(msg)
    return f"{name}: {text[:200]}"
