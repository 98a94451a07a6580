"""The quick starts of the docs, run as a newcomer runs them (the server shows it is up, and serves), and what
the docs say about the project checked against it."""

from __future__ import annotations

import ast
import dataclasses
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple, Union

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


def test_the_custom_route_of_the_composition_guide_calls_its_model(tmp_path: Path) -> None:
    # Its route called a batching model (the default config) with an input of no batch axis: a 400.
    from tests.http_helpers import post_json

    routes = next(block for block in _python_blocks(ROOT / "docs" / "composition.md") if "add_route" in block)
    routes = routes.replace('triton.mount("/ui", asgi_app)', "")  # the page's stand-in for an app of yours
    server_code = (
        "import numpy as np\n"
        "from pytriton.decorators import batch\n"
        "from pytriton.model_config import Tensor\n"
        "from pytriton.triton import Triton\n\n"
        "triton = Triton()\n"
        "triton.bind('double', batch(lambda x: {'y': 2 * x}), [Tensor(name='x', dtype=np.float32, shape=(1,))],\n"
        "           [Tensor(name='y', dtype=np.float32, shape=(1,))])  # ModelConfig(): batching\n"
        f"{routes}\n"
        "triton.serve()\n"
    )
    with ServerProcess.script(tmp_path, server_code) as server:
        port = server.wait_started()["http"]
        assert post_json(port, "/double", {"x": 3}) == (200, {"y": 6.0})
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
        assert "frontend" in paragraph, (name, paragraph)  # frontend processes hand large requests over in it too


NOUNS = "instances|requests|inputs|outputs|processes|models|connections|calls|streams|batches|failures|callables"
# "%d <noun>s" in a log line reads "1 instances" when the count is 1. Counts that are never 1:
NEVER_ONE: Set[str] = set()


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


# The docs checked against the code as it is now: pages written as features landed went stale when later ones did.

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path: Path) -> str:
    """A page without its fenced code blocks (what a reader takes for the page's own claims)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def _slug(heading: str, mkdocs: bool) -> str:
    """The anchor of a heading: mkdocs' toc (Python-Markdown's slugify) on the site, GitHub's elsewhere."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text) if mkdocs else text.replace(" ", "-")


def _anchors(path: Path, mkdocs: bool) -> List[str]:
    return [_slug(heading, mkdocs) for heading in re.findall(r"^#+ (.*)$", _prose(path), re.M)]


def test_every_link_between_pages_and_its_anchor_resolves() -> None:
    broken = []
    for page in [*PAGES, ROOT / "examples" / "README.md", ROOT / "bench" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            on_site = page.parent == ROOT / "docs"  # the pages mkdocs builds; the others are read on GitHub
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked, on_site)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


def test_a_page_names_another_page_with_a_link() -> None:
    # composition.md once said "(docs/binding_models.md#remotetriton)" in plain text, configuration.md
    # "(docs/performance.md, "Frontend processes")": no link on the site, and no check that they resolve.
    bare = []
    for page in PAGES:
        text = re.sub(r"\[[^\]]*\]\([^)]*\)", "[]()", _prose(page))  # links out
        text = re.sub(r"`[^`\n]*`", "``", text)  # and code
        bare += [f"{page.name}: {ref}" for ref in re.findall(r"[\w./-]+\.md#[\w-]+|\bdocs/[\w-]+\.md", text)]
    assert not bare


def test_every_table_row_belongs_to_a_table() -> None:
    # A blank line inside a table makes the rows after it a paragraph of pipes (architecture.md's ipc row was one).
    loose = []
    for page in PAGES:
        lines = _prose(page).splitlines()
        for number, line in enumerate(lines[1:-1], start=1):
            starts_table = line.startswith("|") and not lines[number - 1].startswith("|")
            if starts_table and not re.fullmatch(r"\|[\s:|-]+\|", lines[number + 1]):
                loose.append(f"{page.name}: {line[:60]}")
    assert not loose


def _module_paths(text: str) -> List[str]:
    """Backticked names of the package's files in a page: `core/engine.py`, `transport/http/`, `ipc/segments.X`."""
    top = {path.name for path in (ROOT / "pytriton").iterdir()} | {path.stem for path in (ROOT / "pytriton").iterdir()}
    names = re.findall(r"`((?:pytriton/)?[a-z_]+/[a-z_/]*(?:\.py|/|\.[A-Za-z_]+)?)`", text)
    return [name for name in names if name.removeprefix("pytriton/").split("/")[0] in top]


def _resolves(name: str) -> bool:
    """Whether a module path of the docs names a file or package of pytriton (and the attribute it names, if any)."""
    name = name.removeprefix("pytriton/")
    stem, _, attribute = name.partition(".") if not name.endswith(".py") else (name, "", "")
    if (ROOT / "pytriton" / name).is_dir():
        return True
    path = ROOT / "pytriton" / (stem if stem.endswith(".py") else f"{stem}.py")
    if not path.is_file():
        return False
    return (
        not attribute or re.search(rf"^\s*(?:def |class |async def )?{attribute}\b", path.read_text(), re.M) is not None
    )


def test_every_module_path_the_docs_name_exists() -> None:
    named = [(page.name, name) for page in PAGES for name in _module_paths(_prose(page))]
    assert len(named) > 100 and ("architecture.md", "core/outputs.checked_outputs") in named
    assert [f"{page}: {name}" for page, name in named if not _resolves(name)] == []


def test_the_architecture_page_describes_every_package() -> None:
    # transport/cloud/ (SageMaker, Vertex AI) had been left out of its layer table.
    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(
        path.parent.relative_to(ROOT / "pytriton").as_posix() for path in (ROOT / "pytriton").rglob("*/__init__.py")
    )
    assert "core/composition" in packages
    assert [package for package in packages if f"`{package}/" not in text and f"{package}/`" not in text] == []


def _bullet(path: Path, start: str) -> str:
    """The list item of a page that begins with `start` (up to the next item or paragraph)."""
    items = [item for item in re.split(r"\n\s*\n|\n- ", _prose(path)) if item.lstrip("- ").startswith(start)]
    assert len(items) == 1, (path.name, start)
    return items[0]


def test_migration_lists_as_missing_no_triton_feature_that_is_served() -> None:
    # It listed "ensembles and BLS" long after Triton.bind_ensemble and pytriton.compose had come.
    from pytriton import compose
    from pytriton.triton import Triton

    missing = _bullet(ROOT / "docs" / "migration.md", "**Triton features not available:**").lower()
    served = {"ensemble": hasattr(Triton, "bind_ensemble"), "bls": hasattr(compose, "call_model")}
    assert all(served.values())
    assert [feature for feature in served if feature in missing] == []


def _config_fields() -> List[str]:
    from pytriton.triton_config import TritonConfig

    return [field.name for field in dataclasses.fields(TritonConfig)]


def _no_effect_fields() -> List[str]:
    from pytriton.runtime.options import no_effect_reason

    return sorted(name for name in _config_fields() if no_effect_reason(name))


def test_the_options_said_to_have_no_effect_are_those_that_have_none() -> None:
    fields = _no_effect_fields()
    assert "sagemaker_safe_port_range" in fields and "http_port" not in fields
    table = _prose(ROOT / "docs" / "configuration.md")
    rows = re.findall(r"^\| ((?:`[a-z0-9_]+`(?:, )?)+) \|[^|\n]*\| no effect", table, re.M)
    assert sorted(name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row)) == fields
    listed = _bullet(ROOT / "docs" / "migration.md", "**Options with no effect.**")
    thread_counts = {"sagemaker_thread_count", "vertex_ai_thread_count"}  # "SageMaker/Vertex AI thread counts"
    named = set(re.findall(r"`([a-z0-9_]+)`", listed)) | (thread_counts if "Vertex AI thread" in listed else set())
    assert sorted(named & set(_config_fields())) == fields


def test_the_docs_say_options_raise_only_if_some_do() -> None:
    from pytriton.runtime.options import _NOT_IMPLEMENTED

    claims = [page.name for page in PAGES if re.search(r"not\s+implement(?:ed)?\s+yet", _prose(page))]
    assert claims == [] or _NOT_IMPLEMENTED, claims


def test_the_configuration_page_gives_every_option_the_default_the_code_uses() -> None:
    from pytriton.triton_config import TritonConfig

    rows: Dict[str, str] = {}
    for table in re.split(r"^### ", _prose(ROOT / "docs" / "configuration.md"), flags=re.M):
        if "| field | default | here |" in table:
            rows.update(_table_rows_in(table))
    differ = []
    for field in dataclasses.fields(TritonConfig):
        default = field.metadata.get("default")
        written = rows[field.name].replace("`", "").removesuffix(" ms")
        if isinstance(default, str) and " " in default:  # told in words ("the only model")
            continue
        expected = "—" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        if written != expected:
            differ.append(f"{field.name}: {written!r}, the code {expected!r}")
    assert not differ


def _table_rows_in(table: str) -> Dict[str, str]:
    rows: Dict[str, str] = {}
    for names, value in re.findall(r"^\| ((?:`[a-z0-9_]+`(?:, )?)+) \| ([^|]*) \|", table, re.M):
        rows.update((name, value.strip()) for name in re.findall(r"`([a-z0-9_]+)`", names))
    return rows


def _quantity(text: str) -> Union[int, float]:
    """A default as the limits table writes it: `64 MiB`, `2 GiB - 1` (a minus sign), `2^28`, `30 s`, `4096`."""
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    match = re.fullmatch(r"(\d+)(?:\^(\d+))?(?: (KiB|MiB|GiB|s))?(?: \u2212 (\d+))?", text)
    assert match, text
    base, power, unit, minus = match.groups()
    value = int(base) ** int(power) if power else int(base)
    if unit == "s":
        return float(value)
    return value * units.get(unit or "", 1) - int(minus or 0)


def test_the_limits_table_lists_every_server_limit_with_its_default() -> None:
    from pytriton.options.limits import ServerLimits

    rows = _table_rows_in(_prose(ROOT / "docs" / "configuration.md").split("| limit | default | refusal |", 1)[1])
    fields = dataclasses.fields(ServerLimits)
    defaults = {field.name: field.default for field in fields if field.default is not dataclasses.MISSING}
    assert sorted(rows) == sorted(field.name for field in fields)
    # The one default decided at start, from the machine: its words say what it is.
    assert rows.pop("max_received_bytes") == "half of the memory, shared between frontend processes"
    assert defaults.pop("max_received_bytes") is None
    assert {name: _quantity(text) for name, text in rows.items()} == defaults


def test_the_reserved_parameters_the_docs_name_are_those_the_server_takes() -> None:
    from pytriton.core.request import RESERVED_PARAMETERS

    requests = _bullet(ROOT / "docs" / "inference_callables.md", "`parameters`:")
    listed = re.search(r"reserved parameters \(([^)]*)\)", requests)
    assert listed, requests
    assert sorted(re.findall(r"`([a-z_]+)`", listed.group(1))) == sorted(RESERVED_PARAMETERS)


def test_the_architecture_page_names_the_modules_every_layer_may_import() -> None:
    # "Imports go one way, down the table" read as if core/ could not import model_config/ or exceptions.py,
    # which tests/test_layers.py lets every layer import.
    from tests.test_layers import LEAVES

    text = (ROOT / "docs" / "architecture.md").read_text()
    sentence = re.search(r"\(([^)]*)\)\s+stand outside the layers", text)
    assert sentence, "the architecture page says which modules stand outside the layers"
    named = {name.split(".")[0].rstrip("/") for name in re.findall(r"`([a-z_]+(?:\.py|/))`", sentence.group(1))}
    assert named == LEAVES - {"__init__"}


def test_the_examples_page_names_each_example_that_is_no_server_and_client() -> None:
    intro = (ROOT / "docs" / "examples.md").read_text().split("\n\n")[1]
    assert "`server.py` and a `client.py`" in intro
    unlike = sorted(
        path.name
        for path in (ROOT / "examples").iterdir()
        if path.is_dir() and not ((path / "server.py").is_file() and (path / "client.py").is_file())
    )
    assert "background_mode" in unlike
    assert [name for name in unlike if f"`{name}`" not in intro] == []


# The names an operator types from the docs: options of the `pytriton` command, variables, metric names.

COMMANDS = ("serve", "demo", "check", "token")
DOC_FILES = [*PAGES, ROOT / "examples" / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))]


def _command_options() -> Dict[str, Set[str]]:
    """The options each `pytriton` command takes, from its parser."""
    from pytriton.cli import _subparser, build_parser

    parser = build_parser()
    return {
        command: {option for action in _subparser(parser, command)._actions for option in action.option_strings}
        for command in COMMANDS
    }


def _units(text: str) -> List[str]:
    """A page's paragraphs, and each table row with its header row (a column may name the command)."""
    units = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if lines and all(line.startswith("|") for line in lines):
            units += [f"{lines[0]}\n{line}" for line in lines[2:]]
        else:
            units.append(paragraph)
    return units


def test_every_pytriton_option_the_docs_name_exists() -> None:
    options = _command_options()
    assert "--lame-duck-s" in options["serve"] and "--port" in options["token"]
    commands = "|".join(COMMANDS)
    named: Set[Tuple[str, str, str]] = set()  # (page, command, option)
    for page in DOC_FILES:
        # `pytriton serve models.py:bind --http-port 8000`, in the prose and in the shell blocks alike (not the
        # command's own error line, "pytriton serve: error: unrecognized arguments: --htpp-port")
        for command, rest in re.findall(rf"\bpytriton ({commands})\b(?!:)([^`\n|;&)]*)", page.read_text()):
            named.update((page.name, command, flag) for flag in re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", rest))
        # "`pytriton serve` and `pytriton demo` take `--access-token`": each command named takes each option named
        for unit in _units(_prose(page)):
            for command in re.findall(rf"`pytriton ({commands})`", unit):
                named.update((page.name, command, flag) for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", unit))
    assert ("configuration.md", "demo", "--frontends") in named and ("deployment.md", "token", "--port") in named
    assert (
        sorted(f"{page}: pytriton {command} {flag}" for page, command, flag in named if flag not in options[command])
        == []
    )


def test_every_pytriton_variable_the_docs_name_is_read() -> None:
    from pytriton.options.limits import ServerLimits

    code = "".join(path.read_text() for path in (ROOT / "pytriton").rglob("*.py"))
    fields = {name.upper() for name in _config_fields()}
    limits = {field.name.upper() for field in dataclasses.fields(ServerLimits)}
    deployment = [ROOT / "Dockerfile", *sorted((ROOT / "deploy").rglob("*.yaml"))]
    named = {
        name
        for page in [*DOC_FILES, *deployment]
        for name in re.findall(r"\bPYTRITON_[A-Z0-9_]*[A-Z0-9]\b", page.read_text())
    }
    assert {"PYTRITON_LIMIT_LAME_DUCK_S", "PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0"} <= named

    def read(name: str) -> bool:
        if name.startswith("PYTRITON_TRITON_CONFIG_"):  # a field, a list field's entry with its _<n> suffix
            return re.sub(r"_\d+$", "", name.removeprefix("PYTRITON_TRITON_CONFIG_")) in fields
        if name.startswith("PYTRITON_LIMIT_"):
            return name.removeprefix("PYTRITON_LIMIT_") in limits
        if name.startswith("PYTRITON_TEST_"):  # the test suite's own
            return name in (ROOT / "tests" / "conftest.py").read_text()
        return f'"{name}"' in code

    assert sorted(name for name in named if not read(name)) == []


def test_every_metric_the_docs_name_is_served() -> None:
    code = "".join(path.read_text() for path in (ROOT / "pytriton").rglob("*.py"))
    named = set()
    for page in PAGES:
        text = page.read_text()
        for stem, alternatives, tail in re.findall(r"\b(nv_[a-z0-9_]*?)\{([a-z0-9_,]+)\}([a-z0-9_]*)", text):
            named.update(f"{stem}{alternative}{tail}" for alternative in alternatives.split(","))
        named.update(re.findall(r"\b(?:nv|pytriton)_[a-z0-9_]*[a-z0-9]\b(?!\{)", text))
    assert {"nv_inference_compute_infer_duration_us", "pytriton_openai_output_tokens", "nv_energy_consumption"} <= named
    assert sorted(name for name in named if f'"{name}' not in code) == []


def test_every_import_the_docs_show_imports() -> None:
    # `from pytriton.runtime.limits import ServerLimits` in the prose as in the snippets: a name moved to another
    # module left the snippets failing at their first line.
    imports = {
        (page.name, module, name)
        for page in DOC_FILES
        for module, names in re.findall(r"^\s*from (pytriton[\w.]*) import \(?([\w, \n]+?)\)?$", page.read_text(), re.M)
        for name in re.findall(r"\w+", names)
    } | {
        (page.name, module, name)
        for page in DOC_FILES
        for module, name in re.findall(r"`from (pytriton[\w.]*) import (\w+)`", page.read_text())
    }
    assert ("configuration.md", "pytriton.runtime.limits", "ServerLimits") in imports and len(imports) > 40
    failing = [(page, module, name) for page, module, name in sorted(imports) if not _importable(module, name)]
    assert [f"{page}: from {module} import {name}" for page, module, name in failing] == []


def _importable(module: str, name: str) -> bool:
    """Whether `from module import name` works."""
    import importlib

    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


# Paths the docs name that are not this repository's: another repository's.
ELSEWHERE = {"docs/examples/model_repository/simple"}  # triton-inference-server's, in bench/README.md


def test_every_repository_file_the_docs_name_exists() -> None:
    # `deploy/kubernetes/hpa.yaml`, `tests/test_rolling_restart.py`, `.ci/run`: what a reader opens next.
    ignored = [line.rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines() if line.endswith("/")]
    tops = r"\.ci|deploy|examples|tests|bench|docs|Dockerfile|noxfile\.py|pyproject\.toml|CHANGELOG\.md"
    named = {
        (page.name, path)
        for page in [*DOC_FILES, ROOT / "bench" / "README.md"]
        for path in re.findall(rf"`((?:{tops})(?:/[\w.\-/]*)?)`", page.read_text())
    } | {  # and in the shell blocks: `kubectl apply -f deploy/kubernetes/hpa.yaml`
        (page.name, path)
        for page in [*DOC_FILES, ROOT / "bench" / "README.md"]
        for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", page.read_text(), re.S | re.M)
        for path in re.findall(rf"(?<![\w/.$-])((?:{tops})/[\w.\-/]*[\w/])", block)
    }
    assert {("scaling-out.md", "deploy/kubernetes/"), ("scaling-out.md", "deploy/kubernetes/hpa.yaml")} <= named
    missing = [
        f"{page}: {path}"
        for page, path in sorted(named)
        if not (ROOT / path).exists() and path not in ELSEWHERE and path.rstrip("/") not in ignored
    ]
    assert missing == []


def _public_classes() -> Dict[str, type]:
    """The classes a reader constructs with keyword arguments, by name."""
    import inspect

    from pytriton import client, model_config, openai, triton
    from pytriton.instances import ProcessInstances
    from pytriton.metrics import MetricFamily
    from pytriton.options.limits import ServerLimits
    from pytriton.routes import RouteResponse

    classes: Dict[str, type] = {"ProcessInstances": ProcessInstances, "MetricFamily": MetricFamily}
    classes.update(ServerLimits=ServerLimits, RouteResponse=RouteResponse)
    for module in (client, model_config, openai, triton):
        classes.update((name, value) for name, value in vars(module).items() if inspect.isclass(value))
    return {name: value for name, value in classes.items() if name[0].isupper()}


def _top_level_keywords(text: str, start: int) -> List[str]:
    """The keyword arguments of the call whose `(` is at `start` (not those of calls nested in it)."""
    depth, top = 0, []
    for character in text[start:]:
        depth += character in "([{"
        depth -= character in ")]}"
        if depth == 0:
            break
        top.append(character if depth == 1 else " ")
    return re.findall(r"(?:^|[,(\s])(\w+)=(?!=)", "".join(top))


def test_every_keyword_argument_the_docs_pass_is_taken() -> None:
    # `TritonConfig(http_port=8080)`, `ProcessInstances(tokenize, count=2)`, `OpenAIChat(chat_template=None)`: a
    # renamed parameter left the docs passing one that raises TypeError.
    import inspect

    classes = _public_classes()
    passed = set()
    for page in DOC_FILES:
        # LangChain has an OpenAIEmbeddings of its own
        text = re.sub(r"```python\n[^`]*from langchain_openai import.*?```", "", page.read_text(), flags=re.S)
        for call in re.finditer(rf"\b({'|'.join(classes)})\(", text):
            passed.update((page.name, call.group(1), word) for word in _top_level_keywords(text, call.end() - 1))
        for call in re.finditer(r"\b(?:triton|remote)\.(\w+)\(", text):  # triton.bind(..., trace_config=...)
            method = f"Triton.{call.group(1)}"
            passed.update((page.name, method, word) for word in _top_level_keywords(text, call.end() - 1))
    assert {
        ("configuration.md", "TritonConfig", "http_port"),
        ("binding_models.md", "Triton.bind", "model_name"),
    } <= passed
    refused = []
    for page, name, word in sorted(passed):
        called = getattr(classes["Triton"], name.split(".")[1]) if name.startswith("Triton.") else classes[name]
        parameters = inspect.signature(called).parameters
        if word not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            refused.append(f"{page}: {name}({word}=...)")
    assert refused == []


def test_every_v2_path_the_docs_name_is_a_route() -> None:
    # `/v2/models/<m>/stats`, `POST /v2/repository/models/<m>/load`: a path a curl of the docs asks for.
    from pytriton.options.http_routes import ROUTES, find_route

    paths = {
        (page.name, path) for page in PAGES for path in re.findall(r"/v2(?:/[\w<>{}.-]+)*(?![\w\[])", page.read_text())
    }
    assert ("clients.md", "/v2/models/AddSub/generate") in paths and len(paths) > 30
    unknown = []
    for page, path in sorted(paths):
        segments = re.sub(r"<[^>]*>|\{[^}]*\}", "m", path).split("/")  # `<m>`, `{model}`: a name
        prefix = any(template.startswith(f"{path}/") or template.startswith(f"{path}[") for template, _ in ROUTES)
        if find_route(segments) is None and not prefix:
            unknown.append(f"{page}: {path}")
    assert unknown == []
