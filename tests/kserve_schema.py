"""Strict offline validation of KServe resources against KServe's own SDK models (the `kserve` package).

The SDK's models are generated from KServe's OpenAPI schema: each class lists its fields' JSON names
(`attribute_map`) and types (`openapi_types`), and its constructor refuses a missing required field.
`validate` walks a document against them, refusing unknown fields and values of the wrong type; the
Kubernetes types they embed (containers, metadata, ...) come from the `kubernetes` client's models.

Importing `kserve` runs its model server's imports (fastapi, pandas, ...), which the test environment
does not install (`.ci/run` installs kserve with --no-deps: its models need none of that): the models
are loaded from the installed package's directory without its `__init__`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from typing import Any, List

import pytest

INSTALL_HINT = "pip install --no-deps 'kserve>=0.15,<1' && pip install -e '.[test]' (as .ci/run does)"
_LIST = re.compile(r"^(?:list|List)\[(.+)\]$")
_DICT = re.compile(r"^(?:dict|Dict)\((?:str), (.+)\)$|^Dict\[str, (.+)\]$")
_PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,)}


def _kserve_models() -> types.ModuleType:
    """kserve.models, imported without running kserve/__init__.py."""
    if "kserve.models" in sys.modules:
        return sys.modules["kserve.models"]
    spec = importlib.util.find_spec("kserve")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the kserve SDK is not installed: {INSTALL_HINT}")
    if "kserve" not in sys.modules:
        package = types.ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


def _kubernetes_models() -> types.ModuleType:
    try:
        return importlib.import_module("kubernetes.client.models")
    except ImportError:
        pytest.fail(f"the kubernetes client is not installed: {INSTALL_HINT}")


def _model_class(name: str) -> Any:
    kserve_models = _kserve_models()
    found = getattr(kserve_models, name, None) or getattr(_kubernetes_models(), name, None)
    if found is None:
        raise AssertionError(f"no SDK model named {name}")
    return found


def _check(value: Any, kind: str, path: str, errors: List[str]) -> Any:
    """`value` as the SDK model of type `kind` (checked); errors are appended with their JSON path."""
    listed = _LIST.match(kind)
    if listed:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {value!r}")
            return None
        return [_check(item, listed.group(1), f"{path}[{index}]", errors) for index, item in enumerate(value)]
    mapped = _DICT.match(kind)
    if mapped:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {value!r}")
            return None
        inner = mapped.group(1) or mapped.group(2)
        return {key: _check(item, inner, f"{path}.{key}", errors) for key, item in value.items()}
    if kind in _PRIMITIVES:
        if not isinstance(value, _PRIMITIVES[kind]) or (
            kind != "bool" and kind != "object" and isinstance(value, bool)
        ):
            errors.append(f"{path}: expected {kind}, got {value!r}")
        return value
    if kind == "datetime":
        return value
    cls = _model_class(kind)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({kind}), got {value!r}")
        return None
    by_json = {json_name: name for name, json_name in cls.attribute_map.items()}
    arguments = {}
    for key, item in value.items():
        name = by_json.get(key)
        if name is None:
            errors.append(f"{path}.{key}: unknown field of {kind}")
            continue
        arguments[name] = _check(item, cls.openapi_types[name], f"{path}.{key}", errors)
    try:
        return cls(**arguments)  # the generated constructor refuses missing required fields and bad enum values
    except (ValueError, TypeError) as error:
        errors.append(f"{path}: {kind}: {' '.join(str(error).split())[:300]}")
    return None


def validate(document: Any, model: str) -> List[str]:
    """The problems of `document` as the KServe SDK model `model` (e.g. V1alpha1ServingRuntime); empty when valid."""
    errors: List[str] = []
    _check(document, model, document.get("kind", model) if isinstance(document, dict) else model, errors)
    return errors
