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

from typing import Optional, Sequence

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import OutputTensor

_NUMERIC_KINDS = "iuf"


def top_classes(
    output: OutputTensor, count: int, batched: bool, model: str, labels: Optional[Sequence[str]] = None
) -> OutputTensor:
    """The output as its `count` top classes (fewer when it has fewer values), labelled when `labels` are given."""
    array = output.array
    if array.dtype.kind not in _NUMERIC_KINDS:
        raise InferenceError.invalid(  # tritonserver 2.51's words (BOOL and BYTES have no order)
            f"class result not available for output due to unsupported type '{output.datatype}'"
        )
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    taken = min(count, rows.shape[1])
    as_float = array.dtype.kind == "f"
    classes = np.empty((rows.shape[0], taken), dtype=np.object_)
    last = rows.shape[1] - 1
    ranks = np.where(np.isnan(rows), -np.inf, rows) if as_float and np.isnan(rows).any() else rows
    for index, row in enumerate(rows):
        # Highest first, ties by position; sorting the reversed row ascending needs no negation (no overflow).
        # NaN ranks last, as tritonserver 2.51 ranks it (numpy would sort it above every number).
        best = (last - np.argsort(ranks[index][::-1], kind="stable"))[::-1][:taken]
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
