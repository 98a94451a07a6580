"""What a RemoteTriton's process adds to the server besides models: custom metrics (and custom routes).

The RemoteTriton runs in a process of its own (tests/remote_extensions.py): in the server's own process the
registry of custom metrics is the server's, and nothing would have to travel.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator, List

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.server_process import ROOT
from tests.test_custom_metrics import VALUES, assert_counted, scrape, send_all, value

WAIT_S = 30.0


def _own_model(triton: Triton) -> None:
    io = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("own", lambda requests: [{"x": r["x"]} for r in requests], io, io, config=ModelConfig(batching=False))


class Remote:
    """The RemoteTriton process and its commands (tests/remote_extensions.py)."""

    def __init__(self, url: str, *name: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.remote_extensions", url, *name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
        )
        assert self.read() == "BOUND"

    def read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def command(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    with running_triton(_own_model) as triton:
        yield triton


@pytest.fixture(scope="module")
def remote(server: Triton) -> Iterator[Remote]:
    process = Remote(f"127.0.0.1:{server.http_port}")
    try:
        yield process
    finally:
        process.close()


# -- custom metrics ------------------------------------------------------------------------------------------


def test_metrics_of_a_remote_callable_are_exact_on_the_servers_metrics_port(server: Triton, remote: Remote) -> None:
    values: List[float] = VALUES * 3
    send_all(server, "remote_counting", values, parallel=4)
    assert_counted(scrape(server), "test_remote", "remote_counting", values)
    send_all(server, "remote_counting", [1.0])
    assert_counted(scrape(server), "test_remote", "remote_counting", [*values, 1.0])


def test_metrics_made_outside_remote_callables_reach_the_server_with_the_next_answer(
    server: Triton, remote: Remote
) -> None:
    before = value(scrape(server), "test_remote_outside", "test_remote_outside")
    assert before >= 1  # the update made before binding came with the binding
    assert remote.command("bump") == "DONE"
    send_all(server, "remote_counting", [1.0])
    assert value(scrape(server), "test_remote_outside", "test_remote_outside") == before + 1


def test_metrics_made_outside_callables_reach_the_server_when_the_remote_closes(server: Triton) -> None:
    process = Remote(f"127.0.0.1:{server.http_port}", "closing")
    try:
        before = value(scrape(server), "test_remote_outside", "test_remote_outside")
        assert process.command("bump") == "DONE"
        assert process.command("close") == "CLOSED"
    finally:
        process.close()
    assert value(scrape(server), "test_remote_outside", "test_remote_outside") == before + 1
