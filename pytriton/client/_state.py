"""Model states from the repository index, and the model a readiness or config call is about."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

LATEST_MODEL_VERSION = "<latest>"


class ModelState(enum.Enum):
    """State of a model on the server."""

    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    READY = "READY"


def parse_http_response(models: Iterable[Mapping[str, Any]]) -> Dict[Tuple[str, str], ModelState]:
    """(name, version) -> state of an HTTP repository index (entries without a version are left out)."""
    return _states((entry.get("name", ""), entry.get("version", ""), entry.get("state", "")) for entry in models)


def parse_grpc_response(models: Iterable[Any]) -> Dict[Tuple[str, str], ModelState]:
    """(name, version) -> state of a gRPC RepositoryIndexResponse's `models` (without a version: left out)."""
    return _states((entry.name, entry.version, entry.state) for entry in models)


def _states(entries: Iterable[Tuple[str, str, str]]) -> Dict[Tuple[str, str], ModelState]:
    """(name, version) -> state of index entries that have a version."""
    return {(name, version): _parse_state(state) for name, version, state in entries if version}


def model_state(index: Any, model_name: str, model_version: Optional[str]) -> ModelState:
    """The state of a model version (the numerically greatest when `model_version` is None) in an index."""
    everything = parse_http_response(index) if isinstance(index, list) else parse_grpc_response(index.models)
    states = {version: state for (name, version), state in everything.items() if name == model_name}
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


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """A model version on a server, and the headers (access token) its readiness and config calls carry."""

    name: str
    version: Optional[str] = None
    headers: Optional[Dict[str, str]] = None

    def describe(self) -> str:
        """The model as timeout messages name it."""
        return f"model {self.name}/{self.version or LATEST_MODEL_VERSION}"

    def ready_request(self) -> Dict[str, Any]:
        """Keyword arguments of tritonclient's `is_model_ready` ("" is the latest version)."""
        return {"model_name": self.name, "model_version": self.version or "", "headers": self.headers}

    def config_request(self, is_grpc: bool) -> Dict[str, Any]:
        """Keyword arguments of tritonclient's `get_model_config` (gRPC asked for JSON, as HTTP answers)."""
        return {**self.ready_request(), **({"as_json": True} if is_grpc else {})}
