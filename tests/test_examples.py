"""Run every example: its server as a subprocess on free ports, then its client against it."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from tests.server_process import ServerProcess, wait_handles_signals

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
READY = re.compile(r"^READY http=(\d+) grpc=(\d+|None)$")
START_TIMEOUT_S = 30
CLIENT_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30

HTTP = "http://127.0.0.1:{http}"
GRPC = "grpc://127.0.0.1:{grpc}"
BOTH = [["--url", HTTP], ["--url", GRPC]]

NO_TORCH = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed: the torch_mlp example serves a torch.nn.Module (pip install torch)",
)

# example folder -> the argument lists of each client run
CASES = [
    pytest.param("identity", BOTH, id="identity"),
    pytest.param("add_sub", BOTH, id="add_sub"),
    pytest.param("add_sub_optional", BOTH, id="add_sub_optional"),
    pytest.param("multiple_models", BOTH, id="multiple_models"),
    pytest.param("parameters_headers", BOTH, id="parameters_headers"),
    pytest.param("streaming", BOTH, id="streaming"),
    pytest.param("openai_chat", [["--url", HTTP]], id="openai_chat"),
    pytest.param("multi_instance", BOTH, id="multi_instance"),
    pytest.param("async_model", BOTH, id="async_model"),
    pytest.param("process_instances", BOTH, id="process_instances"),
    pytest.param("ensemble_image", BOTH, id="ensemble_image"),
    pytest.param("triton_client_models", BOTH, id="triton_client_models"),
    pytest.param("torch_mlp", BOTH, id="torch_mlp", marks=NO_TORCH),
]


def _env() -> Dict[str, str]:
    """The environment of an example: free ports for every endpoint, unbuffered output."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTRITON_TRITON_CONFIG_")}
    env.update(
        PYTRITON_TRITON_CONFIG_HTTP_PORT="0",
        PYTRITON_TRITON_CONFIG_GRPC_PORT="0",
        PYTRITON_TRITON_CONFIG_METRICS_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def _start(folder: Path) -> ServerProcess:
    """An example's server.py in a subprocess, on free ports."""
    return ServerProcess([sys.executable, "server.py"], env=_env(), cwd=folder)


def _wait_ready(server: ServerProcess) -> Dict[str, Optional[int]]:
    """Wait for the READY line; return the ports it reports."""
    match = server.wait_for(READY.pattern, timeout=START_TIMEOUT_S)
    grpc = match.group(2)
    return {"http": int(match.group(1)), "grpc": None if grpc == "None" else int(grpc)}


def _stop(server: ServerProcess) -> int:
    """Stop with SIGINT (as Ctrl+C does), once serve() handles it, and return the exit code."""
    if server.process.poll() is None:
        wait_handles_signals(server.process)  # READY is printed before serve(): a SIGINT then is a KeyboardInterrupt
        server.signal(signal.SIGINT)
    return server.wait(STOP_TIMEOUT_S)


def _run(
    folder: Path, script: str, args: Sequence[str], server: Optional[ServerProcess] = None
) -> subprocess.CompletedProcess[str]:
    """Run an example's client; one still running after CLIENT_TIMEOUT_S fails the test with its threads' stacks.

    (faulthandler writes them at SIGABRT: a client hung once in a CI suite, on Python 3.9, after its fifth
    response of six, and a kill alone told nothing of where.)
    """
    command = [sys.executable, "-X", "faulthandler", script, *args]
    process = subprocess.Popen(
        command, cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            stdout, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(
            f"client {args} still ran after {CLIENT_TIMEOUT_S} s\n--- client stdout\n{stdout}--- client stderr "
            f"(its threads at SIGABRT)\n{stderr}--- server\n{server.output() if server else ''}"
        )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize(("name", "client_runs"), CASES)
def test_example(name: str, client_runs: List[List[str]]) -> None:
    folder = EXAMPLES / name
    server = _start(folder)
    try:
        ports = _wait_ready(server)
        assert ports["grpc"] is not None, f"{name}: the server reports no gRPC port"
        for template in client_runs:
            args = [arg.format(**ports) for arg in template]
            result = _run(folder, "client.py", args, server)
            assert result.returncode == 0, (
                f"{name} client {args} exited with {result.returncode}\n--- client stdout\n{result.stdout}"
                f"--- client stderr\n{result.stderr}--- server\n{server.output()}"
            )
            assert result.stdout.rstrip().endswith("OK"), result.stdout
    finally:
        code = _stop(server)
        server.kill()
    assert code == 0, f"{name} server exited with {code}:\n{server.output()}"
    assert "Traceback" not in server.output(), server.output()


def test_background_mode_notebook() -> None:
    result = _run(EXAMPLES / "background_mode", "notebook.py", [])
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "product: [[2.5, 5.0, 7.5]]" in result.stdout
    assert "stopped; alive: False" in result.stdout


def test_remote_triton_binds_a_model_into_a_running_server_and_leaves_with_it() -> None:
    folder = EXAMPLES / "remote_triton"
    server = _start(folder)
    remote: Optional[subprocess.Popen[str]] = None
    try:
        ports = _wait_ready(server)
        url = HTTP.format(**ports)
        remote = subprocess.Popen(
            [sys.executable, "remote.py", "--url", url], cwd=folder, env=_env(), stdout=subprocess.PIPE, text=True
        )
        assert remote.stdout is not None
        assert remote.stdout.readline().strip() == "BOUND"
        for client_url in (url, GRPC.format(**ports)):
            result = _run(folder, "client.py", ["--url", client_url], server)
            assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n--- server\n{server.output()}"
        wait_handles_signals(remote)  # BOUND is printed before serve()
        remote.send_signal(signal.SIGINT)
        assert remote.wait(timeout=STOP_TIMEOUT_S) == 0
        import tritonclient.http as httpclient

        with httpclient.InferenceServerClient(url.removeprefix("http://")) as client:
            assert not client.is_model_ready("AddSub")
            assert client.is_model_ready("Identity")
    finally:
        if remote is not None:
            remote.kill()
            remote.wait()
            assert remote.stdout is not None
            remote.stdout.close()
        code = _stop(server)
        server.kill()
    assert code == 0, server.output()
    assert "Traceback" not in server.output(), server.output()


def test_every_example_is_tested() -> None:
    tested = {param.values[0] for param in CASES} | {"background_mode", "remote_triton"}
    folders = {path.name for path in EXAMPLES.iterdir() if path.is_dir() and not path.name.startswith((".", "_"))}
    assert folders == tested
    for folder in folders:
        assert (EXAMPLES / folder / "README.md").is_file(), f"{folder} has no README.md"
