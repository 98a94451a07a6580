"""The token `pytriton serve` generates: the log says how to get it, `pytriton token` prints it, no log shows it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.http_helpers import request
from tests.server_process import ROOT, WAIT_S, ServerProcess, free_port_env

HINT = (
    r"INFO pytriton: the restricted APIs \((?P<apis>[^)]*)\) need the access token generated for this run, in the "
    r"triton-access-token header: `pytriton token --port (?P<port>\d+)` prints it \(to this user, on this host\); "
    r"PYTRITON_ACCESS_TOKEN \(or --access-token\) sets one of your own$"
)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text("def bind(triton):\n    pass\n")
    return path


def token(*args: str) -> subprocess.CompletedProcess[str]:
    """`pytriton token ARGS` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "pytriton", "token", *args],
        env=free_port_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def stats_status(port: int, headers: Dict[str, str]) -> int:
    return request(port, "GET", "/v2/models/stats", headers=headers)[0]


def test_serve_says_how_to_get_the_token_it_generated_and_never_logs_it(models: Path) -> None:
    with ServerProcess.cli("serve", str(models), "--allow-metrics", "false") as server:
        ports = server.wait_started()
        hint = server.wait_for(HINT)
        assert hint.group("apis") == "shared-memory, model-repository, statistics, trace, logging"
        assert int(hint.group("port")) == ports["http"]
        answers: List[str] = []
        for port in (ports["http"], ports["grpc"]):  # either port of the server finds it
            result = token("--port", str(port))
            assert (result.returncode, result.stderr) == (0, ""), result
            answers.append(result.stdout)
        secret = answers[0].strip()
        assert answers == [secret + "\n"] * 2 and len(secret) >= 32
        assert stats_status(ports["http"], {}) == 403
        assert stats_status(ports["http"], {"triton-access-token": secret}) == 200
        server.signal(signal.SIGINT)
        assert server.wait() == 0
    assert secret not in server.output()


def test_a_token_the_operator_gave_gets_no_hint(models: Path) -> None:
    env = free_port_env(PYTRITON_ACCESS_TOKEN="given-by-the-operator")
    with ServerProcess.cli("serve", str(models), "--allow-metrics", "false", env=env) as server:
        ports = server.wait_started()
        assert stats_status(ports["http"], {"triton-access-token": "given-by-the-operator"}) == 200
        assert token("--port", str(ports["http"])).stdout == "given-by-the-operator\n"  # the server's user may read it
        server.signal(signal.SIGINT)
        assert server.wait() == 0
    assert "access token" not in server.output() and "given-by-the-operator" not in server.output()


def test_no_token_no_hint(models: Path) -> None:
    with ServerProcess.cli("serve", str(models), "--allow-metrics", "false", "--restricted-endpoints", "") as server:
        ports = server.wait_started()
        assert stats_status(ports["http"], {}) == 200
        result = token("--port", str(ports["http"]))
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith(f"pytriton token: error: the server with port {ports['http']} shows this ")
        server.signal(signal.SIGINT)
        assert server.wait() == 0
    assert "access token" not in server.output()


def test_token_with_no_server_on_the_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # a port no pytriton server has
    result = token("--port", str(port))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"pytriton token: error: no pytriton server of this user on this host has port {port} (HTTP or gRPC)"
    ]
