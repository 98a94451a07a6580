"""Imports go one way, down the layers of docs/architecture.md; this test keeps it so."""

from __future__ import annotations

import ast
import pathlib
from typing import Iterator, Optional, Tuple

import pytriton

PACKAGE = pathlib.Path(pytriton.__file__).parent
# Lower rank = lower layer. A module may import its own layer and any lower one, never a higher one.
RANKS = {"core": 0, "options": 1, "protocol": 1, "transport": 2, "runtime": 3}


def _layer(module: str) -> Optional[str]:
    """The layer of a `pytriton.*` module name, None for the public API and leaves outside the layers."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pytriton" and parts[1] in RANKS else None


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
