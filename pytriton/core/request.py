"""The engine's own request and response objects, independent of the transport."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

# Request parameters Triton consumes itself; they are not handed to the callable.
# Triton's docs reserve "headers" too, but tritonserver 2.51 hands it to the model as any other parameter.
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
ShapeKey = Tuple[Tuple[str, Tuple[int, ...]], ...]
# A request's sequence parameters: (sequence_id, sequence_start, sequence_end); the id is 0 or "" when not given.
SequenceMark = Tuple[Union[int, str], bool, bool]
# The one `triton_` parameter clients may send.
EMPTY_FINAL_RESPONSE_PARAMETER = "triton_enable_empty_final_response"


class InferenceRequest:
    """A decoded, validated request for one model."""

    __slots__ = (
        "_shape_key",
        "arrival_ns",
        "batch_size",
        "compute_sink",
        "id",
        "inputs",
        "live_sequence",
        "origin",
        "parameters",
        "priority",
        "requested_outputs",
        "sequence",
        "timeout_us",
    )

    def __init__(
        self,
        *,
        request_id: str,
        inputs: Dict[str, np.ndarray],
        parameters: Dict[str, Any],
        requested_outputs: Optional[List[str]],
        batch_size: int,
        priority: int = 0,
        timeout_us: int = 0,
        arrival_ns: int = 0,
        sequence: Optional[SequenceMark] = None,
    ) -> None:
        """Create a request; `parameters` are what the callable sees, `sequence` its sequence parameters if any."""
        self.id = request_id
        self.inputs = inputs
        self.parameters = parameters
        self.requested_outputs = requested_outputs
        self.batch_size = batch_size
        self.priority = priority
        self.timeout_us = timeout_us
        self.arrival_ns = arrival_ns
        self.sequence = sequence
        self.live_sequence: Any = None  # the sequence it belongs to, once a sequence batcher admitted it
        # An inner call's (core/composition/): the models on its way in, its deadline (monotonic ns, 0: none) and
        # the span of its caller's request (None: not traced).
        self.origin: Optional[Tuple[Tuple[str, ...], int, Any]] = None
        # An ensemble step's: the ensemble's request adds the step's compute times (input, infer, output ns) here.
        self.compute_sink: Optional[List[int]] = None
        self._shape_key: Optional[ShapeKey] = None

    @property
    def shape_key(self) -> ShapeKey:
        """Requests batch together only when their non-batch dims agree (Triton's rule); computed when first asked.

        Names and shapes only: an input's dtype follows from its datatype, which the model fixes.
        """
        key = self._shape_key
        if key is None:
            key = self._shape_key = tuple([(name, array.shape[1:]) for name, array in self.inputs.items()])
        return key


class OutputTensor:
    """One output ready for the wire: name, protocol datatype, array."""

    __slots__ = ("array", "datatype", "name")

    def __init__(self, name: str, datatype: str, array: np.ndarray) -> None:
        """Create an output tensor."""
        self.name = name
        self.datatype = datatype
        self.array = array


class InferenceResponse:
    """A response: its outputs in wire order, whether it is the final one of its request, and its parameters.

    `parameters` are an ensemble's (Triton's `sequence_id`, `sequence_start` and `sequence_end` of the step
    requests that made its outputs); a callable's responses carry none.
    """

    __slots__ = ("final", "outputs", "parameters")

    def __init__(
        self, outputs: List[OutputTensor], final: bool = True, parameters: Optional[Dict[str, Any]] = None
    ) -> None:
        """Create a response."""
        self.outputs = outputs
        self.final = final
        self.parameters = parameters

    def nbytes(self) -> int:
        """Approximate size in bytes (for the response cache, and a stream's backlog: once per streamed response)."""
        size = 0
        for output in self.outputs:  # a loop, not sum() over a generator: a frame less per call
            array = output.array
            size += array.nbytes + len(output.name)
            if array.dtype.kind == "O":  # a bytes output's nbytes counts its pointers, not the bytes they hold
                size += _held_bytes(array)
        return size


def _held_bytes(array: np.ndarray) -> int:
    """The bytes an object array's elements hold (bytes and str; other objects count as their pointer alone).

    Without them a stream of 64 KiB texts counted 8 bytes a response against its backlog's bytes bound.
    """
    return sum(len(item) for item in array.flat if isinstance(item, (bytes, str)))
