"""gRPC LogSettings and TraceSetting messages, both directions, to and from the settings documents."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError

Message = Any


# The type Triton's gRPC frontend expects of each log setting it knows, in its words.
_LOG_TYPES = {
    "log_info": "boolean",
    "log_warning": "boolean",
    "log_error": "boolean",
    "log_verbose_level": "int32",
    "log_format": "string",
}


def log_changes(request: Message) -> Dict[str, Any]:
    """LogSettingsRequest -> {setting: bool | int | str | None}; a value with no choice set is None.

    Raises:
        InferenceError: INVALID_ARGUMENT, for a setting Triton knows given with no value at all: Triton's gRPC
            frontend refuses it as a value of the wrong type ("expect boolean for 'log_info'").
    """
    changes: Dict[str, Any] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None and key in _LOG_TYPES:
            raise InferenceError.invalid(f"expect {_LOG_TYPES[key]} for '{key}'")
        changes[key] = getattr(value, choice) if choice else None
    return changes


def log_response(document: Mapping[str, Any]) -> Message:
    """The log settings document -> LogSettingsResponse."""
    response = service_pb2.LogSettingsResponse()
    for key, value in document.items():
        entry = response.settings[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        else:
            entry.string_param = str(value)
    return response


def trace_changes(request: Message) -> Dict[str, Optional[List[str]]]:
    """TraceSettingRequest -> {setting: values}; no values clears the setting."""
    return {key: list(value.value) or None for key, value in request.settings.items()}


def trace_response(document: Mapping[str, Any]) -> Message:
    """The trace settings document -> TraceSettingResponse (every setting a list of strings)."""
    response = service_pb2.TraceSettingResponse()
    for key, value in document.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
    return response
