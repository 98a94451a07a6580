"""Imports go one way, down the layers of docs/architecture.md; this test keeps it so."""

from __future__ import annotations

import ast
import pathlib
from typing import Iterator, Optional, Tuple

import pytriton

PACKAGE = pathlib.Path(pytriton.__file__).parent
# Lower rank = lower layer. A module may import its own layer and any lower one, never a higher one.
# Every other module of the package is the public API, above them all.
RANKS = {"ipc": -1, "core": 0, "options": 1, "protocol": 1, "transport": 2, "runtime": 3, "api": 4}
# Public modules of plain types that every layer builds on (what a callable gets, errors, configs): outside the layers.
LEAVES = {"exceptions", "proxy", "model_config", "constants", "triton_config", "__init__"}


def _layer(module: str) -> Optional[str]:
    """The layer of a `pytriton.*` module name (`api` for the public API), None for leaves and other packages."""
    parts = module.split(".")
    if parts[0] != "pytriton" or len(parts) == 1 or parts[1] in LEAVES:
        return None
    return parts[1] if parts[1] in RANKS else "api"


def _imports(path: pathlib.Path) -> Iterator[Tuple[int, str]]:
    """(line, module) of each import in a file, TYPE_CHECKING blocks included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_no_layer_imports_a_higher_one() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "pytriton." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = _layer(module)
        if own is None:
            continue
        for line, imported in _imports(path):
            other = _layer(imported)
            if other is not None and RANKS[other] > RANKS[own]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {imported}")
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from pytriton.runtime.server import ServerRuntime\nimport pytriton.transport.http\n")
    assert [module for _, module in _imports(sample)] == ["pytriton.runtime.server", "pytriton.transport.http"]
    assert RANKS[_layer("pytriton.runtime.server") or ""] > RANKS["core"]
    assert _layer("pytriton.context") == "api" and _layer("pytriton.proxy.types") is None
    assert RANKS[_layer("pytriton.core.engine") or ""] > RANKS[_layer("pytriton.ipc.channel") or ""]
