"""JSON read and written a piece at a time, for documents too large for one call to hold the GIL through.

orjson holds the GIL while it parses or writes: a 100 MB infer request's JSON (16 Mi FP32 values) is 0.6 s of
one call, during which no other thread runs, the event loop's included, even when the call is made in a worker
thread. Here a large document's arrays of scalars (a tensor's `data`: numbers, strings, or lists of them, as a
nested shape has) are cut out, the rest parsed as one small document, and each array parsed a few thousand values
at a time: between two pieces the worker's GIL goes to the loop at the interpreter's switch interval. Writing
works the other way: the large arrays of a document are written a slice at a time and set into the rest.

The result is what `json_text.loads` / `json_text.dumps` give for the whole document, byte for byte: anything the
cutting does not know for sure (text that is not JSON, NaN or Infinity tokens, nesting deeper than a tensor's,
a scalar that is not finite) is handed to them whole, so their answers and refusals are the same.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import orjson

from pytriton.protocol import json_text

# Values parsed or written in one call (a few hundred µs of orjson each, for numbers).
PIECE_VALUES = 4096
# An array of scalars this long in text, or more, is parsed in pieces; shorter ones stay in the document.
CUT_BYTES = 64 * 1024
# Deeper documents are handed to json_text.loads whole (a tensor's data nests as deep as its shape).
_MOST_DEPTH = 64

_WS = rb"[ \t\n\r]*"  # JSON's whitespace (a regular expression's \s has two more)
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_BARE = rb'[^ \t\n\r,\[\]{}":]+'  # a number, true, false or null (or no JSON: orjson refuses it)
_SCALAR = rb"(?:" + _STRING + rb"|" + _BARE + rb")"
# A short array of scalars, as an element of a nested tensor's data ([[1, 2], [3, 4]]).
_FLAT = rb"\[" + _WS + rb"(?:" + _SCALAR + _WS + rb"(?:," + _WS + _SCALAR + _WS + rb"){0,%d})?\]" % PIECE_VALUES
_ELEMENT = rb"(?:" + _SCALAR + rb"|" + _FLAT + rb")"
# Up to PIECE_VALUES elements of an array, from the first; it ends after the last one's own text.
_RUN = re.compile(_ELEMENT + rb"(?:" + _WS + rb"," + _WS + _ELEMENT + rb"){0,%d}" % (PIECE_VALUES - 1), re.DOTALL)
_SPACE = re.compile(_WS)
_KEY = re.compile(_STRING + _WS + rb":" + _WS, re.DOTALL)
_ONE_SCALAR = re.compile(_SCALAR, re.DOTALL)


class _NotCut(Exception):
    """The text is none the cutting reads for sure: it goes to json_text.loads whole."""


class _Array:
    """An array under way: where it began, its runs of elements, and whether it holds only those."""

    __slots__ = ("runs", "start", "whole")

    def __init__(self, start: int) -> None:
        self.start = start
        self.runs: List[Tuple[int, int]] = []
        self.whole = True  # only runs (scalars, short arrays of them): it may be cut out


# What each kind of value begins with, as the bytes of a text index.
_OBJECT, _ARRAY, _COMMA, _OBJECT_END, _ARRAY_END = b"{[,}]"


def loads(data: json_text.Text) -> Any:
    """`json_text.loads(data)`, its large arrays of scalars parsed a piece at a time (see the module)."""
    try:
        cuts = _cuts(data)
    except _NotCut:
        cuts = []
    if not cuts:
        return json_text.loads(data)
    token = secrets.token_hex(8)
    mark = f"\x01pytriton-{token}-"
    arrays: Dict[str, List[Any]] = {}
    parts: List[Any] = []
    view = memoryview(data)
    previous = 0
    try:
        for index, (start, end, runs) in enumerate(cuts):
            values: List[Any] = []
            for run_start, run_end in runs:
                values.extend(orjson.loads(b"[" + view[run_start:run_end] + b"]"))
            arrays[f"{mark}{index}"] = values
            parts += (view[previous:start], b'"\\u0001pytriton-%s-%d"' % (token.encode(), index))
            previous = end
        parts.append(view[previous:])
        skeleton = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:  # NaN, Infinity, or no JSON: as the whole document is read
        return json_text.loads(data)
    return _filled(skeleton, arrays, mark)


def _cuts(data: json_text.Text) -> List[Tuple[int, int, List[Tuple[int, int]]]]:
    """The large arrays of scalars in `data`: each one's start, end and runs of elements (start, end).

    Raises:
        _NotCut: the text is not JSON as this reads it (it may still be JSON: json_text.loads decides).
    """
    size = len(data)
    stack: List[Optional[_Array]] = []  # None: an object
    cuts: List[Tuple[int, int, List[Tuple[int, int]]]] = []
    pos = _space(data, 0)
    while True:
        # a value begins at pos
        if pos >= size:
            raise _NotCut
        char = data[pos]
        top = stack[-1] if stack else None
        if top is not None and char != _OBJECT:
            if char != _ARRAY:
                numbers_end = _numbers_end(data, pos, size)
                if numbers_end >= 0:  # scalars without strings up to the array's end: cut at commas
                    _comma_runs(data, pos, numbers_end, top.runs)
                    pos = numbers_end
                    char = -1
            if char >= 0:
                run = _RUN.match(data, pos)
                if run is not None:
                    top.runs.append((pos, run.end()))
                    pos = run.end()
                    char = -1
        if char == _OBJECT or char == _ARRAY:
            if top is not None:
                top.whole = False
            if len(stack) >= _MOST_DEPTH:
                raise _NotCut
            opened = pos
            pos = _space(data, pos + 1)
            if char == _OBJECT:
                if pos < size and data[pos] == _OBJECT_END:
                    pos += 1
                else:
                    stack.append(None)
                    pos = _key(data, pos)
                    continue
            elif pos < size and data[pos] == _ARRAY_END:
                pos += 1
            else:
                stack.append(_Array(opened))
                continue
        elif char >= 0:
            if top is not None:
                raise _NotCut
            scalar = _ONE_SCALAR.match(data, pos)
            if scalar is None:
                raise _NotCut
            pos = scalar.end()
        # after a value: a comma, the end of its container, or of the document
        while True:
            pos = _space(data, pos)
            if not stack:
                if pos != size:
                    raise _NotCut
                return cuts
            char = data[pos] if pos < size else -1
            if char == _COMMA:
                pos = _space(data, pos + 1)
                if stack[-1] is None:
                    pos = _key(data, pos)
                break
            container = stack.pop()
            if container is None:
                if char != _OBJECT_END:
                    raise _NotCut
            else:
                if char != _ARRAY_END:
                    raise _NotCut
                if container.whole and pos + 1 - container.start >= CUT_BYTES:
                    cuts.append((container.start, pos + 1, container.runs))
            pos += 1


def _space(data: json_text.Text, pos: int) -> int:
    """The position after the whitespace at `pos`."""
    return _SPACE.match(data, pos).end()  # type: ignore[union-attr]


# The search for the end of a run of numbers goes this far in one call.
_WINDOW = 1 << 20
_STRUCTURE = re.compile(rb'[\[\]{}"]')
_COMMA_AT = re.compile(rb",")
# A run of numbers cut at commas is about this long in text.
_RUN_BYTES = 32 * 1024


def _numbers_end(data: json_text.Text, pos: int, size: int) -> int:
    """Where the array's `]` is when only scalars without strings come up to it from `pos`, else -1."""
    while pos < size:
        found = _STRUCTURE.search(data, pos, min(pos + _WINDOW, size))
        if found is not None:
            return found.start() if data[found.start()] == _ARRAY_END else -1
        pos += _WINDOW
    return -1


def _comma_runs(data: json_text.Text, pos: int, end: int, runs: List[Tuple[int, int]]) -> None:
    """Runs of about _RUN_BYTES from `pos` to `end` (an array's `]`; no strings nor arrays between), at commas."""
    while True:
        comma = _COMMA_AT.search(data, pos + _RUN_BYTES, end) if pos + _RUN_BYTES < end else None
        if comma is None:
            if _space(data, pos) >= end:  # nothing after a comma, or a run of nothing: no JSON (orjson says why)
                raise _NotCut
            runs.append((pos, end))
            return
        runs.append((pos, comma.start()))
        pos = comma.end()


def _key(data: json_text.Text, pos: int) -> int:
    """The position of the value after an object's key at `pos`."""
    key = _KEY.match(data, pos)
    if key is None:
        raise _NotCut
    return key.end()


def _filled(value: Any, arrays: Dict[str, List[Any]], mark: str) -> Any:
    """`value` (the small document) with each mark string replaced by the array it stands for."""
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is str and item.startswith(mark):
                value[key] = arrays.get(item, item)
            elif type(item) in (dict, list):
                _filled(item, arrays, mark)
    elif type(value) is list:
        for index, item in enumerate(value):
            if type(item) is str and item.startswith(mark):
                value[index] = arrays.get(item, item)
            elif type(item) in (dict, list):
                _filled(item, arrays, mark)
    elif type(value) is str and value.startswith(mark):
        return arrays.get(value, value)
    return value


def dumps(document: Any) -> Union[bytes, memoryview]:
    """`json_text.dumps(document)`, its long arrays (numpy arrays, lists of strings) written a slice at a time.

    The text is put together a piece at a time too (one copy of 300 MB is 50 ms of the GIL): a memoryview of a
    numpy buffer, when the document had such arrays. numpy asks the kernel for huge pages for it (a bytearray's
    are 4 KiB), and the buffer is freed on the loop once written: the munmap of a 1.2 GB answer took 85-150 ms
    of 4 KiB pages, about 1 ms of huge ones.
    """
    token = secrets.token_hex(8)
    arrays: List[Any] = []
    skeleton = _marked(document, arrays, token)
    if not arrays or json_text.has_non_finite(skeleton):  # no long array, or a NaN outside one (rapidjson's)
        return json_text.dumps(document)
    text = orjson.dumps(skeleton, option=json_text.OPTIONS)
    pieces: List[bytes] = []
    for index, array in enumerate(arrays):
        mark = b'"%s-%d"' % (token.encode(), index)
        at = text.index(mark)
        pieces.append(text[:at])
        text = text[at + len(mark) :]
        pieces.append(b"[")
        for start in range(0, len(array), PIECE_VALUES):
            piece = array[start : start + PIECE_VALUES]
            written = orjson.dumps(piece, option=json_text.OPTIONS)
            if type(piece) is not list and written.find(b"null") >= 0:  # NaN or infinite values: spelled out
                written = json_text.array_spelled_out(piece)
            if start:
                pieces.append(b",")
            pieces.append(written[1:-1])
        pieces.append(b"]")
    pieces.append(text)
    out = np.empty(sum(map(len, pieces)), np.uint8).data
    at = 0
    for piece in pieces:
        out[at : at + len(piece)] = piece
        at += len(piece)
    return out


def _marked(value: Any, arrays: List[Any], token: str) -> Any:
    """`value` with each long array in it (1-D numeric numpy arrays, lists of strings) replaced by `token-N`."""
    if type(value) is dict:
        return {key: _marked(item, arrays, token) for key, item in value.items()}
    if type(value) is list:
        if len(value) >= PIECE_VALUES and _all_strings(value):
            arrays.append(value)
            return f"{token}-{len(arrays) - 1}"
        return [_marked(item, arrays, token) for item in value]
    if (
        isinstance(value, np.ndarray)
        and value.ndim == 1
        and value.size >= PIECE_VALUES
        and value.dtype.kind in "biuf"
        and value.flags.c_contiguous
    ):
        arrays.append(value)
        return f"{token}-{len(arrays) - 1}"
    return value


def _all_strings(values: List[Any]) -> bool:
    """Whether a list holds only strings, looked at a piece at a time."""
    return all(
        set(map(type, values[start : start + PIECE_VALUES])) == {str} for start in range(0, len(values), PIECE_VALUES)
    )


def release(values: List[Any]) -> None:
    """Empty a list a piece at a time: freed at once, 64 Mi floats held the GIL for 0.3 s, in any thread."""
    while len(values) == 1 and type(values[0]) is list:  # [[...]]: the batch dimension of one
        values = values[0]
    while len(values) > PIECE_VALUES:
        del values[-PIECE_VALUES:]
    values.clear()
