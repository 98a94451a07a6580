"""Request parameters: Triton's reserved keys, and what the callable sees."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from pytriton.core.errors import InferenceError
from pytriton.core.request import EMPTY_FINAL_RESPONSE_PARAMETER, RESERVED_PARAMETERS, SequenceMark


class RequestOptions:
    """What the reserved parameters of a request ask of the server."""

    __slots__ = ("binary_data_output", "empty_final_response", "priority", "sequence", "timeout_us")

    def __init__(self) -> None:
        """Defaults: no priority, no timeout, JSON outputs, no empty final response, no sequence."""
        self.priority = 0
        self.timeout_us = 0
        self.binary_data_output = False
        self.empty_final_response = False
        self.sequence: Optional[SequenceMark] = None


@dataclasses.dataclass(frozen=True)
class ParameterRules:
    """What one transport's Triton frontend reserves of a request's parameters, and its words for a `triton_` key.

    `empty_final_response`: whether it takes `triton_enable_empty_final_response` (else it is a `triton_` key).
    """

    reserved: FrozenSet[str]
    triton_prefix_refusal: str
    empty_final_response: bool


# tritonserver 2.51's HTTP frontend refuses triton_enable_empty_final_response as any `triton_` key: only gRPC
# streams have empty final responses.
HTTP_RULES = ParameterRules(
    RESERVED_PARAMETERS,
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
    empty_final_response=False,
)
# binary_data_output means nothing to gRPC: Triton's gRPC frontend hands it to the model as any other parameter.
GRPC_RULES = ParameterRules(
    RESERVED_PARAMETERS - {"binary_data_output"},
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with "
    f"'triton_' are allowed: {EMPTY_FINAL_RESPONSE_PARAMETER}",
    empty_final_response=True,
)


def split_parameters(
    parameters: Optional[Mapping[str, Any]],
    forwarded_headers: Optional[Mapping[str, str]] = None,
    rules: ParameterRules = HTTP_RULES,
) -> Tuple[Dict[str, Any], RequestOptions]:
    """Split request parameters into the callable's parameters and the server's options, by a transport's `rules`.

    The options are read, never changed, once returned: a request without parameters shares one.
    """
    if not parameters and not forwarded_headers:
        return {}, _NO_OPTIONS
    options = RequestOptions()
    user: Dict[str, Any] = {}
    if parameters:
        for key, value in parameters.items():
            if key in rules.reserved:  # read before the type check, as Triton does
                _apply_reserved(options, key, value)
                continue
            takes_empty_final = key == EMPTY_FINAL_RESPONSE_PARAMETER and rules.empty_final_response
            if key.startswith("triton_") and not takes_empty_final:  # the key before its value, as Triton
                raise InferenceError.invalid(rules.triton_prefix_refusal)
            if not isinstance(value, (str, int, float, bool)):
                raise InferenceError.invalid(  # Triton's words
                    f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                )
            if takes_empty_final:
                options.empty_final_response = value is True
            elif type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
                user[key] = float(value)  # as Triton keeps a JSON integer past int64: a double
            else:
                user[key] = value
    if forwarded_headers:
        user.update(forwarded_headers)
    return user, options


_NO_OPTIONS = RequestOptions()
# The parameters Triton's ensembles answer with when their request has no sequence parameters (its correlation id and
# flags: the steps' responses give them, core/scheduling/ensemble.py).
ENSEMBLE_RESPONSE_PARAMETERS: Mapping[str, Any] = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


def _apply_reserved(options: RequestOptions, key: str, value: Any) -> None:
    """Read one reserved parameter of a type Triton's HTTP frontend reads it as.

    A value of another type gets tritonserver 2.51's words; it answers them with 500, here 400: the client sent it.
    """
    if key == "priority":
        options.priority = _unsigned(key, value)
    elif key == "timeout":
        options.timeout_us = _unsigned(key, value)
    elif key == "binary_data_output":
        if not isinstance(value, bool):
            raise InferenceError.invalid(
                "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"
            )
        options.binary_data_output = value
    else:
        _apply_sequence(options, key, value)


def _apply_sequence(options: RequestOptions, key: str, value: Any) -> None:
    """Read one sequence parameter.

    A value of the wrong type gets tritonserver 2.51's words; it answers them with 500, here 400: the client sent it.
    """
    sequence_id, start, end = options.sequence or (0, False, False)
    if key == "sequence_id":
        in_range = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _UINT64_LIMIT
        if not in_range and not isinstance(value, str):
            raise InferenceError.invalid("Unable to parse 'sequence_id': attempt to access JSON non-string as string")
        if isinstance(value, str) and len(value) > _STRING_ID_BYTES // 4:
            _check_string_id(value)
        sequence_id = value
    elif not isinstance(value, bool):
        raise InferenceError.invalid(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
    elif key == "sequence_start":
        start = value
    else:
        end = value
    options.sequence = (sequence_id, start, end)


_UINT64_LIMIT = 1 << 64
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_STRING_ID_BYTES = 128  # the longest string correlation id tritonserver 2.51 takes


def _check_string_id(sequence_id: str) -> None:
    """Refuse a string correlation id longer than 128 bytes, as tritonserver 2.51's core does (501 / UNIMPLEMENTED).

    It counts the UTF-8 bytes before the first NUL (it is handed a C string), for every model, with or without a
    sequence batcher; the request is refused before it is the model's (no failure counted). Without the bound
    a live sequence kept an id of any size (1 MB, 4 MB: the body's limit), and each request's CORRID input a copy.
    """
    encoded = sequence_id.encode("utf-8", "surrogatepass")
    if len(encoded) > _STRING_ID_BYTES and len(encoded.split(b"\0", 1)[0]) > _STRING_ID_BYTES:
        raise InferenceError.unimplemented(f"string correlation ID cannot be longer than {_STRING_ID_BYTES} characters")


def _unsigned(key: str, value: Any) -> int:
    """A reserved unsigned 64-bit integer parameter, in Triton's words when it is none."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _UINT64_LIMIT:
        raise InferenceError.invalid(
            f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    return value
