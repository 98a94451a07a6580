"""JSON as Triton reads and writes it: orjson, with NaN and the infinities spelled out.

Triton parses request JSON with rapidjson's kParseNanAndInfFlag and writes responses with
kWriteNanAndInfFlag: `NaN`, `Infinity` and `-Infinity` (in requests also `-NaN`, `Inf` and `-Inf`) stand
for those floats, and tritonclient's HTTP client sends them for the non-finite values of a JSON tensor.
orjson knows neither: it refuses such tokens and writes those floats as `null`. So a document orjson refuses
that holds such a token is parsed again by python-rapidjson (tritonclient's HTTP client depends on it). A
document whose float arrays hold non-finite values is written by orjson with those `null`s replaced; one with a
non-finite scalar is written by python-rapidjson. Both are rare; the usual documents cost one
search of the written bytes for `null`, and python-rapidjson is imported when first needed (5.6 ms, a
startup's 3 %).
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Dict, List, Tuple, Union

import numpy as np
import orjson

Text = Union[bytes, bytearray, memoryview]
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_BOM = b"\xef\xbb\xbf"
_QUOTE = ord('"')
_NUMPY_COUNT_BYTES = 65536  # texts this long have their quotes counted by numpy
# What every non-finite token Triton reads begins with (after its sign).
_NON_FINITE_STARTS = (b"NaN", b"Inf")


class JsonError(ValueError):
    """Text that is not a JSON document; the message is orjson's (where and why)."""


def loads(data: Text, after_mark: bool = False) -> Any:
    """The document `data` holds, NaN and infinities included, after a UTF-8 byte order mark if it has one.

    `after_mark`: `data` is what followed one (a second is no more taken than by Triton). What follows a NUL byte
    is not read, as Triton does not read it: a C client's NUL-terminated text, or a binary request whose
    Inference-Header-Content-Length runs into its tensors' bytes (then found short of them). A key repeated in an
    object has its first value, as Triton's rapidjson lookups find (_first_values).

    Raises:
        JsonError: it is not JSON (with or without those tokens).
    """
    try:
        return _first_values(data, orjson.loads(data))
    except orjson.JSONDecodeError as error:
        refusal = str(error)
    text = bytes(data) if isinstance(data, memoryview) else data  # python-rapidjson takes no memoryview
    if text[:3] == _BOM and not after_mark:  # Triton skips a UTF-8 byte order mark (Windows tools write one)
        return loads(text[3:], after_mark=True)
    end = text.find(b"\x00")
    if end >= 0:  # rapidjson, as Triton runs it, reads a NUL after the document as the end of the text
        try:
            return loads(text[:end], after_mark=True)
        except JsonError:
            pass
    if any(start in text for start in _NON_FINITE_STARTS):
        import rapidjson

        try:
            return _first_values(text, rapidjson.loads(text, number_mode=rapidjson.NM_NAN))
        except (ValueError, RecursionError):  # its parse errors; RecursionError: nested past its depth limit
            pass
    raise JsonError(refusal)


def _first_values(text: Text, document: Any) -> Any:
    """`document`, read from `text` keeping each key's last value, again with each key's first if a key repeats.

    tritonserver finds a member with rapidjson's FindMember, the first of its name: of two "inputs" or two "name"s
    it reads the first, where orjson keeps the last (a request then ran on other data than Triton would run it
    on). A repeat shows as more quotes in the text than the document's keys and strings have (_quoted); an escaped
    quote shows the same, and such a text is read again for nothing. Counting the quotes and the document's strings
    costs 1 us on a small request, and 2 % of orjson's reading of a large float tensor (numpy counts those: bytes.count
    is 3x slower there, and a memoryview has none).
    """
    if len(text) < _NUMPY_COUNT_BYTES:
        quotes = (text if type(text) is bytes else bytes(text)).count(b'"')
    else:
        quotes = int(np.count_nonzero(np.frombuffer(text, np.uint8) == _QUOTE))
    if quotes <= 2 * _quoted(document):
        return document
    try:  # json, as it reads NaN and the infinities too (python-rapidjson crashed with an object keeping firsts)
        return json.loads(bytes(text), object_pairs_hook=_first_value_object)
    except (ValueError, RecursionError):  # what only rapidjson reads (`Inf`, `-NaN`): its reading stands
        return document


def _quoted(document: Any) -> int:
    """How many quoted strings (keys and values) the JSON text of `document` has, a list's items taken as its first's.

    The items of a list are all of one type in a document worth reading: a list whose first item is a number is
    taken to have no strings, one whose first is a string to have only strings. A loop, not a recursion: orjson
    reads documents nested 1024 deep.
    """
    count = 0
    pending = [document]
    while pending:
        value = pending.pop()
        if type(value) is dict:
            count += len(value)
            pending.extend(value.values())
        elif type(value) is list and value:
            first = value[0]
            if type(first) is str:
                count += len(value)
            elif type(first) is dict or type(first) is list:
                pending.extend(value)
        elif type(value) is str:
            count += 1
    return count


def _first_value_object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """A JSON object of these pairs, a repeated key with its first value."""
    members: Dict[str, Any] = {}
    for key, value in pairs:
        members.setdefault(key, value)
    return members


def dumps(document: Any) -> bytes:
    """`document` as JSON text (numpy arrays and scalars as their values); NaN and infinities spelled out."""
    text = orjson.dumps(document, option=_OPTIONS)
    return text if text.find(b"null") < 0 else _spelled_out(document, text)


def _spelled_out(document: Any, text: bytes) -> bytes:
    """`text`, orjson's writing of `document` with a `null` in it, again with non-finite floats spelled out if any.

    Non-finite floats inside numpy arrays (a JSON tensor's data: perf_analyzer's random FP32 data has some in
    most large tensors) stay with orjson, their `null`s replaced; python-rapidjson writes the rest, 20x slower.
    """
    if not _has_non_finite(document):
        return text
    arrays: List[np.ndarray] = []
    mark = secrets.token_hex(8)
    stripped = _without_non_finite_arrays(document, arrays, mark)
    if _has_non_finite(stripped):  # a non-finite scalar or list item: rare
        import rapidjson

        return rapidjson.dumps(document, number_mode=rapidjson.NM_NAN, ensure_ascii=False, default=_plain).encode()
    written = orjson.dumps(stripped, option=_OPTIONS)
    for index, array in enumerate(arrays):
        written = written.replace(b'"%s-%d"' % (mark.encode(), index), _array_spelled_out(array), 1)
    return written


def _without_non_finite_arrays(value: Any, arrays: List[np.ndarray], mark: str) -> Any:
    """`value` with each float array holding a non-finite value replaced by the string `mark-N` (N: its index)."""
    if isinstance(value, dict):
        return {key: _without_non_finite_arrays(item, arrays, mark) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_non_finite_arrays(item, arrays, mark) for item in value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not bool(np.isfinite(value).all()):
        arrays.append(value)
        return f"{mark}-{len(arrays) - 1}"
    return value


def _array_spelled_out(array: np.ndarray) -> bytes:
    """The text orjson writes for a float array, its `null`s (non-finite values) spelled out as Triton writes them."""
    pieces = orjson.dumps(array, option=_OPTIONS).split(b"null")
    odd = array[~np.isfinite(array)]  # row-major, as orjson writes them
    tokens = [b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity" for value in odd.tolist()]
    out = [pieces[0]]
    for token, piece in zip(tokens, pieces[1:]):
        out += (token, piece)
    return b"".join(out)


def _has_non_finite(value: Any) -> bool:
    """Whether a float in `value` (a document of dicts, lists, numpy arrays and scalars) is NaN or infinite."""
    if isinstance(value, dict):
        return any(_has_non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(item) for item in value)
    if isinstance(value, (float, np.floating)):
        return not np.isfinite(value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return not bool(np.isfinite(value).all())
    return False


def _plain(value: Any) -> Any:
    """What rapidjson cannot write itself: numpy arrays as lists, numpy scalars as Python numbers."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
