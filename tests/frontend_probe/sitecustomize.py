"""Loaded as a frontend process of a probed server starts (tests/test_frontends_bytes.py puts this folder first on
its PYTHONPATH): notes which thread pickles and rebuilds long BYTES arrays there, and holds those whose first element
is b"hold:NAME" until file NAME exists in the folder PROBE_ENV names.

A frontend is a fresh interpreter (never a fork of the test's process): a test can patch nothing there otherwise.
"""

from __future__ import annotations

import os

PROBE_ENV = "PYTRITON_TEST_LONG_OBJECTS_PROBE"
HOLD = b"hold:"
HOLD_S = 60.0


def _install(folder: str) -> None:
    import asyncio
    import threading
    import time
    from typing import Any

    from pytriton.core.process_instances import long_outputs

    pickled_pieces, loads = long_outputs.pickled_pieces, long_outputs.loads

    def noted(kind: str, first: Any) -> None:
        if type(first) is not bytes or not first.startswith(HOLD):
            return
        name = first[len(HOLD) :].decode()
        with open(os.path.join(folder, f"{name}.notes"), "a") as notes:
            notes.write(f"{kind} {threading.current_thread().name}\n")
        if asyncio._get_running_loop() is not None:
            return  # on the loop: holding it would hold for ever what the test waits for
        deadline = time.monotonic() + HOLD_S
        while not os.path.exists(os.path.join(folder, name)) and time.monotonic() < deadline:
            time.sleep(0.01)

    def pickled_noted(array: Any, plain: bool = False) -> Any:
        if array.size:
            noted("pickle", array.reshape(-1)[0])
        return pickled_pieces(array, plain)

    def loads_noted(data: Any) -> Any:
        value = loads(data)
        if type(value) is list and value:
            noted("rebuild", value[0])
        return value

    long_outputs.pickled_pieces = pickled_noted
    long_outputs.loads = loads_noted


if os.environ.get(PROBE_ENV):
    _install(os.environ[PROBE_ENV])
