"""The models the server-wide budget tests bind (test_receive_budget.py, test_inflation_budget.py)."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import numpy as np


def first_values(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's INPUT_1 rows cut to their first value (a small answer to a large request)."""
    return [{"OUTPUT_1": r["INPUT_1"][:, :1].copy()} for r in requests]


class Gate:
    """A model that keeps each request (and what it holds of a budget) until released; answers `first_values`."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        self.entered.set()
        self.release.wait(self.hold_s)
        return first_values(requests)
