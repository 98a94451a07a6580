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

import secrets
from typing import Any, List, Union

import numpy as np
import orjson

Text = Union[bytes, bytearray, memoryview]
OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_BOM = b"\xef\xbb\xbf"
# What every non-finite token Triton reads begins with (after its sign).
_NON_FINITE_STARTS = (b"NaN", b"Inf")


class JsonError(ValueError):
    """Text that is not a JSON document; the message is orjson's (where and why)."""


def loads(data: Text, after_mark: bool = False) -> Any:
    """The document `data` holds, NaN and infinities included, after a UTF-8 byte order mark if it has one.

    `after_mark`: `data` is what followed one (a second is no more taken than by Triton). What follows a NUL byte
    is not read, as Triton does not read it: a C client's NUL-terminated text, or a binary request whose
    Inference-Header-Content-Length runs into its tensors' bytes (then found short of them).

    Raises:
        JsonError: it is not JSON (with or without those tokens).
    """
    try:
        return orjson.loads(data)
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
            return rapidjson.loads(text, number_mode=rapidjson.NM_NAN)
        except (ValueError, RecursionError):  # its parse errors; RecursionError: nested past its depth limit
            pass
    raise JsonError(refusal)


def dumps(document: Any) -> bytes:
    """`document` as JSON text (numpy arrays and scalars as their values); NaN and infinities spelled out."""
    text = orjson.dumps(document, option=OPTIONS)
    return text if text.find(b"null") < 0 else _spelled_out(document, text)


def _spelled_out(document: Any, text: bytes) -> bytes:
    """`text`, orjson's writing of `document` with a `null` in it, again with non-finite floats spelled out if any.

    Non-finite floats inside numpy arrays (a JSON tensor's data: perf_analyzer's random FP32 data has some in
    most large tensors) stay with orjson, their `null`s replaced; python-rapidjson writes the rest, 20x slower.
    """
    if not has_non_finite(document):
        return text
    arrays: List[np.ndarray] = []
    mark = secrets.token_hex(8)
    stripped = _without_non_finite_arrays(document, arrays, mark)
    if has_non_finite(stripped):  # a non-finite scalar or list item: rare
        import rapidjson

        return rapidjson.dumps(document, number_mode=rapidjson.NM_NAN, ensure_ascii=False, default=_plain).encode()
    written = orjson.dumps(stripped, option=OPTIONS)
    for index, array in enumerate(arrays):
        written = written.replace(b'"%s-%d"' % (mark.encode(), index), array_spelled_out(array), 1)
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


def array_spelled_out(array: np.ndarray) -> bytes:
    """The text orjson writes for a float array, its `null`s (non-finite values) spelled out as Triton writes them."""
    pieces = orjson.dumps(array, option=OPTIONS).split(b"null")
    odd = array[~np.isfinite(array)]  # row-major, as orjson writes them
    tokens = [b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity" for value in odd.tolist()]
    out = [pieces[0]]
    for token, piece in zip(tokens, pieces[1:]):
        out += (token, piece)
    return b"".join(out)


def has_non_finite(value: Any) -> bool:
    """Whether a float in `value` (a document of dicts, lists, numpy arrays and scalars) is NaN or infinite."""
    if isinstance(value, dict):
        return any(has_non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(has_non_finite(item) for item in value)
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
