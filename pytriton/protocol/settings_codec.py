"""gRPC LogSettings and TraceSetting messages, both directions, to and from the settings documents."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from tritonclient.grpc import service_pb2

Message = Any


def log_changes(request: Message) -> Dict[str, Any]:
    """LogSettingsRequest -> {setting: bool | int | str | None}; a value with no choice set is None."""
    changes: Dict[str, Any] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
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
