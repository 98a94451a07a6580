"""A fleet for tests: `pytriton serve` replicas as subprocesses behind a real HAProxy, on loopback ports.

HAProxy comes from Debian's packages (`apt-get install -y haproxy`; `.ci/run` installs it). Its runtime
API (a Unix socket, `show stat`) tells when a replica is UP or DOWN and how many sessions each served.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import pytest

from tests.server_process import STARTUP

ROOT = Path(__file__).parent.parent
INSTALL_HINT = "haproxy is not installed: run `apt-get install -y haproxy` (as .ci/run and the README do)"


def free_ports(count: int) -> List[int]:
    """Ports on 127.0.0.1 for a server started later to bind; the kernel hands them to nobody else for 60 s.

    A port merely bound and released could be taken meanwhile by any bind to port 0 or outgoing connection
    (another test's server, a client), and the server would then fail with 'Address already in use'. Each
    of these was listened on, and one connection to it closed from the listening side: that end waits in
    TIME_WAIT for 60 s, during which Linux gives the port to no bind to port 0 and no outgoing connection,
    while a server that sets SO_REUSEADDR (pytriton, HAProxy, tritonserver) binds it at once.
    """
    return [_reserved_port() for _ in range(count)]


def _reserved_port() -> int:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # first: the TIME_WAIT is the listening side's, on `port`
            client.recv(1)  # the close reached the client before it closes in turn
    return port


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll `condition` until it is true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def http_ready(port: int) -> bool:
    """Whether /v2/health/ready answers 200 on 127.0.0.1:port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as response:
            return response.status == 200  # type: ignore[no-any-return]
    except OSError:
        return False


class Replica:
    """One `python -m pytriton serve` process on fixed HTTP and gRPC ports, restartable on the same ports."""

    def __init__(
        self,
        name: str,
        target: str,
        http_port: int,
        grpc_port: int,
        log_dir: Path,
        options: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.name = name
        self.env = dict(env or {})
        self.target = target
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.options = list(options)
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.log = Path(log_dir) / f"{name}.log"

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "pytriton",
            "serve",
            self.target,
            "--http-address",
            "127.0.0.1",
            "--grpc-address",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--allow-metrics",
            "false",
            *self.options,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        # The startup line is logged once the server handles SIGTERM; readiness comes a moment earlier.
        wait_until(
            lambda: (
                self._alive_or_fail()
                and STARTUP.search(self.log.read_bytes()[self._log_start :].decode(errors="replace")) is not None
            ),
            30,
            f"{self.name} to serve",
        )
        assert http_ready(self.http_port)

    def _alive_or_fail(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
        return True

    def terminate(self, timeout_s: float = 30) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit status."""
        self.sigterm()
        return self.wait(timeout_s)

    def sigterm(self) -> None:
        """SIGTERM, without waiting for the exit (a second one stops the replica at once)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def exited(self) -> bool:
        assert self.process is not None
        return self.process.poll() is not None

    def wait(self, timeout_s: float = 30) -> int:
        """The exit status, once the process exits."""
        assert self.process is not None
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class HAProxy:
    """An haproxy process running a configuration; `servers()` reads its runtime API."""

    def __init__(self, config: str, directory: Path) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            pytest.fail(INSTALL_HINT)
        self.socket_path = directory / "haproxy.sock"
        path = directory / "haproxy.cfg"
        path.write_text(config.replace("@SOCKET@", str(self.socket_path)))
        check = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = directory / "haproxy.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([binary, "-db", "-f", str(path)], stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.socket_path.exists, 10, "haproxy's runtime API socket")

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode()
                chunks.append(chunk)

    def servers(self) -> Dict[str, Dict[str, str]]:
        """`backend/server` -> that server's row of `show stat` (status, stot: sessions served, ...)."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(line for line in text.splitlines() if line)
        return {f"{row['pxname']}/{row['svname']}": row for row in rows if row["svname"] not in ("FRONTEND", "BACKEND")}

    def status(self, backend: str, server: str) -> str:
        return self.servers()[f"{backend}/{server}"]["status"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
