"""The quick starts of the docs, run as a newcomer runs them (the server shows it is up, and serves), and what
the docs say about the project checked against it."""

from __future__ import annotations

import ast
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


def test_the_ensemble_of_the_composition_guide_serves(tmp_path: Path) -> None:
    import numpy as np
    import tritonclient.http as httpclient

    server_code = next(block for block in _python_blocks(ROOT / "docs" / "composition.md") if "bind_ensemble" in block)
    with ServerProcess.script(tmp_path, server_code) as server:
        line = server.wait_for(
            r"serving classifier v1 \(1 instance\), pipeline v1 \(ensemble of 2 steps\).* on http://0\.0\.0\.0:(\d+)"
        )
        client = httpclient.InferenceServerClient(f"127.0.0.1:{line.group(1)}")
        image = httpclient.InferInput("IMAGE", [1, 16], "FP32")
        image.set_data_from_numpy(np.arange(16, dtype=np.float32)[None])
        top = client.infer("pipeline", [image], outputs=[httpclient.InferRequestedOutput("SCORES", class_count=1)])
        assert top.as_numpy("SCORES").tolist() == [[b"9.500000:2:bird"]]
        server.signal(signal.SIGTERM)
        assert server.wait() == 0


# What the docs say about the project itself, checked against it.


def _listed_examples(path: Path) -> List[str]:
    """The examples a Markdown table names in its first column (`name` or [name](name))."""
    return re.findall(r"^\| (?:`([a-z_]+)`|\[([a-z_]+)\]\([a-z_]+\)) \|", path.read_text(), re.M)


def test_every_example_is_listed_in_the_docs_and_the_examples_readme() -> None:
    directories = sorted(path.name for path in (ROOT / "examples").iterdir() if path.is_dir())
    assert "process_instances" in directories and "remote_triton" in directories
    for listing in (ROOT / "docs" / "examples.md", ROOT / "examples" / "README.md"):
        listed = sorted("".join(names) for names in _listed_examples(listing))
        assert listed == directories, listing


def test_docs_that_say_no_shared_memory_is_used_name_the_processes_that_use_it() -> None:
    # Process instances and RemoteTriton's models get their tensors through shared memory (binding_models.md,
    # architecture.md); the deployment and migration guides once said that no process shares any.
    paragraphs = [
        (path.name, paragraph)
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for paragraph in re.split(r"\n\s*\n|\n- ", path.read_text())
        if re.search(r"\bno shared\s+memory\s+(?!can\b)", paragraph)  # not "when no shared memory can be had"
    ]
    assert paragraphs, "the guides say where tensors stay in the server's process"
    for name, paragraph in paragraphs:
        assert "ProcessInstances" in paragraph and "RemoteTriton" in paragraph, (name, paragraph)


NOUNS = "instances|requests|inputs|outputs|processes|models|connections|calls|streams|batches|failures|callables"
# "%d <noun>s" in a log line reads "1 instances" when the count is 1. Counts that are never 1:
NEVER_ONE = {"%d frontend processes serve"}  # frontends > 1 only


def test_log_lines_say_1_instance_not_1_instances() -> None:
    plural = re.compile(rf"%d (?:[a-z]+ )?(?:{NOUNS})\b")
    found = []
    for path in sorted((ROOT / "pytriton").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            text = node.args[0]
            if node.func.attr in ("debug", "info", "warning", "error", "exception", "critical") and (
                isinstance(text, ast.Constant) and isinstance(text.value, str)
            ):
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {text.value}"
                    for match in plural.finditer(text.value)
                    if not any(match.group(0) in line for line in NEVER_ONE)
                ]
    assert not found


def test_the_openai_page_serves_its_model_to_its_openai_and_langchain_snippets(tmp_path: Path) -> None:
    blocks = _python_blocks(ROOT / "docs" / "openai.md")
    server_code = blocks[0]
    clients = [block for block in blocks if "from openai import" in block or "from langchain_openai import" in block]
    assert len(clients) == 2 and "openai=OpenAIChat(chat_template=None)" in server_code
    with ServerProcess.script(tmp_path, server_code) as server:
        line = server.wait_for(r"INFO pytriton: pytriton \S+ serving toy v1 \(1 instance, decoupled\) on (.*) \(pid")
        http_port = int(re.match(r"http://0\.0\.0\.0:(\d+)", line.group(1)).group(1))  # type: ignore[union-attr]
        for client_code in clients:
            # the embedding model of the snippets is another binding of the page: the chat part runs here
            chat_part = re.split(r"\n(?:vectors|embeddings) =", client_code)[0]
            client = chat_part.replace("localhost:8000", f"localhost:{http_port}")
            result = subprocess.run(
                [sys.executable, "-c", client], env=free_port_env(), capture_output=True, text=True, timeout=WAIT_S
            )
            assert result.returncode == 0, result.stderr
            assert "word0 word1 word2 word3" in result.stdout, result.stdout
        server.signal(signal.SIGINT)
        assert server.wait() == 0
