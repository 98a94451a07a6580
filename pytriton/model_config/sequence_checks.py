"""Checks a model's sequence batcher config as Triton checks it at load time, and resolves its defaults."""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence

import numpy as np

from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.sequence import (
    DEFAULT_SEQUENCE_IDLE_MICROSECONDS,
    SequenceBatcher,
    SequenceControlInput,
    SequenceControlKind,
)
from pytriton.model_config.tensor import Tensor

# The dtypes a CORRID control may have (Triton's TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, TYPE_STRING).
CORRID_DTYPES = (np.uint64, np.int64, np.uint32, np.int32, np.bytes_, np.object_)
_BOOLEAN_KINDS = (
    SequenceControlKind.CONTROL_SEQUENCE_START,
    SequenceControlKind.CONTROL_SEQUENCE_END,
    SequenceControlKind.CONTROL_SEQUENCE_READY,
)


def cache_refusal(model_name: str) -> str:
    """Triton's refusal of a model with a sequence batcher and the response cache (model_config_utils.cc)."""
    return (
        f"Response Cache does not currently support model {model_name} with sequence batching scheduler. "
        "Please disable the response cache."
    )


def resolve_sequence_batcher(model_name: str, config: ModelConfig, inputs: Sequence[Tensor]) -> SequenceBatcher:
    """A copy of `config.sequence_batcher` with Triton's defaults; PyTritonModelConfigError for what Triton refuses."""
    given = config.sequence_batcher
    assert given is not None
    if config.response_cache:
        raise PyTritonModelConfigError(cache_refusal(model_name))
    if config.batcher != type(config.batcher)():
        raise PyTritonModelConfigError(
            f"model '{model_name}' sets both a dynamic batcher (batcher) and a sequence batcher (sequence_batcher): "
            "Triton schedules a model with one of them"
        )
    if given.state:
        raise PyTritonModelConfigError(
            f"model '{model_name}': implicit sequence state (SequenceBatcher.state) is not supported; keep a "
            "sequence's state in request.sequence_state instead"
        )
    if given.direct is not None and given.oldest is not None:
        raise PyTritonModelConfigError(
            f"model '{model_name}': a sequence batcher has one strategy, direct or oldest, not both"
        )
    if given.max_sequence_idle_microseconds < 0:
        raise PyTritonModelConfigError("max_sequence_idle_microseconds must be >= 0")
    batcher = copy.deepcopy(given)
    batcher.max_sequence_idle_microseconds = (
        batcher.max_sequence_idle_microseconds or DEFAULT_SEQUENCE_IDLE_MICROSECONDS
    )
    max_batch_size = config.max_batch_size if config.batching else 0
    if batcher.direct is not None:
        _check_direct(model_name, batcher)
    if batcher.oldest is not None:
        _check_oldest(model_name, batcher, max_batch_size)
    _check_controls(model_name, batcher.control_inputs, {tensor.name for tensor in inputs})
    return batcher


def _check_direct(model_name: str, batcher: SequenceBatcher) -> None:
    """Triton's checks of the direct strategy."""
    direct = batcher.direct
    assert direct is not None
    if not 0.0 <= direct.minimum_slot_utilization <= 1.0:
        raise PyTritonModelConfigError(
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model_name}"
        )
    if direct.max_queue_delay_microseconds < 0:
        raise PyTritonModelConfigError("max_queue_delay_microseconds must be >= 0")


def _check_oldest(model_name: str, batcher: SequenceBatcher, max_batch_size: int) -> None:
    """Triton's checks of the oldest strategy; its preferred batch size defaults to max_batch_size."""
    oldest = batcher.oldest
    assert oldest is not None
    if oldest.max_candidate_sequences < 0:
        raise PyTritonModelConfigError("max_candidate_sequences must be >= 0")
    if oldest.max_queue_delay_microseconds < 0:
        raise PyTritonModelConfigError("max_queue_delay_microseconds must be >= 0")
    for size in oldest.preferred_batch_size or []:
        if size <= 0:
            raise PyTritonModelConfigError(f"sequence batching preferred batch size must be positive for {model_name}")
        if size > max_batch_size:
            raise PyTritonModelConfigError(
                f"sequence batching preferred batch size must be <= max batch size for {model_name}"
            )
    if not oldest.preferred_batch_size and max_batch_size > 0:
        oldest.preferred_batch_size = [max_batch_size]


def _check_controls(model_name: str, controls: Sequence[SequenceControlInput], input_names: Any) -> None:
    """Each control: a name that no model input has, one of each kind, its values as Triton requires."""
    seen_kinds = set()
    seen_names = set()
    for control in controls:
        if not isinstance(control.kind, SequenceControlKind):
            raise PyTritonModelConfigError(
                f"sequence batching control kind must be a SequenceControlKind for {model_name}"
            )
        kind = control.kind.value
        if not control.name:
            raise PyTritonModelConfigError(f"sequence batching control tensor must have a name for {kind}")
        if control.name in input_names or control.name in seen_names:
            raise PyTritonModelConfigError(
                f"sequence batching control tensor '{control.name}' of model '{model_name}' has the name of another "
                "input: the batcher adds it to each request"
            )
        if control.kind in seen_kinds:
            raise PyTritonModelConfigError(f"sequence batching specifies multiple {kind} tensors for {model_name}")
        seen_kinds.add(control.kind)
        seen_names.add(control.name)
        if control.kind in _BOOLEAN_KINDS:
            _check_false_true(model_name, control)
        elif _corrid_dtype(control.data_type) is None:
            raise PyTritonModelConfigError(
                f"unexpected data type for control {kind} for {model_name}. Allowed data types are TYPE_UINT64, "
                "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING (np.uint64, np.int64, np.uint32, np.int32, bytes)"
            )


def _check_false_true(model_name: str, control: SequenceControlInput) -> None:
    """A START, END or READY control has exactly one of the three value pairs, of two values."""
    kind = control.kind.value
    given = [
        (field, values)
        for field, values in (
            ("int32_false_true", control.int32_false_true),
            ("fp32_false_true", control.fp32_false_true),
            ("bool_false_true", control.bool_false_true),
        )
        if values is not None
    ]
    if not given:
        raise PyTritonModelConfigError(
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
            f"{kind} for {model_name}"
        )
    if len(given) > 1:
        raise PyTritonModelConfigError(
            f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
            f"'bool_false_true' for {kind} for {model_name}"
        )
    field, values = given[0]
    if len(list(values)) != 2:
        raise PyTritonModelConfigError(
            f"sequence batching control '{field}' must have exactly 2 entries for {kind} for {model_name}"
        )


def _corrid_dtype(dtype: Any) -> Optional[np.dtype]:
    """The numpy dtype a CORRID control's data_type stands for, None when not one Triton allows."""
    if dtype is bytes or dtype is str or dtype is object:
        return np.dtype(np.object_)
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        return None
    return resolved if dtype is not None and resolved.type in CORRID_DTYPES else None
