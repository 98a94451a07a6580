"""The `pytriton` command line: help, check, serving a model file, and the exit status an orchestrator acts on."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from pytriton.cli import StartupError, build_parser, load_target, main
from pytriton.triton_config import TritonConfig
from tests.fleet import free_ports
from tests.http_helpers import post_json, request
from tests.server_process import ROOT, WAIT_S, ServerProcess, free_port_env

MODELS = """
import numpy as np
from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.model_config import Tensor

def double(requests):
    if requests[0]["x"].ravel()[0] < 0:
        raise PyTritonUnrecoverableError("the device is gone")
    return [{"y": r["x"] * 2} for r in requests]

def bind(triton):
    tensor = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("double", double, inputs=tensor, outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])
    triton.bind("pair", [double, double], inputs=tensor, outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])

def bad_shape(triton):
    triton.bind("broken", double, inputs=[Tensor(name="x", dtype=np.float32, shape=(None,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])
"""


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def run_cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """`pytriton ARGS` to its end, in `cwd`, with `env` added: exit status, stdout, stderr."""
    return subprocess.run(
        [sys.executable, "-m", "pytriton", *args],
        env=free_port_env(**env),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], prefix: str, message: str) -> None:
    """Exit status 2, and one line on stderr: `prefix` then a text holding `message`."""
    assert result.returncode == 2, result
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(prefix), result.stderr
    assert message in result.stderr


def _body(value: float) -> dict:  # type: ignore[type-arg]
    return {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [value, 2]}]}


def test_help_lists_every_config_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--http-port", "--grpc-port", "--cache-config", "--exit-timeout-secs", "--log-verbose"):
        assert option in text


def test_serve_logs_one_startup_line_with_the_models_then_stops_on_sigint(models: Path) -> None:
    with ServerProcess.cli("serve", f"{models}:bind", "--allow-metrics", "false") as server:
        line = server.wait_for(r"INFO pytriton: pytriton \S+ serving (.*) on (.*) \(pid \d+\)$")
        assert line.group(1) == "double v1 (1 instance), pair v1 (2 instances)"
        assert line.group(2).startswith("http://0.0.0.0:") and ", grpc://0.0.0.0:" in line.group(2)
        port = int(line.group(2).split(",")[0].rsplit(":", 1)[1])
        status, document = post_json(port, "/v2/models/double/infer", _body(1))
        assert status == 200 and document["outputs"][0]["data"] == [2, 4]
        server.signal(signal.SIGINT)
        assert server.wait() == 0
    assert len([line for line in server.lines if " serving " in line]) == 1, server.output()


def test_demo_logs_one_startup_line_with_its_model() -> None:
    with ServerProcess.cli("demo", "--allow-metrics", "false") as server:
        line = server.wait_for(r"INFO pytriton: pytriton \S+ serving (.*) on (.*) \(pid \d+\)$")
        assert line.group(1) == "add_sub v1 (1 instance)"
        assert line.group(2).startswith("http://0.0.0.0:") and ", grpc://0.0.0.0:" in line.group(2)
        server.signal(signal.SIGINT)
        assert server.wait() == 0
    assert len([line for line in server.lines if " serving " in line]) == 1, server.output()


@pytest.mark.parametrize(
    ("args", "env", "pids"),
    [(["--frontends", "2"], {"PYTRITON_FRONTENDS": "3"}, 1), ([], {"PYTRITON_FRONTENDS": "3"}, 2)],
)
def test_serve_runs_the_frontend_processes_its_option_asks_for_else_its_environment_s(
    models: Path, args: List[str], env: Dict[str, str], pids: int
) -> None:
    with ServerProcess.cli(
        "serve", f"{models}:bind", "--allow-metrics", "false", *args, env=free_port_env(**env)
    ) as server:
        line = server.wait_for(
            r"INFO pytriton: (a frontend process serves|frontend processes serve) HTTP and gRPC \((pids?) ([\d, ]+)\)"
        )
        assert len(line.group(3).split(", ")) == pids
        # "frontend processes ... (pids 4242)" read wrong for the one frontend process of --frontends 2
        assert line.group(1, 2) == (
            ("a frontend process serves", "pid") if pids == 1 else ("frontend processes serve", "pids")
        )
        port = server.wait_started()["http"]
        status, document = post_json(port, "/v2/models/double/infer", _body(1))
        assert status == 200 and document["outputs"][0]["data"] == [2, 4]
        server.signal(signal.SIGINT)
        assert server.wait() == 0


def test_serve_exits_1_after_an_unrecoverable_model_error(models: Path) -> None:
    with ServerProcess.cli("serve", f"{models}:bind") as server:
        port = server.wait_started()["http"]
        status, document = post_json(port, "/v2/models/double/infer", _body(-1))
        assert status == 500 and document["error"] == "PyTritonUnrecoverableError: the device is gone"
        server.wait_for(r"ERROR pytriton: stopping the server: model 'double' raised PyTritonUnrecoverableError")
        assert server.wait() == 1


@pytest.mark.parametrize("option", ["--http-port", "--grpc-port"])
def test_a_port_in_use_is_one_line_naming_it_and_exit_2(models: Path, option: str) -> None:
    with taken_port() as port:
        result = run_cli(
            "serve", f"{models}:bind", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", option, str(port)
        )
    protocol = "HTTP" if option == "--http-port" else "gRPC"
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"pytriton serve: error: {protocol} cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http-port", "abc"], "argument --http-port: expected an integer, got 'abc' (see pytriton demo --help)"),
        (["--allow-grpc", "maybe"], "argument --allow-grpc: expected true or false, got 'maybe'"),
        (["--http-port", "70000"], "TritonConfig.http_port: 70000 is not a port (0 to 65535; 0 picks a free one)"),
        (["--grpc-use-ssl", "true"], "gRPC TLS (grpc_use_ssl) needs grpc_server_cert and grpc_server_key"),
        (["--cache-config", "redis,size=10"], "cache_config 'redis,size=10': only the 'local' cache is available"),
        (["--allow-http", "false", "--allow-grpc", "false"], "The `http` or `grpc` endpoint has to be allowed."),
        (["--no-such-option"], "unrecognized arguments: --no-such-option (see pytriton demo --help)"),
        (["--frontends", "0"], "frontends: 0 is not a number of frontend processes (1 to 256)"),
        (["--log-file", "/nonexistent/x.log"], "TritonConfig.log_file: cannot open /nonexistent/x.log: No such file"),
        (["--access-token", ""], "--access-token: an empty token would open the restricted APIs to anyone"),
        (["--lame-duck-s", "-1"], "--lame-duck-s: ServerLimits.lame_duck_s must be a finite number >= 0, got -1.0"),
        (["--lame-duck-s", "nan"], "--lame-duck-s: ServerLimits.lame_duck_s must be a finite number >= 0, got nan"),
    ],
)
def test_a_bad_option_is_one_line_naming_it_and_exit_2(args: List[str], message: str) -> None:
    assert_one_line_error(run_cli("demo", *args), "pytriton demo: error: ", message)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["serve", "models.py", "--htpp-port", "9000"],
            "pytriton serve: error: unrecognized arguments: --htpp-port 9000 (did you mean --http-port?) "
            "(see pytriton serve --help)",
        ),
        (
            ["demo", "--allow-grcp=false", "--exit-timout-secs", "3"],
            "pytriton demo: error: unrecognized arguments: --allow-grcp=false --exit-timout-secs 3 "
            "(did you mean --allow-grpc or --exit-timeout-secs?) (see pytriton demo --help)",
        ),
        (  # check takes no access token: nothing near enough to suggest
            ["check", "--acess-token", "x"],
            "pytriton check: error: unrecognized arguments: --acess-token x (see pytriton check --help)",
        ),
    ],
)
def test_a_misspelt_option_gets_the_nearest_one_of_its_command(args: List[str], line: str) -> None:
    result = run_cli(*args)
    assert (result.returncode, result.stderr.splitlines()) == (2, [line])


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PYTRITON_TRITON_CONFIG_GRPC_PORT", "grpc", "PYTRITON_TRITON_CONFIG_GRPC_PORT must be an integer, got 'grpc'"),
        (
            "PYTRITON_TRITON_CONFIG_ALLOW_GRPC",
            "maybe",
            "PYTRITON_TRITON_CONFIG_ALLOW_GRPC must be true or false, got 'maybe'",
        ),
        ("PYTRITON_FRONTENDS", "two", "PYTRITON_FRONTENDS='two' is not a number of frontend processes"),
        ("PYTRITON_FRONTENDS", "300", "PYTRITON_FRONTENDS: 300 is not a number of frontend processes (1 to 256)"),
        ("PYTRITON_LIMIT_LAME_DUCK_S", "inf", "ServerLimits.lame_duck_s must be a finite number >= 0, got inf"),
    ],
)
def test_a_bad_environment_variable_is_one_line_naming_it_and_exit_2(name: str, value: str, message: str) -> None:
    result = run_cli("demo", **{name: value})
    assert (result.returncode, result.stderr) == (2, f"pytriton demo: error: {message}\n")


def option_help(text: str) -> Dict[str, str]:
    """Each option's entry in a --help text, on one line: '--http-port INT the HTTP port; ...'."""
    entries: Dict[str, str] = {}
    option = ""
    for line in text.splitlines():
        if line.startswith("  -"):
            option = line.split()[0].rstrip(",")
            entries[option] = line.strip()
        elif option and line.startswith("    "):
            entries[option] += " " + line.strip()
        else:
            option = ""
    return {option: " ".join(entry.split()) for option, entry in entries.items()}


def test_help_gives_each_option_its_meaning_and_default() -> None:
    result = run_cli("serve", "--help", COLUMNS="400")  # one line per option
    assert result.returncode == 0, result.stderr
    help_lines = option_help(result.stdout)
    assert help_lines["--http-port"] == "--http-port INT the HTTP port; 0 picks a free one (default: 8000)"
    assert help_lines["--grpc-keepalive-time"].endswith("(default: 7200000)")
    assert help_lines["--allow-grpc"].endswith("(default: true)")
    assert help_lines["--metrics-address"].endswith("(default: http_address)")
    assert "accepted, no effect here (HTTP is served by one asyncio event loop" in help_lines["--http-thread-count"]
    assert help_lines["--cache-config"].endswith("; repeatable")
    assert "TritonConfig." not in result.stdout
    for field in dataclasses.fields(TritonConfig):  # every option's help is its field's own
        option = "--" + field.name.replace("_", "-")
        assert field.metadata["doc"] in help_lines[option], option


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing.py", "missing.py: no such file"),
        ("no_such_module:bind", "no_such_module:bind: no module named 'no_such_module'"),
        ("{models}:nothing", ":nothing: 'nothing' is not a callable taking the Triton server"),
        ("{models}:bad_shape", "model 'broken': input 'x' has shape=(None,) (-1, not None, marks a dim of any size)"),
    ],
)
def test_a_target_that_cannot_be_served_is_one_line_and_exit_2(models: Path, target: str, message: str) -> None:
    assert_one_line_error(run_cli("serve", target.format(models=models)), "pytriton serve: error: ", message)


def test_the_installed_command_imports_a_module_target_from_the_working_directory(tmp_path: Path) -> None:
    # The `pytriton` script pip installs has its bin directory, not the working directory, first on sys.path:
    # `pytriton serve models:bind` beside models.py said "no module named 'models'" where `python -m pytriton`
    # (which the other tests run) found it.
    script = tmp_path / "bin" / "pytriton"
    script.parent.mkdir()
    script.write_text("import sys\nfrom pytriton.cli import main\nsys.exit(main())\n")  # pip's wrapper, in short
    (tmp_path / "models.py").write_text("def bind(triton):\n    raise RuntimeError('bind was called')\n")
    result = subprocess.run(
        [sys.executable, str(script), "serve", "models:bind"],
        env=free_port_env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    prefix, message = "pytriton serve: error: ", "models:bind failed: models.py:2: RuntimeError: bind was called"
    assert_one_line_error(result, prefix, message)


def test_check_prints_versions_and_whether_each_port_is_free(capsys: pytest.CaptureFixture[str]) -> None:
    # Reserved: free again once the listener below closes, whatever else binds ports meanwhile.
    (port,) = free_ports(1)
    http = ["--http-address", "127.0.0.1", "--http-port", str(port), "--allow-grpc", "false"]
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert main(["check", *http, "--metrics-port", "0"]) == 1
        text = capsys.readouterr().out
        assert "pytriton" in text and "numpy" in text
        assert f"HTTP/REST  127.0.0.1:{port}  not free: Address already in use" in text
        assert "gRPC       disabled" in text and "metrics    127.0.0.1:0  any free port" in text
    assert main(["check", *http, "--allow-metrics", "false"]) == 0
    assert f"HTTP/REST  127.0.0.1:{port}  free" in capsys.readouterr().out


class _BrokenPipe(io.TextIOBase):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def _argparse_drops_unwritable_help() -> bool:
    """Whether this Python's argparse drops help it cannot write: 3.11.7, 3.12 and 3.13 do, 3.11.2 and 3.10 do not."""
    try:
        argparse.ArgumentParser().print_help(_BrokenPipe())
    except BrokenPipeError:
        return False
    return True


# Where argparse drops the help (status 0); elsewhere the command catches the error (1).
HELP_STATUS = 0 if _argparse_drops_unwritable_help() else 1


@pytest.mark.parametrize(
    ("args", "status"), [(["check"], 1), (["--help"], HELP_STATUS), (["serve", "--help"], HELP_STATUS)]
)
def test_output_into_a_closed_pipe_ends_quietly(args: List[str], status: int) -> None:
    """`pytriton check | head -1`: the reader leaves before the output is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytriton", *args],
        env=free_port_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the process writes: its first write meets a closed pipe
    try:
        assert process.wait(WAIT_S) == status
        assert process.stderr.read() == ""  # no BrokenPipeError traceback
    finally:
        process.kill()
        process.wait()
        process.stderr.close()


def test_python_dash_m_pytriton_exits_with_the_status_of_the_command() -> None:
    result = run_cli("demo", "--http-port", "abc")
    assert result.returncode == 2
    script = textwrap.dedent("import sys\nfrom pytriton.cli import main\nsys.exit(main(['demo', '--http-port', '-1']))")
    result = subprocess.run([sys.executable, "-c", script], env=free_port_env(), capture_output=True, text=True)
    assert result.returncode == 2 and "is not a port" in result.stderr


def test_a_model_directory_stands_for_its_model_py(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("FACTOR = 3\n")
    (tmp_path / "model.py").write_text("from helper import FACTOR\n\ndef bind(triton):\n    return FACTOR\n")
    assert load_target(str(tmp_path))(None) == 3  # type: ignore[arg-type]  # model.py, importing a module beside it


def test_a_model_directory_without_one_bind_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def bind(triton): pass\n")
    (tmp_path / "b.py").write_text("def bind(triton): pass\n")
    with pytest.raises(StartupError, match=r"expected model\.py or exactly one \.py file"):
        load_target(str(tmp_path))
    (tmp_path / "b.py").unlink()
    assert callable(load_target(f"{tmp_path}:bind"))


def test_lame_duck_option_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytriton.cli import _limits_from_args

    monkeypatch.setenv("PYTRITON_LIMIT_LAME_DUCK_S", "4")
    assert _limits_from_args(build_parser().parse_args(["serve", "m.py"])).lame_duck_s == 4
    assert _limits_from_args(build_parser().parse_args(["serve", "m.py", "--lame-duck-s", "9"])).lame_duck_s == 9


def test_serve_takes_the_access_token_and_the_restricted_endpoints(tmp_path: Path) -> None:
    model_file = tmp_path / "models.py"
    model_file.write_text("def bind(triton):\n    pass\n")
    env = free_port_env(PYTRITON_ACCESS_TOKEN="from-env")
    args = ["serve", f"{model_file}:bind", "--allow-grpc", "false", "--allow-metrics", "false"]
    with ServerProcess.cli(*args, "--restricted-endpoints", "statistics", env=env) as server:
        port = server.wait_started()["http"]
        assert request(port, "GET", "/v2/models/stats")[0] == 403
        assert request(port, "GET", "/v2/models/stats", headers={"triton-access-token": "from-env"})[0] == 200
        assert request(port, "POST", "/v2/repository/index")[0] == 200  # not restricted here
        server.signal(signal.SIGINT)
        assert server.wait() == 0


def test_an_empty_access_token_variable_is_no_token_not_an_open_server(tmp_path: Path) -> None:
    model_file = tmp_path / "models.py"
    model_file.write_text("def bind(triton):\n    pass\n")
    env = free_port_env(PYTRITON_ACCESS_TOKEN="")
    args = ["serve", f"{model_file}:bind", "--allow-grpc", "false", "--allow-metrics", "false"]
    with ServerProcess.cli(*args, "--restricted-endpoints", "statistics", env=env) as server:
        port = server.wait_started()["http"]
        assert request(port, "GET", "/v2/models/stats")[0] == 403
        assert request(port, "GET", "/v2/models/stats", headers={"triton-access-token": ""})[0] == 403


def test_serve_with_stdout_closed_serves_and_stops_with_status_0() -> None:
    # `pytriton serve >&-`: stdout's number would go to a socket, whose close aborted the process (status 134)
    process = subprocess.Popen(
        [sys.executable, "-m", "pytriton", "demo"],
        env=free_port_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(1),
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert " serving add_sub " in line, line
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, rest
    assert "stopped" in rest


SLOW_TO_START = """
import sys, time
print("importing", file=sys.stderr, flush=True)
if "{stage}" == "import":
    time.sleep(60)

def bind(triton):
    print("binding", file=sys.stderr, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize(
    ("stage", "said"),
    [
        ("import", r"pytriton serve: received SIGTERM while loading .*, stopping$"),
        ("bind", r"INFO pytriton: received SIGTERM while binding the models, stopping$"),
    ],
)
def test_sigterm_while_the_models_load_or_bind_stops_with_status_0(tmp_path: Path, stage: str, said: str) -> None:
    # the handlers serve() sets came only after binding: SIGTERM before them killed the process (143), silently
    model_file = tmp_path / "slow.py"
    model_file.write_text(SLOW_TO_START.format(stage=stage))
    with ServerProcess.cli("serve", f"{model_file}:bind", "--allow-metrics", "false") as server:
        server.wait_for("binding" if stage == "bind" else "importing")
        server.signal(signal.SIGTERM)
        assert server.wait() == 0, server.output()
        assert any(re.search(said, line) for line in server.lines), server.output()
