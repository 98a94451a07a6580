"""A frontend process's log records, handled by the hub's loggers: the server logs as one process does.

A frontend process is a fresh interpreter: the logging the application set up (its handlers, formats, levels, a
file of its own) is the hub's alone. Logged there, a frontend's records went to stderr in pytriton's default format
(to `log_file` through a handler of its own), past the application's handlers. Once its link to the hub is up, a
frontend sends each record of the `pytriton` loggers to the hub (LOG), which hands it to the logger of its name
there, as if logged there; before, and once the hub is gone, it logs as it did.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Dict, List

from pytriton.runtime.frontends.protocol import LOG

_PLAIN = (str, int, float, bool, type(None))


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
    """Sends a frontend's records to the hub (`post`), from any thread; logs with `fallback` while it cannot."""

    def __init__(
        self,
        post: Callable[[Any], None],
        closed: Callable[[], bool],
        loop: asyncio.AbstractEventLoop,
        fallback: List[logging.Handler],
    ) -> None:
        """Post (LOG, fields) with `post` on `loop`; `closed()`: the hub is gone, `fallback` handles the records."""
        super().__init__()
        self._post = post
        self._closed = closed
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the frontend's loop
        self._fallback = fallback
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        """Send the record to the hub, or log it here when the hub is gone."""
        if self._closed():
            self._here(record)
            return
        try:
            head = (LOG, record_fields(record, self._formatter))
            if threading.get_ident() == self._loop_thread:
                self._post(head)
            else:
                self._loop.call_soon_threadsafe(self._post_if_open, head)
        except RuntimeError:  # the loop has closed: this process ends
            self._here(record)
        except Exception:  # noqa: BLE001 - a handler reports its own failures, as logging's do
            self.handleError(record)

    def _post_if_open(self, head: Any) -> None:
        if not self._closed():
            self._post(head)

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


def handle_frontend_record(fields: Dict[str, Any]) -> None:
    """A frontend's record, handled by the hub's logger of its name, as if logged here (its levels apply)."""
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
