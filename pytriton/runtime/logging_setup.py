"""Applying log_verbose and log_file to the `pytriton` logger (never to the root logger)."""

from __future__ import annotations

import logging
import pathlib
from typing import Optional

LOGGER = logging.getLogger("pytriton")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(log_verbose: Optional[int], log_file: Optional[pathlib.Path]) -> None:
    """Verbose levels >= 1 log at DEBUG; log_file adds a file handler."""
    if log_verbose:
        LOGGER.setLevel(logging.DEBUG)
        LOGGER.warning("log_verbose=%d: verbose logging slows inference down", log_verbose)
    if log_file:
        path = str(pathlib.Path(log_file))
        if not any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in LOGGER.handlers):
            handler = logging.FileHandler(path)
            handler.setFormatter(logging.Formatter(_FORMAT))
            LOGGER.addHandler(handler)
