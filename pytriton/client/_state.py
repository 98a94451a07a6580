"""Model states from the repository index, and the config document from a get_model_config reply."""

from __future__ import annotations

import enum
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

LATEST_MODEL_VERSION = "<latest>"


class ModelState(enum.Enum):
    """State of a model on the server."""

    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    READY = "READY"


def index_entries(index: Any) -> Iterable[Tuple[str, str, str]]:
    """(name, version, state) of each entry of a repository index (HTTP: a list of dicts; gRPC: a message)."""
    if isinstance(index, list):
        return [(entry.get("name", ""), entry.get("version", ""), entry.get("state", "")) for entry in index]
    return [(entry.name, entry.version, entry.state) for entry in index.models]


def model_state(index: Any, model_name: str, model_version: Optional[str]) -> ModelState:
    """The state of a model version (the numerically greatest when `model_version` is None) in an index."""
    states: Dict[str, ModelState] = {
        version: _parse_state(state) for name, version, state in index_entries(index) if name == model_name and version
    }
    if model_version is not None:
        return states.get(model_version, ModelState.UNAVAILABLE)
    if not states:
        return ModelState.UNAVAILABLE
    return states[max(states, key=lambda version: int(version) if version.isdigit() else -1)]


def _parse_state(state: str) -> ModelState:
    """A state name as a ModelState; no state means loading, an unknown one unavailable."""
    if not state:
        return ModelState.LOADING
    try:
        return ModelState(state)
    except ValueError:
        return ModelState.UNAVAILABLE


def config_document(reply: Any, is_grpc: bool) -> Mapping[str, Any]:
    """The model config inside a get_model_config reply (gRPC wraps it in {"config": ...})."""
    document: Mapping[str, Any] = reply["config"] if is_grpc else reply
    return document
