"""gRPC LogSettings and TraceSetting messages, both directions, to and from the settings documents."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from tritonclient.grpc import service_pb2

Message = Any


# The log settings Triton's gRPC frontend knows (and checks the type of).
_LOG_TYPES = frozenset(("log_info", "log_warning", "log_error", "log_verbose_level", "log_format"))


# A setting Triton knows, given with no value at all: Triton's gRPC frontend refuses it as a value of the wrong
# type ("expect boolean for 'log_info'") when its turn comes, after the settings before it were applied.
NO_VALUE = object()


def log_changes(request: Message) -> Dict[str, Any]:
    """LogSettingsRequest -> {setting: bool | int | str | None | NO_VALUE}.

    A value with no choice set is NO_VALUE for a setting Triton knows (LogSettings.update refuses it in turn),
    None for another.
    """
    changes: Dict[str, Any] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None:
            changes[key] = NO_VALUE if key in _LOG_TYPES else None
        else:
            changes[key] = getattr(value, choice)
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
