"""A stand-in for a `DaemonThreads` pool whose jobs wait for the test: what the loop does meanwhile is shown in order.

Off-loop work (shared-memory copies, response compression) is shown to leave the event loop free without timing
it: the job waits in its own thread for `gate`, other clients are answered, then the gate opens.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pytest
import tritonclient.http as httpclient

from pytriton.triton import Triton


class GatedThreads:
    """Stands for a module's pool: each job given waits in its own thread for `gate`."""

    def __init__(self) -> None:
        self.submitted = threading.Event()
        self.gate = threading.Event()

    def submit(self, job: Callable[[], None]) -> None:
        self.submitted.set()

        def gated() -> None:
            self.gate.wait()
            job()

        threading.Thread(target=gated, daemon=True).start()


def gated_pool(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> Iterator[GatedThreads]:
    """Replace `module.name` (a pool) with a GatedThreads for a test; its gate opens after it (a failed test's
    job ends)."""
    gated = GatedThreads()
    monkeypatch.setattr(module, name, gated)
    yield gated
    gated.gate.set()


def another_client_answered(triton: Triton) -> bool:
    """Another client's request (a health check) to `triton`, answered meanwhile by its loop."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton.http_port}")
    try:
        return bool(client.is_server_ready())
    finally:
        client.close()
