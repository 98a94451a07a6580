"""Bench targets: how to start each server, wait for readiness, measure it, and stop it."""

from __future__ import annotations

import compileall
import contextlib
import dataclasses
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional

BENCH_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
MODEL_SERVER = BENCH_DIR / "model_server.py"
ASGI_ECHO = BENCH_DIR / "asgi_echo.py"
GRPC_ECHO = BENCH_DIR / "grpc_echo.py"
NVIDIA_RUN = pathlib.Path(os.environ.get("BENCH_NVIDIA_RUN", "/tmp/nvidia-pytriton/run"))
ACCESS_TOKEN = "bench-token"  # both servers guard APIs with an access token, as nvidia-pytriton 0.7 does
# The APIs that token guards on the bench's servers: not statistics and shared memory, which perf_analyzer
# uses without one over gRPC (its -H headers go out over HTTP only).
RESTRICTED_ENDPOINTS = "model-repository,trace,logging"
FRONTENDS_ENV = "PYTRITON_FRONTENDS"  # how many frontend processes this project's server runs (see --frontends)
MODELS = ("identity", "batching", "simple")


@dataclasses.dataclass(frozen=True)
class Target:
    """One server implementation to measure."""

    name: str  # "ours", "nvidia", "baseline", "asgi"
    argv_prefix: List[str]  # interpreter command (the script and ports are appended)
    script: pathlib.Path
    env: Dict[str, str]
    grpc: bool  # whether it is expected to serve gRPC at all
    models: bool  # whether it serves the bench models (the ASGI echo serves only the identity echo)
    label: str = ""
    http: bool = True  # whether it serves the HTTP workloads (the gRPC echoes answer only the readiness check)


def byte_compile(package: pathlib.Path) -> None:
    """Compile a package's sources to bytecode, as pip does when it installs a wheel.

    Startup is measured for an installed package: without this, an environment that sets
    PYTHONDONTWRITEBYTECODE (this one does) compiles every module from source at each start.
    """
    compileall.compile_dir(str(package), quiet=1)


def ours_target(frontends: Optional[int] = None) -> Target:
    """This project's pytriton (byte-compiled), run by the interpreter running the bench.

    With `frontends`, the server runs that many frontend processes (PYTRITON_FRONTENDS); more than one
    makes a target of its own, `ours-fN`.
    """
    byte_compile(REPO_ROOT / "pytriton")
    # This checkout's package, not the one the interpreter has installed (an editable install of another worktree).
    own = {"PYTHONPATH": str(REPO_ROOT)}
    if frontends is None:
        return Target("ours", [sys.executable], MODEL_SERVER, own, grpc=True, models=True, label="this checkout")
    name = "ours" if frontends == 1 else f"ours-f{frontends}"
    env = {**own, FRONTENDS_ENV: str(frontends)}
    label = f"this checkout, {FRONTENDS_ENV}={frontends}"
    return Target(name, [sys.executable], MODEL_SERVER, env, grpc=True, models=True, label=label)


def nvidia_target() -> Optional[Target]:
    """NVIDIA's PyTriton, when its environment wrapper is installed."""
    if not os.access(NVIDIA_RUN, os.X_OK):
        return None
    return Target("nvidia", [str(NVIDIA_RUN), "python"], MODEL_SERVER, {}, grpc=True, models=True, label="NVIDIA 0.7")


def asgi_target() -> Target:
    """The bare uvicorn+httptools+uvloop echo: the HTTP ceiling."""
    return Target("asgi", [sys.executable], ASGI_ECHO, {}, grpc=False, models=False, label="bare ASGI echo")


def asgi_pytriton_target() -> Target:
    """The same echo app on this project's HTTP server: what the HTTP layer alone costs here."""
    env = {"BENCH_ASGI_SERVER": "pytriton"}
    return Target("asgi-pt", [sys.executable], ASGI_ECHO, env, grpc=False, models=False, label="echo on our server")


# gRPC echo targets: name -> (grpc_echo.py --server, the module it needs, label).
GRPC_ECHOES = {
    "grpc-aio": ("aio", "grpc", "echo on grpc.aio"),
    "grpc-h2": ("h2", "h2", "echo on h2"),
    "grpclib": ("grpclib", "grpclib", "echo on grpclib"),
    "grpc-pt": ("pytriton", "pytriton", "echo on our HTTP/2 server"),
}


def grpc_echo_target(name: str) -> Target:
    """A bare gRPC ModelInfer echo on one gRPC stack (bench/grpc_echo.py): what that stack alone costs."""
    stack, _, label = GRPC_ECHOES[name]
    env = {"BENCH_GRPC_SERVER": stack}
    return Target(name, [sys.executable], GRPC_ECHO, env, grpc=True, models=False, label=label, http=False)


def baseline_target(ref: str, workdir: pathlib.Path) -> Target:
    """This project's code at git ref `ref`, exported read-only with `git archive` into `workdir`."""
    dest = workdir / "baseline"
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", ref, "pytriton"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    byte_compile(dest / "pytriton")
    rev = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    env = {"PYTHONPATH": str(dest)}
    return Target("baseline", [sys.executable], MODEL_SERVER, env, grpc=True, models=True, label=f"{ref} ({rev})")


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to clients (Linux's ip_local_port_range; 32768 elsewhere)."""
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> List[int]:
    """`count` consecutive free loopback ports from 20000 up to the client ports, far from Triton's 8000-8002.

    Not among the ports the kernel gives clients: a client polling a port nobody listens on yet can be given
    that very port and connect to itself (TCP's simultaneous open), then read its own request back as the
    answer; a memory row once failed so.
    """
    top = max(_ephemeral_low(), 20000 + 1000)
    for _ in range(200):
        base = random.randrange(20000, top - count)
        ports = list(range(base, base + count))
        if all(_port_free(port) for port in ports):
            return ports
    raise RuntimeError("no free ports found")


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_get(url: str, timeout: float = 2.0) -> Optional[int]:
    """The HTTP status of GET url, or None when nothing answers."""
    request = urllib.request.Request(url, headers={"triton-access-token": ACCESS_TOKEN})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return None


def port_answers(port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connect to 127.0.0.1:port succeeds."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


class ServerProcess:
    """A running server, started in its own process group (pinned with taskset when asked)."""

    def __init__(self, target: Target, cpus: Optional[str], log_dir: pathlib.Path) -> None:
        self.target = target
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.log_path = log_dir / f"{target.name}-{self.http_port}.log"
        argv = [*target.argv_prefix, str(target.script)]
        argv += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        argv += ["--metrics-port", str(self.metrics_port)]
        if cpus and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(target.env)
        env["BENCH_ACCESS_TOKEN"] = ACCESS_TOKEN
        env["BENCH_RESTRICTED_ENDPOINTS"] = RESTRICTED_ENDPOINTS
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = open(self.log_path, "wb")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            cwd=tempfile.gettempdir(),  # never the repo root: NVIDIA's interpreter must not import our package
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.startup_s: Optional[float] = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout: float) -> float:
        """Poll /v2/health/ready (and each model's ready) until 200; return seconds since process start."""
        urls = [f"{self.base_url}/v2/health/ready"]
        if self.target.models:
            urls += [f"{self.base_url}/v2/models/{model}/ready" for model in MODELS]
        deadline = self.started_at + timeout
        pending = list(urls)
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.target.name} exited with {self.proc.returncode}: {self.log_tail()}")
            while pending and http_get(pending[0], timeout=0.5) == 200:
                pending.pop(0)
            if not pending:
                self.startup_s = time.perf_counter() - self.started_at
                return self.startup_s
            time.sleep(0.005)  # fine-grained: startup is reported in milliseconds
        raise TimeoutError(f"{self.target.name} not ready after {timeout:.0f}s: {self.log_tail()}")

    def grpc_available(self) -> bool:
        """Whether the gRPC port answers a tritonclient liveness call."""
        if not self.target.grpc or not port_answers(self.grpc_port):
            return False
        try:
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
            try:
                return bool(client.is_server_live(client_timeout=3.0))
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return False

    def rss(self) -> Dict[str, float]:
        """RSS (and PSS, where readable) of the process tree, in MiB."""
        return tree_memory(self.proc.pid)

    def cpu_seconds(self) -> float:
        """CPU time (user and system) the process tree has used so far."""
        return sum(_cpu_seconds(pid) for pid in [self.proc.pid, *descendants(self.proc.pid)])

    def log_tail(self, lines: int = 15) -> str:
        """The end of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL it and any descendant that left the group."""
        pids: List[int] = []
        if self.proc.poll() is None:
            pids = descendants(self.proc.pid)
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        _remove_leftover_segments([self.proc.pid, *pids])  # a server that ended by itself leaves them too
        self._log.close()


def _remove_leftover_segments(pids: List[int]) -> None:
    """Remove the shared memory NVIDIA's PyTriton left in /dev/shm ("pytrtion<pid>-...", its spelling).

    Its processes, killed with their group, leave their tensor stores' segments (20-70 MB each): a day of bench
    runs left 1.9 GB of this machine's memory there. This project's server uses memfd segments, which go with it.
    """
    for pid in pids:
        for path in pathlib.Path("/dev/shm").glob(f"pytrtion{pid}-*"):
            with contextlib.suppress(OSError):
                path.unlink()


def _signal_group(pgid: int, sig: int) -> None:
    """Signal a process group, ignoring a group already gone."""
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def descendants(root: int) -> List[int]:
    """Pids of every live descendant of `root` (from /proc)."""
    children: Dict[int, List[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def tree_memory(root: int) -> Dict[str, float]:
    """Summed RSS and PSS (MiB) of `root` and its descendants: psutil when installed, else /proc."""
    pids = [root, *descendants(root)]
    rss = pss = 0.0
    try:
        import psutil
    except ImportError:
        psutil = None
    for pid in pids:
        if psutil is not None:
            try:
                rss += psutil.Process(pid).memory_info().rss / 2**20
            except psutil.Error:
                continue
        else:
            rss += proc_kib(pid, "status", "VmRSS:") / 1024
        pss += proc_kib(pid, "smaps_rollup", "Pss:") / 1024
    return {"rss_mib": round(rss, 1), "pss_mib": round(pss, 1), "processes": len(pids)}


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process (fields 14 and 15 of /proc/PID/stat), 0 when it is gone."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_kib(pid: int, name: str, key: str) -> float:
    """A 'Key:  N kB' field of /proc/PID/NAME, 0 when unreadable."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(key):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0
