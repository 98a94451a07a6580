"""Waiting in a test for server-side state it gets no event for."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], bool], what: str = "the condition", timeout_s: float = 10.0) -> None:
    """Poll `condition` until it is true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.005)
