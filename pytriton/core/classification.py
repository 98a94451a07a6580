"""Triton's classification extension: an output asked for as its top classes, "value:index" strings, best first.

A request names it per output (HTTP `parameters.classification`, gRPC `classification` of
InferRequestedOutputTensor, which tritonclient's `class_count` sets): the output then goes out as BYTES,
`count` strings of its highest values and their positions in each batch row (shape [batch, count]), or in
the whole tensor for a model without batching (shape [count]). Values are written as C++'s std::to_string
writes them (floats with six decimals, integers whole, a NaN with its sign bit "-nan"), as Triton does. An
output with labels (Tensor's `labels` or `label_filename`) gets "value:index:label", the label of that index;
an index past the last label, or whose label is empty, gets "value:index", as in Triton.

Triton orders a row's positions with libstdc++'s std::sort and `a > b`, which is not stable: equal values (and
NaN, which is neither above nor below) come in the order that algorithm leaves them, which `_libstdcxx_sort`
follows step by step for the rows that need it, of up to TRITON_ORDER_MAX_VALUES values; a longer row's equal
values come by position (a difference from Triton, which only such rows with ties among their top classes, or
a NaN, show).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import OutputTensor

_NUMERIC_KINDS = "iuf"
# The datatypes tritonserver 2.51 ranks (its classification extension refuses FP16, BF16, BOOL and BYTES).
_RANKED = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"))
# libstdc++'s _S_threshold: the ranges its introsort leaves to the final insertion sort.
_THRESHOLD = 16
# Longest row ordered as std::sort leaves it (`_libstdcxx_sort`, Python: about 4 us a value, on the event loop);
# a longer one is ordered highest first, equal values by position. Each row took it, so that an output of a
# million equal values held the loop for 4 s (a 64 MiB one, minutes) while every other client waited.
TRITON_ORDER_MAX_VALUES = 1 << 14

_Before = Callable[[int, int], bool]


def _insertion_sort(order: List[int], first: int, last: int, before: _Before) -> None:
    """std::__insertion_sort over order[first:last]."""
    for i in range(first + 1, last):
        value = order[i]
        if before(value, order[first]):
            order[first + 1 : i + 1] = order[first:i]
            order[first] = value
        else:
            _linear_insert(order, i, before)


def _linear_insert(order: List[int], last: int, before: _Before) -> None:
    """std::__unguarded_linear_insert (stopping at the start, where C++ would read before the range)."""
    value = order[last]
    while last > 0 and before(value, order[last - 1]):
        order[last] = order[last - 1]
        last -= 1
    order[last] = value


def _move_median_to_first(order: List[int], result: int, a: int, b: int, c: int, before: _Before) -> None:
    """std::__move_median_to_first: the median of a, b and c swapped into `result`."""
    va, vb, vc = order[a], order[b], order[c]
    if before(va, vb):
        chosen = b if before(vb, vc) else c if before(va, vc) else a
    else:
        chosen = a if before(va, vc) else c if before(vb, vc) else b
    order[result], order[chosen] = order[chosen], order[result]


def _unguarded_partition(order: List[int], first: int, last: int, pivot: int, before: _Before) -> int:
    """std::__unguarded_partition of order[first:last] around order[pivot] (bounded where C++ is not)."""
    pivot_value = order[pivot]
    end = last
    while True:
        while first < end and before(order[first], pivot_value):
            first += 1
        last -= 1
        while last > 0 and before(pivot_value, order[last]):
            last -= 1
        if not first < last:
            return first
        order[first], order[last] = order[last], order[first]
        first += 1


def _adjust_heap(order: List[int], base: int, hole: int, length: int, value: int, before: _Before) -> None:
    """std::__adjust_heap then std::__push_heap, on the heap order[base:base + length]."""
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if before(order[base + child], order[base + child - 1]):
            child -= 1
        order[base + hole] = order[base + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        order[base + hole] = order[base + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and before(order[base + parent], value):
        order[base + hole] = order[base + parent]
        hole = parent
        parent = (hole - 1) // 2
    order[base + hole] = value


def _heap_sort(order: List[int], first: int, last: int, before: _Before) -> None:
    """std::__partial_sort(first, last, last): std::__make_heap, then std::__sort_heap."""
    length = last - first
    if length >= 2:
        for parent in range((length - 2) // 2, -1, -1):
            _adjust_heap(order, first, parent, length, order[first + parent], before)
    while last - first > 1:
        last -= 1
        value = order[last]
        order[last] = order[first]
        _adjust_heap(order, first, 0, last - first, value, before)


def _introsort_loop(order: List[int], first: int, last: int, depth: int, before: _Before) -> None:
    """std::__introsort_loop: quicksort down to ranges of 16, heapsort past the depth limit."""
    while last - first > _THRESHOLD:
        if depth == 0:
            _heap_sort(order, first, last, before)
            return
        depth -= 1
        _move_median_to_first(order, first, first + 1, first + (last - first) // 2, last - 1, before)
        cut = _unguarded_partition(order, first + 1, last, first, before)
        _introsort_loop(order, cut, last, depth, before)
        last = cut


def _libstdcxx_sort(values: Sequence[float]) -> List[int]:
    """The positions of `values` in the order libstdc++'s std::sort leaves them with `values[a] > values[b]`."""
    count = len(values)
    order = list(range(count))
    if count < 2:
        return order

    def before(a: int, b: int) -> bool:
        return values[a] > values[b]

    _introsort_loop(order, 0, count, 2 * (count.bit_length() - 1), before)
    if count > _THRESHOLD:  # std::__final_insertion_sort
        _insertion_sort(order, 0, _THRESHOLD, before)
        for i in range(_THRESHOLD, count):
            _linear_insert(order, i, before)
    else:
        _insertion_sort(order, 0, count, before)
    return order


def _needs_triton_order(rows: np.ndarray, taken: int) -> np.ndarray:
    """Per row: whether its `taken` top positions depend on the order std::sort leaves, not on the values alone.

    They do where one of the `taken` highest values occurs more than once in the row (equal values come in
    that algorithm's order, not by position) or where the row holds a NaN (neither above nor below any value).
    Equal values below them change nothing: the top positions are those of the only values that high.
    """
    if rows.shape[1] < 2:
        return np.zeros(rows.shape[0], dtype=bool)
    ordered = np.sort(rows, axis=1)
    top = ordered[:, ::-1][:, : taken + 1]  # (NaN sorts last: first here, and flagged below anyway)
    flagged: np.ndarray = (top[:, 1:] == top[:, :-1]).any(axis=1)
    if rows.dtype.kind == "f":
        flagged |= np.isnan(ordered[:, -1])  # numpy sorts NaN last
    return flagged


def _highest(row: np.ndarray, taken: int) -> np.ndarray:
    """The positions of the row's `taken` highest values, highest first, equal values by position (NaN highest).

    Only the candidates are sorted: a partition finds the `taken`-th highest value in linear time, where sorting a
    64 MiB row took seconds of the event loop (a row with a NaN still is: NaN has no place in a partition).
    """
    count = row.shape[0]
    if 0 < taken < count and not (row.dtype.kind == "f" and np.isnan(row).any()):
        bound = np.partition(row, count - taken)[count - taken]
        above = np.flatnonzero(row > bound)
        candidates = np.sort(np.concatenate([above, np.flatnonzero(row == bound)[: taken - above.shape[0]]]))
    else:
        candidates = np.arange(count)
    # Highest first, equal values by position: sorting the reversed candidates ascending needs no negation.
    last = candidates.shape[0] - 1
    best: np.ndarray = candidates[(last - np.argsort(row[candidates][::-1], kind="stable"))[::-1][:taken]]
    return best


def _float_text(value: float) -> str:
    """A float as std::to_string (printf's %f) writes it: a NaN with its sign bit set is "-nan"."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{value:f}"


def top_classes(
    output: OutputTensor, count: int, batched: bool, model: str, labels: Optional[Sequence[str]] = None
) -> OutputTensor:
    """The output as its `count` top classes (fewer when it has fewer values), labelled when `labels` are given."""
    array = output.array
    if output.datatype not in _RANKED or array.dtype.kind not in _NUMERIC_KINDS:
        # Triton's words (BOOL and BYTES have no order); it finds out once the model answered, as the response's
        # error (`in_response`)
        error = InferenceError.invalid(
            f"class result not available for output due to unsupported type '{output.datatype}'"
        )
        error.in_response = True
        raise error
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    taken = min(count, rows.shape[1])
    as_float = array.dtype.kind == "f"
    classes = np.empty((rows.shape[0], taken), dtype=np.object_)
    in_triton_order = _needs_triton_order(rows, taken) if rows.shape[1] <= TRITON_ORDER_MAX_VALUES else None
    for index, row in enumerate(rows):
        if in_triton_order is not None and in_triton_order[index]:
            best = np.array(_libstdcxx_sort(row.tolist())[:taken], dtype=np.int64)
        else:
            best = _highest(row, taken)
        values = row[best].tolist()
        positions = best.tolist()
        texts = [
            f"{_float_text(value)}:{position}" if as_float else f"{value}:{position}"
            for value, position in zip(values, positions)
        ]
        if labels:
            texts = [
                f"{text}:{labels[position]}" if position < len(labels) and labels[position] else text
                for text, position in zip(texts, positions)
            ]
        classes[index] = [text.encode() for text in texts]
    return OutputTensor(output.name, "BYTES", classes if batched else classes.reshape(taken))
