"""`pytriton serve` with a target whose code is broken: exit 2, one line naming the file and line, the user's frames."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

from tests.server_process import WAIT_S, free_port_env


def serve(directory: Path, target: str) -> subprocess.CompletedProcess[str]:
    """`pytriton serve TARGET` run in `directory`, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "pytriton", "serve", target],
        env=free_port_env(),
        cwd=str(directory),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def write(directory: Path, name: str, source: str) -> None:
    (directory / name).write_text(textwrap.dedent(source))


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (  # the message differs between Python versions ("invalid syntax" on 3.9)
            "import numpy\n\ndef bind(triton)\n    pass\n",
            r"cannot load models\.py:bind: models\.py:3: SyntaxError: \S.*",
        ),
        (
            "import numpy\nimport no_such_module_anywhere\n",
            r"cannot load models\.py:bind: models\.py:2: "
            r"ModuleNotFoundError: No module named 'no_such_module_anywhere'",
        ),
        (
            "def bind(triton):\n    raise RuntimeError('the weights are missing')\n",
            r"models\.py:bind failed: models\.py:2: RuntimeError: the weights are missing",
        ),
        (  # a model the server refuses: its message, after the user's line that bound it
            "import numpy as np\nfrom pytriton.model_config import Tensor\n\ndef bind(triton):\n"
            "    triton.bind('m', lambda requests: requests, inputs=[Tensor(name='x', dtype=np.float32, "
            "shape=(None,))], outputs=[Tensor(name='y', dtype=np.float32, shape=(-1,))])\n",
            r"models\.py:bind failed: models\.py:5: model 'm': input 'x' has shape=\(None,\) .*",
        ),
    ],
    ids=["syntax-error", "import-error", "raised-in-bind", "refused-model"],
)
def test_a_broken_target_is_one_line_naming_its_file_and_line(tmp_path: Path, source: str, line: str) -> None:
    write(tmp_path, "models.py", source)
    result = serve(tmp_path, "models.py:bind")
    assert result.returncode == 2, result
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert re.fullmatch(f"pytriton serve: error: {line}\n", result.stderr), result.stderr


def test_an_error_deeper_in_the_users_code_shows_their_frames_only(tmp_path: Path) -> None:
    write(
        tmp_path,
        "weights.py",
        """\
        import json

        def load(path):
            with open(path) as file:
                return json.load(file)
        """,
    )
    write(
        tmp_path,
        "models.py",
        """\
        import weights

        def bind(triton):
            weights.load("weights.json")
        """,
    )
    (tmp_path / "weights.json").write_text("{not json")
    result = serve(tmp_path, "models.py:bind")
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    # The first line names the innermost line of the user's code (json's own frames are deeper still).
    assert lines[0] == (
        "pytriton serve: error: models.py:bind failed: weights.py:5: "
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    assert lines[1] == "Traceback (most recent call last):"
    files = [frame_file(line) for line in lines if line.startswith('  File "')]
    assert files[:2] == [str(tmp_path / "models.py"), str(tmp_path / "weights.py")]
    assert all("json" in Path(name).parts for name in files[2:]), files  # then the library's, as Python shows them
    assert not [line for line in lines[1:] if "pytriton" in line or "importlib" in line or "runpy" in line], lines
    assert lines[-1].startswith("json.decoder.JSONDecodeError: Expecting property name")


def test_an_error_while_importing_the_target_shows_the_imports_that_led_there(tmp_path: Path) -> None:
    write(tmp_path, "helper.py", "SIZE = 3\nraise ImportError('helper needs a GPU')\n")
    write(tmp_path, "models.py", "import helper\n\ndef bind(triton):\n    pass\n")
    result = serve(tmp_path, "models.py")
    assert result.returncode == 2, result
    lines: List[str] = result.stderr.splitlines()
    assert lines[0] == "pytriton serve: error: cannot load models.py: helper.py:2: ImportError: helper needs a GPU"
    assert [frame_file(line) for line in lines if line.startswith('  File "')] == [
        str(tmp_path / "models.py"),
        str(tmp_path / "helper.py"),
    ]


def frame_file(line: str) -> str:
    """The file a traceback line `  File "...", line N, in f` names."""
    return line.split('"')[1]
