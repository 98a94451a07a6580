"""A server in a subprocess, as an operator runs it: its log read line by line, real signals, its exit status."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30.0
# The startup line: "pytriton <version> serving <models> on <urls> (pid <pid>)".
STARTUP = re.compile(r"pytriton \S+ serving (?P<models>.*) on (?P<urls>\S.*) \(pid (?P<pid>\d+)\)$", re.M)


def free_port_env(**extra: str) -> Dict[str, str]:
    """The environment of a server: every port picked by the system, pytriton importable, output unbuffered."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTRITON_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        PYTRITON_TRITON_CONFIG_HTTP_PORT="0",
        PYTRITON_TRITON_CONFIG_GRPC_PORT="0",
        PYTRITON_TRITON_CONFIG_METRICS_PORT="0",
    )
    env.update(extra)
    return env


class ServerProcess:
    """A subprocess whose stdout and stderr are read, line by line, by a thread of this process."""

    def __init__(
        self, args: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None
    ) -> None:
        self.process = subprocess.Popen(
            list(args),
            cwd=str(cwd or ROOT),
            env=env if env is not None else free_port_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: List[str] = []
        self._unread: queue.Queue[Optional[str]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def script(cls, tmp_path: Path, source: str, *args: str, env: Optional[Dict[str, str]] = None) -> ServerProcess:
        """Run `source` (dedented) as a Python script."""
        path = tmp_path / "server.py"
        path.write_text(textwrap.dedent(source))
        return cls([sys.executable, str(path), *args], env=env, cwd=tmp_path)

    @classmethod
    def cli(cls, *args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None) -> ServerProcess:
        """Run the `pytriton` command."""
        return cls([sys.executable, "-m", "pytriton", *args], env=env, cwd=cwd)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self._unread.put(line.rstrip("\n"))
        self._unread.put(None)

    def wait_for(self, pattern: str, timeout: float = WAIT_S) -> re.Match[str]:
        """The next line (after those already waited for) that `pattern` finds something in."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._unread.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r} within {timeout} s:\n{self.output()}")
            if line is None:
                pytest.fail(f"exited with {self.process.wait()} before a line matching {pattern!r}:\n{self.output()}")
            match = compiled.search(line)
            if match:
                return match

    def wait_started(self) -> Dict[str, int]:
        """Wait for the startup line; return the ports it names: http, grpc, metrics."""
        urls = self.wait_for(STARTUP.pattern).group("urls")
        ports: Dict[str, int] = {}
        for url in urls.split(", "):
            port = int(re.search(r":(\d+)", url.split("://", 1)[1]).group(1))  # type: ignore[union-attr]
            ports["metrics" if url.endswith("/metrics") else url.split("://")[0]] = port
        return ports

    def signal(self, sig: signal.Signals) -> None:
        """Send a signal."""
        self.process.send_signal(sig)

    def wait(self, timeout: float = WAIT_S) -> int:
        """The exit status, once the process ended and its output was read; kill it after `timeout`."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {timeout} s:\n{self.output()}")
        self._reader.join(WAIT_S)
        return code

    def kill(self) -> None:
        """Kill the process if it still runs, and release its pipe."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(WAIT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def output(self) -> str:
        """Everything the process wrote so far."""
        return "\n".join(self.lines)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.kill()


def handles_sigterm(pid: int) -> bool:
    """Whether a process has a handler of its own for SIGTERM (Linux: SigCgt in /proc/PID/status).

    Python catches only SIGINT by itself, as a KeyboardInterrupt; pytriton's serve() sets handlers for
    SIGINT, then SIGTERM. Once SIGTERM has one, either signal stops the server gracefully; before, SIGINT
    raises KeyboardInterrupt wherever the main thread is, and SIGTERM kills the process.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:
        pass
    return False


def wait_handles_signals(process: subprocess.Popen[str], timeout: float = WAIT_S) -> None:
    """Wait until `process` is in serve() (see handles_sigterm): a signal sent from then on stops it gracefully."""
    deadline = time.monotonic() + timeout
    while not handles_sigterm(process.pid):
        if process.poll() is not None:
            pytest.fail(f"exited with {process.returncode} before it handled SIGTERM")
        if time.monotonic() > deadline:
            pytest.fail(f"no handler for SIGTERM within {timeout} s: not in serve()")
        time.sleep(0.01)


def namespaces(*unshare: str, root: bool = True) -> List[str]:
    """`unshare OPTIONS` for any user: root makes the namespaces itself; another user first makes a user namespace.

    That namespace owns the network, mount and PID namespaces unshare makes, where the kernel lets users make one
    (Debian, Fedora, Ubuntu up to 23.10 by default), and the user is root in it (`root`: to set up a loopback or a
    mount) or stays itself (its uid, which a server's per-user socket names).
    """
    if os.geteuid() == 0:
        return list(unshare)
    return [*unshare, "--map-root-user" if root else "--map-current-user"]


def start_script(directory: Path, text: str, prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
    """Run `text` as a Python script (pytriton importable, stdout piped), behind `prefix` (e.g. unshare)."""
    script = directory / "server.py"
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([*prefix, sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)


def stop_script(server: subprocess.Popen[str]) -> None:
    """SIGINT, then SIGKILL after 30 s; its output pipe closed."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    assert server.stdout is not None
    server.stdout.close()
