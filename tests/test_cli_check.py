"""`pytriton check` on ports that are taken: it says what serves there, asking in Triton's protocols, never hanging."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Dict, Iterator, NamedTuple, Optional

import pytest

from pytriton import __version__
from tests.server_process import ROOT, WAIT_S, ServerProcess, free_port_env

LOOPBACK = ["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]


class Demo(NamedTuple):
    server: ServerProcess
    ports: Dict[str, int]  # http, grpc, metrics


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    """A pytriton server (the demo) on free loopback ports."""
    with ServerProcess.cli("demo", *LOOPBACK) as server:
        yield Demo(server, server.wait_started())
        assert "Traceback" not in server.output()  # being asked what it is did the server no harm


def check(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """`pytriton check ARGS` to its end (in `env`, by default the tests' own)."""
    return subprocess.run(
        [sys.executable, "-m", "pytriton", "check", *LOOPBACK, *args],
        env=env or free_port_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def port_lines(output: str) -> Dict[str, str]:
    """The line check prints for each port, by what the port is for: 'HTTP/REST', 'gRPC', 'metrics'."""
    rows: Dict[str, str] = {}
    for line in output.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name in ("HTTP/REST", "gRPC", "metrics"):
            rows[name] = rest.strip()
    return rows


def test_check_says_a_pytriton_server_serves_its_ports(demo: Demo) -> None:
    ports = demo.ports
    pid = demo.server.process.pid
    result = check(
        "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])
    )
    assert result.returncode == 1, result
    version = __version__
    assert port_lines(result.stdout) == {
        "HTTP/REST": f"127.0.0.1:{ports['http']}  not free: Triton HTTP/REST answers there "
        f"(server triton, version {version}; pytriton pid {pid})",
        "gRPC": f"127.0.0.1:{ports['grpc']}  not free: Triton gRPC answers there "
        f"(server triton, version {version}; pytriton pid {pid})",
        "metrics": f"127.0.0.1:{ports['metrics']}  not free: Triton metrics answer there (GET /metrics)",
    }


def test_check_asks_the_ports_itself_whatever_proxy_the_shell_names(demo: Demo) -> None:
    nowhere = "http://127.0.0.1:9"  # a proxy that is not there: asked through it, every port would look silent
    env = {name: value for name, value in free_port_env().items() if name.lower() != "no_proxy"}
    env.update({name: nowhere for name in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY")})
    result = check("--http-port", str(demo.ports["http"]), "--grpc-port", str(demo.ports["grpc"]), env=env)
    rows = port_lines(result.stdout)
    assert "Triton HTTP/REST answers there" in rows["HTTP/REST"], result
    assert "Triton gRPC answers there" in rows["gRPC"], result


def test_check_names_the_protocol_a_port_given_for_another_one_serves(demo: Demo) -> None:
    """The HTTP port given as the gRPC one, and so on round: each is asked in the other protocols too."""
    ports = demo.ports
    result = check(
        "--http-port", str(ports["grpc"]), "--grpc-port", str(ports["metrics"]), "--metrics-port", str(ports["http"])
    )
    assert result.returncode == 1, result
    rows = port_lines(result.stdout)
    assert "not free: Triton gRPC answers there" in rows["HTTP/REST"]
    assert "not free: Triton metrics answer there" in rows["gRPC"]
    assert "not free: Triton HTTP/REST answers there" in rows["metrics"]


def test_check_gives_up_on_a_port_that_never_answers() -> None:
    """Sockets that accept connections and never answer: each protocol's question waits a second at most."""
    with socket.socket() as silent, socket.socket() as other:
        for sock in (silent, other):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        http_port, grpc_port = silent.getsockname()[1], other.getsockname()[1]
        result = check("--http-port", str(http_port), "--grpc-port", str(grpc_port), "--allow-metrics", "false")
    assert result.returncode == 1, result
    assert port_lines(result.stdout) == {
        "HTTP/REST": f"127.0.0.1:{http_port}  not free: Address already in use (nothing answers there within 1 s)",
        "gRPC": f"127.0.0.1:{grpc_port}  not free: Address already in use (nothing answers there within 1 s)",
        "metrics": "disabled",
    }


def test_check_tells_an_http_server_that_is_not_triton() -> None:

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        result = check("--http-port", str(port), "--allow-grpc", "false", "--allow-metrics", "false")
    finally:
        server.shutdown()
        server.server_close()
    assert port_lines(result.stdout)["HTTP/REST"] == (
        f"127.0.0.1:{port}  not free: an HTTP server that is not Triton answers there (GET /v2: 404)"
    )


def test_check_says_whether_the_openai_sagemaker_and_vertex_ai_ports_are_free() -> None:
    # It checked HTTP, gRPC and metrics only: with the SageMaker port taken it said every port was free (exit 0),
    # and `pytriton serve` with the same options exited 2, `SageMaker cannot listen on ...`.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        others = ["--allow-http", "false", "--allow-metrics", "false"]  # gRPC's port is 0: any free port
        cases = {
            "OpenAI": check(*others, env=free_port_env(PYTRITON_OPENAI_PORT=port)),
            "Vertex AI": check(*others, env=free_port_env(AIP_MODE="PREDICTION", AIP_HTTP_PORT=port)),
            "SageMaker": check(*others, "--allow-sagemaker", "true", "--sagemaker-port", port),
        }
    for name, result in cases.items():
        assert result.returncode == 1, result
        assert f"  {name:<10} 127.0.0.1:{port}  not free: Address already in use\n" in result.stdout, result
    free = check("--allow-sagemaker", "true", "--sagemaker-port", "0", env=free_port_env(PYTRITON_OPENAI_PORT="0"))
    assert free.returncode == 0, free
    assert "  OpenAI     127.0.0.1:0  any free port\n  SageMaker  127.0.0.1:0  any free port\n" in free.stdout, free
