"""Dump the public names and signatures of PyTriton's user API modules as JSON.

The same script runs under this project's interpreter and under nvidia-pytriton's (its own venv), so the two
APIs can be compared programmatically (`tests/test_api_parity.py`). It needs nothing but the standard library
and the `pytriton` package it inspects.

    /tmp/nvidia-pytriton/bin/python -I tests/api_dump.py > tests/data/nvidia_pytriton_0.7.0_api.json
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import json
import logging
import re
import sys
import types
import typing
from typing import Any, Dict, List, Optional, Tuple

# The modules a user of nvidia-pytriton 0.7 imports from, each with the names compared (None: every public one).
# Left out, as 0.7's plumbing rather than its user API: the `pytriton` package itself (its names are its
# submodules and importlib.metadata's), pytriton.check (the environment check command), pytriton.models,
# pytriton.server, pytriton.utils and pytriton.tritonserver (running tritonserver and its model store),
# pytriton.model_config.generator and .parser (tritonserver's config files), and the proxy between
# tritonserver's Python backend and the callables (pytriton.proxy.communication, data, inference, model,
# validators, and all of pytriton.proxy.telemetry but `traced_span`: the rest builds the proxy's tracer from
# trace_config and carries spans across that process boundary, which does not exist here).
MODULES: Dict[str, Optional[Tuple[str, ...]]] = {
    "pytriton.triton": None,
    "pytriton.model_config": None,
    "pytriton.model_config.common": None,
    "pytriton.model_config.model_config": None,
    "pytriton.model_config.tensor": None,
    "pytriton.model_config.triton_model_config": None,
    "pytriton.decorators": None,
    "pytriton.constants": None,
    "pytriton.proxy.types": None,
    "pytriton.proxy.telemetry": ("traced_span",),
    "pytriton.client": None,
    "pytriton.client.asyncio_utils": None,
    "pytriton.client.auth": None,
    "pytriton.client.client": None,
    "pytriton.client.exceptions": None,
    "pytriton.client.utils": None,
    "pytriton.client.warnings": None,
    "pytriton.exceptions": None,
}
# Protocol methods that are part of a class's API although their names start with an underscore.
DUNDERS = (
    "__init__",
    "__call__",
    "__enter__",
    "__exit__",
    "__aenter__",
    "__aexit__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__len__",
    "__iter__",
)
_CONSTANT_TYPES = (bool, int, float, str, bytes, list, tuple, dict, set, frozenset, type(None))


def _default(value: Any) -> str:
    """A parameter default as text that is stable between runs and interpreters."""
    if value is inspect.Parameter.empty:
        return "<required>"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (set, frozenset)):
        return repr(sorted(value))
    if inspect.isclass(value) or inspect.isfunction(value):
        return f"<{value.__qualname__}>"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))  # sentinels such as <object object at 0x...>


def signature(obj: Any) -> List[List[str]]:
    """Parameters as [name, kind, default] (annotations differ in spelling between code bases, so they are left out)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return [["<no signature>", "", ""]]
    return [[p.name, p.kind.name, _default(p.default)] for p in sig.parameters.values()]


def _function(obj: Any) -> Dict[str, Any]:
    """A function or method: how it is called and whether it is a coroutine or a generator."""
    target = inspect.unwrap(obj) if callable(obj) else obj
    flavour = "function"
    if inspect.iscoroutinefunction(target):
        flavour = "coroutine"
    elif inspect.isasyncgenfunction(target):
        flavour = "async generator"
    return {"kind": flavour, "signature": signature(obj)}


def _member(cls: type, name: str) -> Dict[str, Any]:
    """One member of a class, looked up where it is defined."""
    raw = vars(_definers(cls, name)[0])[name]
    if isinstance(raw, property):
        return {"kind": "property", "settable": raw.fset is not None}
    if isinstance(raw, classmethod):
        return {**_function(getattr(cls, name)), "binding": "classmethod"}
    if isinstance(raw, staticmethod):
        return {**_function(getattr(cls, name)), "binding": "staticmethod"}
    if inspect.isfunction(raw) or inspect.ismethoddescriptor(raw) or (callable(raw) and not inspect.isclass(raw)):
        return {**_function(getattr(cls, name)), "binding": "method"}
    if isinstance(raw, enum.Enum):
        return {"kind": "enum member", "value": repr(raw.value)}
    return {"kind": "attribute"}


def _class(cls: type) -> Dict[str, Any]:
    """A class: bases by name, dataclass fields, public members."""
    members: Dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_") and name not in DUNDERS:
            continue
        if all(getattr(base, "__module__", "") == "builtins" for base in _definers(cls, name)):
            # Only built-in types define it (object's __init__, BaseException's with_traceback and add_note), or
            # no class of the MRO does (a metaclass's __dir__ lists it: EnumType's __len__): that is Python's
            # API, not PyTriton's, and it differs between Python versions (add_note is 3.11+, 3.13 gives
            # with_traceback a signature) while the dump of 0.7 comes from one.
            continue
        members[name] = _member(cls, name)
    found: Dict[str, Any] = {
        "kind": "enum" if issubclass(cls, enum.Enum) else "class",
        "bases": [base.__name__ for base in cls.__mro__[1:] if base is not object],
        "members": members,
    }
    if dataclasses.is_dataclass(cls):
        found["fields"] = [field.name for field in dataclasses.fields(cls)]
    return found


def _definers(cls: type, name: str) -> List[type]:
    """The classes of `cls`'s MRO that define `name` themselves."""
    return [base for base in cls.__mro__ if name in vars(base)]


def _is_alias(value: Any) -> bool:
    """A typing alias defined by the module (`Requests = List[Request]`), not a bare import like `Dict`."""
    return typing.get_origin(value) is not None and bool(typing.get_args(value))


def public_names(module: types.ModuleType) -> List[str]:
    """The names a module defines at its top level (a package's `__init__` also its imports), minus private ones.

    Names are read from the source, so that what a module merely imports for its own use does not count.
    """
    source = inspect.getsource(module)
    is_package = hasattr(module, "__path__")
    names = set(getattr(module, "__all__", ()))
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif is_package and isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return sorted(
        name
        for name in names
        if not name.startswith("_") and hasattr(module, name) and not isinstance(getattr(module, name), logging.Logger)
    )


def describe(value: Any) -> Dict[str, Any]:
    """What one public name is."""
    if _is_alias(value):
        return {"kind": "alias"}
    if inspect.isclass(value):
        return _class(value)
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return _function(value)
    if callable(value) and not dataclasses.is_dataclass(value):
        return {"kind": "callable", "signature": signature(value)}
    if isinstance(value, _CONSTANT_TYPES) or dataclasses.is_dataclass(value):
        return {"kind": "constant", "value": _default(value)}
    return {"kind": "object", "type": type(value).__name__}


def dump() -> Dict[str, Any]:
    """Every module's public names and what each is."""
    api: Dict[str, Any] = {}
    for module_name, compared in MODULES.items():
        module = importlib.import_module(module_name)
        names = public_names(module) if compared is None else compared
        api[module_name] = {name: describe(getattr(module, name)) for name in names}
    return api


if __name__ == "__main__":
    json.dump(dump(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
