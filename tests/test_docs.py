"""The quick starts of the docs, run as a newcomer runs them: the server shows it is up, and serves."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

from tests.server_process import ROOT, WAIT_S, ServerProcess, free_port_env


def _python_blocks(path: Path) -> List[str]:
    """The ```python blocks of a Markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_quick_start_of_the_docs_logs_its_startup_line_and_serves(tmp_path: Path) -> None:
    server_code, client_code = _python_blocks(ROOT / "docs" / "index.md")[:2]
    assert "triton.serve()" in server_code and "ModelClient" in client_code
    with ServerProcess.script(tmp_path, server_code) as server:  # logging is not configured by the script
        line = server.wait_for(r"^\S+ \S+ INFO pytriton: pytriton \S+ serving AddSub v1 \(1 instance\) on (.*) \(pid")
        http_port = int(re.match(r"http://0\.0\.0\.0:(\d+)", line.group(1)).group(1))  # type: ignore[union-attr]
        client = client_code.replace('"localhost:8000"', f'"localhost:{http_port}"')
        result = subprocess.run(
            [sys.executable, "-c", client], env=free_port_env(), capture_output=True, text=True, timeout=WAIT_S
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == "[[2. 2. 2.] [2. 2. 2.]]".split()
        server.signal(signal.SIGINT)
        assert server.wait() == 0


def test_the_readme_model_serves(tmp_path: Path) -> None:
    server_code = _python_blocks(ROOT / "README.md")[0]
    with ServerProcess.script(tmp_path, server_code) as server:
        server.wait_for(r"INFO pytriton: pytriton \S+ serving add v1 \(1 instance\) on http://0\.0\.0\.0:\d+")
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
