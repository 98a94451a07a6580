"""The `pytriton` command line: help, check, and serving a model file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytriton.cli import build_parser, main
from tests.http_helpers import post_json, request

ROOT = Path(__file__).parent.parent


def test_help_lists_every_config_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--http-port", "--grpc-port", "--cache-config", "--exit-timeout-secs", "--log-verbose"):
        assert option in text


def test_check_prints_versions_and_ports(capsys):
    main(["check", "--http-port", "9123", "--allow-grpc", "false"])
    text = capsys.readouterr().out
    assert "pytriton" in text and "numpy" in text
    assert "0.0.0.0:9123" in text and "gRPC       disabled" in text


def test_serve_a_model_file(tmp_path):
    model_file = tmp_path / "models.py"
    model_file.write_text(
        textwrap.dedent(
            """
            import numpy as np
            from pytriton.model_config import Tensor

            def bind(triton):
                triton.bind("double", lambda rs: [{"y": r["x"] * 2} for r in rs],
                            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytriton",
            "serve",
            f"{model_file}:bind",
            "--http-port",
            "0",
            "--allow-grpc",
            "false",
            "--allow-metrics",
            "false",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("pytriton serving on http://")
        port = int(line.strip().rsplit(":", 1)[1])
        status, document = post_json(
            port,
            "/v2/models/double/infer",
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]},
        )
        assert status == 200 and document["outputs"][0]["data"] == [2, 4]
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def test_a_model_directory_stands_for_its_model_py(tmp_path):
    from pytriton.cli import load_target

    (tmp_path / "helper.py").write_text("FACTOR = 3\n")
    (tmp_path / "model.py").write_text("from helper import FACTOR\n\ndef bind(triton):\n    return FACTOR\n")
    assert load_target(str(tmp_path))(None) == 3  # model.py, importing a module beside it


def test_a_model_directory_without_one_bind_file_is_refused(tmp_path):
    from pytriton.cli import load_target

    (tmp_path / "a.py").write_text("def bind(triton): pass\n")
    (tmp_path / "b.py").write_text("def bind(triton): pass\n")
    with pytest.raises(SystemExit, match=r"expected model\.py or exactly one \.py file"):
        load_target(str(tmp_path))
    (tmp_path / "b.py").unlink()
    assert callable(load_target(f"{tmp_path}:bind"))


def test_lame_duck_option_over_the_environment(monkeypatch):
    from pytriton.cli import _limits_from_args

    monkeypatch.setenv("PYTRITON_LIMIT_LAME_DUCK_S", "4")
    assert _limits_from_args(build_parser().parse_args(["serve", "m.py"])).lame_duck_s == 4
    assert _limits_from_args(build_parser().parse_args(["serve", "m.py", "--lame-duck-s", "9"])).lame_duck_s == 9


def test_serve_takes_the_access_token_and_the_restricted_endpoints(tmp_path):
    model_file = tmp_path / "models.py"
    model_file.write_text("def bind(triton):\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTRITON_ACCESS_TOKEN="from-env")
    command = [sys.executable, "-m", "pytriton", "serve", f"{model_file}:bind", "--http-port", "0"]
    command += ["--allow-grpc", "false", "--allow-metrics", "false", "--restricted-endpoints", "statistics"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(process.stdout.readline().strip().rsplit(":", 1)[1])
        assert request(port, "GET", "/v2/models/stats")[0] == 403
        assert request(port, "GET", "/v2/models/stats", headers={"triton-access-token": "from-env"})[0] == 200
        assert request(port, "POST", "/v2/repository/index")[0] == 200  # not restricted here
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(10)
        process.stdout.close()
