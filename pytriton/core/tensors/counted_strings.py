"""A long BYTES output's wire size, counted in the instance thread that returned it rather than on the event loop.

A response's outputs are checked against `max_response_bytes` on the loop (core/outputs.py), and a BYTES output's
size is the length of each of its elements: one C call over the whole object array, which holds the GIL (a million
strings: 13-21 ms of the loop). The instance thread that ran the callable counts an object array of
COUNTED_ELEMENTS or more as it hands the result over (host_arrays.host_step: `count_ahead`); the loop takes that
count (`counted`), or counts an array nobody counted ahead (an async callable's, a process instance's).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Dict, Tuple

import numpy as np

COUNTED_ELEMENTS = 16384

# Counts by the array's id, with a weak reference to it: the entry is the array's only while it lives, and leaves
# when the loop takes it or the array dies. Set in instance threads, taken on the loop (dict operations are atomic).
_COUNTED: Dict[int, Tuple[Any, int]] = {}


def bytes_of_object_array(array: np.ndarray) -> int:
    """Wire size of a BYTES output: a 4-byte length and the bytes of each element."""
    try:
        return 4 * array.size + sum(map(len, array.flat))
    except TypeError:  # elements without a length are serialized as text: count them roughly
        return int(array.nbytes)


def count_ahead(array: np.ndarray) -> None:
    """Count an object array the callable returned, now, if it is long: the loop then takes the count (`counted`)."""
    if array.size < COUNTED_ELEMENTS:
        return
    key = id(array)
    _COUNTED[key] = (weakref.ref(array, functools.partial(_forget, key)), bytes_of_object_array(array))


def counted(array: np.ndarray) -> int:
    """`bytes_of_object_array(array)`: the count made ahead, when there is one."""
    if array.size >= COUNTED_ELEMENTS:
        entry = _COUNTED.pop(id(array), None)
        if entry is not None and entry[0]() is array:
            return entry[1]
    return bytes_of_object_array(array)


def _forget(key: int, gone: Any) -> None:
    """An array counted ahead died before its count was taken: its entry goes (unless another array's took its id)."""
    entry = _COUNTED.get(key)
    if entry is not None and entry[0] is gone:
        _COUNTED.pop(key, None)
