"""Triton's classification extension: an output asked for as its top classes, "value:index" strings, best first.

A request names it per output (HTTP `parameters.classification`, gRPC `classification` of
InferRequestedOutputTensor, which tritonclient's `class_count` sets): the output then goes out as BYTES,
`count` strings of its highest values and their positions in each batch row (shape [batch, count]), or in
the whole tensor for a model without batching (shape [count]). Values are written as C++'s std::to_string
writes them (floats with six decimals, integers whole), as Triton does. An output with labels (Tensor's
`labels` or `label_filename`) gets "value:index:label", the label of that index; an index past the last label
gets "value:index", as in Triton.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import OutputTensor

_NUMERIC_KINDS = "iuf"
# The datatypes tritonserver 2.51 ranks (its classification extension refuses FP16, BF16, BOOL and BYTES).
_RANKED = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"))
# The longest row libstdc++'s std::sort orders by insertion alone (its _S_threshold).
_INSERTION_ONLY = 16


def _order_with_nan(values: List[float]) -> np.ndarray:
    """The positions of a row holding NaN, best first, as tritonserver 2.51 orders them.

    Triton sorts positions with std::sort and `a > b`, which NaN is neither above nor below: libstdc++ orders a row
    of up to 16 values by insertion, so a NaN stays after the values before it that it was not moved past
    ([0.5, 2.5, NaN, -1] -> 2.5, 0.5, NaN, -1). That is done here step by step; a longer row (introsort: no
    order to follow) ranks NaN last.
    """
    if len(values) > _INSERTION_ONLY:
        ranks = [-math.inf if math.isnan(value) else value for value in values]
        return np.array(sorted(range(len(values)), key=lambda position: -ranks[position]), dtype=np.int64)
    order: List[int] = []
    for position, value in enumerate(values):
        if order and value > values[order[0]]:
            order.insert(0, position)
            continue
        slot = len(order)
        while slot > 0 and value > values[order[slot - 1]]:
            slot -= 1
        order.insert(slot, position)
    return np.array(order, dtype=np.int64)


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
    last = rows.shape[1] - 1
    with_nan = as_float and bool(np.isnan(rows).any())
    for index, row in enumerate(rows):
        if with_nan and np.isnan(row).any():
            best = _order_with_nan(row.tolist())[:taken]
        else:
            # Highest first, ties by position; sorting the reversed row ascending needs no negation (no overflow).
            best = (last - np.argsort(row[::-1], kind="stable"))[::-1][:taken]
        values = row[best].tolist()
        texts = [
            f"{value:f}:{position}" if as_float else f"{value}:{position}"
            for value, position in zip(values, best.tolist())
        ]
        if labels:
            texts = [
                f"{text}:{labels[position]}" if position < len(labels) else text
                for text, position in zip(texts, best.tolist())
            ]
        classes[index] = [text.encode() for text in texts]
    return OutputTensor(output.name, "BYTES", classes if batched else classes.reshape(taken))
