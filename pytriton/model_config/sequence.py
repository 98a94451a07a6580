"""Sequence batching configuration (Triton's ModelSequenceBatching): stateful models, one slot per live sequence."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, List, Optional, Sequence

# Triton's default when max_sequence_idle_microseconds is 0 or unset.
DEFAULT_SEQUENCE_IDLE_MICROSECONDS = 1_000_000


class SequenceControlKind(enum.Enum):
    """What a control input tells the model (Triton's ModelSequenceBatching.Control.Kind)."""

    CONTROL_SEQUENCE_START = "CONTROL_SEQUENCE_START"
    CONTROL_SEQUENCE_READY = "CONTROL_SEQUENCE_READY"
    CONTROL_SEQUENCE_END = "CONTROL_SEQUENCE_END"
    CONTROL_SEQUENCE_CORRID = "CONTROL_SEQUENCE_CORRID"


@dataclasses.dataclass
class SequenceControlInput:
    """An input the sequence batcher adds to each request the callable gets (Triton's ControlInput).

    START, END and READY carry a false and a true value: exactly one of `int32_false_true` (np.int32),
    `fp32_false_true` (np.float32) or `bool_false_true` (np.bool_), two values each. CORRID carries the
    sequence id, of `data_type` np.uint64, np.int64, np.uint32, np.int32 or bytes (string ids).

    Examples:
        SequenceControlInput("START", SequenceControlKind.CONTROL_SEQUENCE_START, int32_false_true=[0, 1])
        SequenceControlInput("CORRID", SequenceControlKind.CONTROL_SEQUENCE_CORRID, data_type=np.uint64)
    """

    name: str
    kind: SequenceControlKind
    int32_false_true: Optional[Sequence[int]] = None
    fp32_false_true: Optional[Sequence[float]] = None
    bool_false_true: Optional[Sequence[bool]] = None
    data_type: Any = None


@dataclasses.dataclass
class SequenceStrategyDirect:
    """Each sequence keeps one slot of one instance; a batch holds at most one request of each slot.

    A batch runs once `minimum_slot_utilization` of the instance's slots have a request ready (every slot
    when 0), or once its oldest request has waited `max_queue_delay_microseconds` (at once when 0).
    """

    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0


@dataclasses.dataclass
class SequenceStrategyOldest:
    """Each instance batches its oldest candidate sequences (at most one request of each) as the dynamic batcher.

    `max_candidate_sequences` slots per instance (max_batch_size when 0); a batch runs at max_batch_size, at a
    preferred size, or once its oldest request has waited `max_queue_delay_microseconds`.
    """

    max_candidate_sequences: int = 0
    preferred_batch_size: Optional[List[int]] = None
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False


@dataclasses.dataclass
class SequenceBatcher:
    """Triton's sequence batcher for a stateful model (instead of the dynamic batcher).

    Requests carry `sequence_id`, `sequence_start` and `sequence_end`; each live sequence holds one slot of
    one instance until its END request ran or it was idle `max_sequence_idle_microseconds`. Set one of
    `direct` and `oldest` (neither: direct, as Triton). Implicit state (`state`) is not supported: keep
    state in `request.sequence_state`.
    """

    direct: Optional[SequenceStrategyDirect] = None
    oldest: Optional[SequenceStrategyOldest] = None
    max_sequence_idle_microseconds: int = DEFAULT_SEQUENCE_IDLE_MICROSECONDS
    control_inputs: List[SequenceControlInput] = dataclasses.field(default_factory=list)
    state: Optional[List[Any]] = None
