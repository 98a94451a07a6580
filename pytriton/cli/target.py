"""The function a `pytriton serve` target names: `module:function`, `file.py:function` or a model directory."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

from pytriton.cli.errors import StartupError
from pytriton.triton import Triton


def load_target(target: str) -> Callable[[Triton], Any]:
    """Import `module:attr`, `path/to/file.py:attr` or `path/to/directory:attr`; default attr is `bind`.

    A directory (a mounted model directory) stands for its model.py, or its only .py file; the file's
    directory goes on sys.path so that it can import modules beside it.

    Raises:
        StartupError: no such file, module or function (a module's own errors, SyntaxError included, propagate).
    """
    location, _, attr = target.partition(":")
    attr = attr or "bind"
    if Path(location).is_dir():
        location = str(_model_file(Path(location)))
    if location.endswith(".py") or Path(location).is_file():
        path = Path(location).resolve()
        if not path.is_file():
            raise StartupError(f"{location}: no such file")
        if str(path.parent) not in sys.path:
            # As `python file.py` does: its folder is importable, also by instance processes, which import the
            # file's functions by name (they get this process's sys.path).
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise StartupError(f"cannot load {location}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        _import_from_working_directory()
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            if error.name is None or not (location == error.name or location.startswith(error.name + ".")):
                raise  # the module was found; something it imports is missing: its traceback says what
            raise StartupError(f"{target}: no module named '{error.name}' (nor a file {location})") from None
    binder = getattr(module, attr, None)
    if not callable(binder):
        raise StartupError(f"{target}: '{attr}' is not a callable taking the Triton server")
    return binder  # type: ignore[no-any-return]


def _import_from_working_directory() -> None:
    """Put the working directory first on sys.path, as `python -m pytriton` (and uvicorn, gunicorn) have it.

    The installed `pytriton` script's sys.path starts with its own bin directory, so `pytriton serve
    models:bind` beside models.py found no module `models` where `python -m pytriton serve models:bind`
    did. The path is absolute: instance processes get this sys.path and may start elsewhere.
    """
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _model_file(directory: Path) -> Path:
    """The Python file a model directory (e.g. KServe's /mnt/models) holds: its model.py, or its only .py file."""
    preferred = directory / "model.py"
    if preferred.is_file():
        return preferred
    found = sorted(path for path in directory.glob("*.py") if path.is_file())
    if len(found) != 1:
        names = ", ".join(path.name for path in found) or "none"
        raise StartupError(f"{directory}: expected model.py or exactly one .py file with bind(triton), found {names}")
    return found[0]
