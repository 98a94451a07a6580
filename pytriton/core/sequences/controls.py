"""The START, END, READY and CORRID inputs a sequence batcher adds to each request, as Triton's backends see them."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.model_config.sequence import SequenceBatcher, SequenceControlInput, SequenceControlKind


class ControlTensors:
    """The START, END, READY and CORRID inputs the batcher adds to each request, as Triton's backends get them."""

    def __init__(self, model_name: str, config: SequenceBatcher, batching: bool) -> None:
        """Read the control inputs of a sequence batcher config."""
        self._model = model_name
        self._shape = (1, 1) if batching else (1,)
        self._flags: List[Tuple[str, SequenceControlKind, np.ndarray, np.ndarray]] = []
        self._corrid: Optional[Tuple[str, np.dtype]] = None
        for control in config.control_inputs:
            if control.kind is SequenceControlKind.CONTROL_SEQUENCE_CORRID:
                self._corrid = (control.name, corrid_dtype(control.data_type))
            else:
                false, true = _false_true(control)
                self._flags.append((control.name, control.kind, false, true))

    def check_id(self, sequence_id: Union[int, str]) -> None:
        """Refuse an id of a type the CORRID control cannot hold (Triton's message)."""
        if self._corrid is None:
            return
        name, dtype = self._corrid
        is_string = isinstance(sequence_id, str)
        if is_string != (dtype.kind == "O"):
            given = "BYTES" if is_string else "UINT64"
            expected = "BYTES" if dtype.kind == "O" else dtype.name.upper()
            raise InferenceError.invalid(
                f"sequence batching control '{name}' data-type is '{given}', but model '{self._model}' expects "
                f"'{expected}'"
            )

    def add(self, inputs: Dict[str, np.ndarray], sequence_id: Union[int, str], start: bool, end: bool) -> None:
        """Add the control inputs of one request to its inputs."""
        shape = self._shape
        for name, kind, false, true in self._flags:
            if kind is SequenceControlKind.CONTROL_SEQUENCE_START:
                value = true if start else false
            elif kind is SequenceControlKind.CONTROL_SEQUENCE_END:
                value = true if end else false
            else:
                value = true
            inputs[name] = np.full(shape, value, dtype=value.dtype)
        if self._corrid is not None:
            name, dtype = self._corrid
            if isinstance(sequence_id, str):
                array = np.empty(shape, dtype=dtype)
                array.fill(sequence_id.encode())
            else:  # an id too large for a narrower type is cut to its low bits, as Triton's C++ cast does
                array = np.full(shape, sequence_id, dtype=np.uint64).astype(dtype)
            inputs[name] = array


def corrid_dtype(data_type: Any) -> np.dtype:
    """The numpy dtype of a CORRID control: object (bytes) for string ids."""
    if data_type is bytes or data_type is str or data_type is object or data_type is np.bytes_:
        return np.dtype(np.object_)
    dtype: np.dtype = np.dtype(data_type)
    return dtype


def _false_true(control: SequenceControlInput) -> Tuple[np.ndarray, np.ndarray]:
    """A flag control's false and true values, as 0-d arrays of its dtype."""
    values: Sequence[Any]
    dtype: np.dtype
    if control.int32_false_true is not None:
        values, dtype = control.int32_false_true, np.dtype(np.int32)
    elif control.fp32_false_true is not None:
        values, dtype = control.fp32_false_true, np.dtype(np.float32)
    else:
        values, dtype = control.bool_false_true or (False, True), np.dtype(np.bool_)
    false, true = list(values)
    return np.array(false, dtype=dtype), np.array(true, dtype=dtype)
