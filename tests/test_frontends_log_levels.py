"""The hub's loggers' levels, watched for changes and followed by a frontend process (log_records.py)."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from pytriton.runtime.frontends.log_records import LevelWatch, follow_levels, logger_levels

NAME = "tests.frontends-log-levels"


@pytest.fixture
def loggers() -> Iterator[None]:
    """The root's, `pytriton`'s and this module's loggers' levels, restored after the test."""
    names = [None, "pytriton", NAME, f"{NAME}.child"]
    levels = [logging.getLogger(name).level for name in names]
    yield
    for name, level in zip(names, levels):
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("loggers")
def test_the_generation_moves_when_any_logger_s_level_changes_and_only_then() -> None:
    watch = LevelWatch(f"{NAME}.probe")  # its own: the servers' watch is left alone
    start = watch.check()
    assert watch.check() == start
    logging.getLogger(NAME).setLevel(logging.DEBUG)  # a logger of the application's, set after the start
    assert watch.check() == start + 1 and watch.levels[NAME] == logging.DEBUG
    logging.getLogger(NAME).setLevel(logging.DEBUG)  # set again to the same: nothing for the frontends
    assert watch.check() == start + 1
    logging.getLogger("pytriton").setLevel(logging.WARNING)
    assert watch.check() == start + 2 and watch.levels["pytriton"] == logging.WARNING
    logging.getLogger(NAME).setLevel(logging.NOTSET)  # unset: its parent's level applies again
    assert watch.check() == start + 3 and NAME not in watch.levels
    assert watch.levels == logger_levels()


@pytest.mark.usefixtures("loggers")
def test_a_frontend_unsets_a_level_the_hub_no_longer_sets_and_keeps_its_own() -> None:
    child = logging.getLogger(f"{NAME}.child")
    child.setLevel(logging.ERROR)  # set in the frontend itself, not by the hub: left as it is
    before = follow_levels({"": logging.INFO, "pytriton": logging.NOTSET, NAME: logging.DEBUG}, {})
    assert logging.getLogger().level == logging.INFO and logging.getLogger(NAME).level == logging.DEBUG
    assert logging.getLogger("pytriton").getEffectiveLevel() == logging.INFO  # the hub's is unset: the root's
    follow_levels({"": logging.WARNING, "pytriton": logging.DEBUG}, before)
    assert logging.getLogger(NAME).level == logging.NOTSET
    assert logging.getLogger(NAME).getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("pytriton").level == logging.DEBUG
    assert child.level == logging.ERROR
