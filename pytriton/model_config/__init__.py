"""Model configuration: tensors, batching, queue policies, warm-up, ensemble steps."""

from pytriton.model_config.common import (
    DeviceKind,
    DynamicBatcher,
    ModelWarmup,
    QueuePolicy,
    TimeoutAction,
    WarmupInput,
)
from pytriton.model_config.ensemble import EnsembleStep
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.sequence import (
    SequenceBatcher,
    SequenceControlInput,
    SequenceControlKind,
    SequenceStrategyDirect,
    SequenceStrategyOldest,
)
from pytriton.model_config.tensor import Tensor

__all__ = [
    "DeviceKind",
    "DynamicBatcher",
    "EnsembleStep",
    "ModelConfig",
    "ModelWarmup",
    "QueuePolicy",
    "SequenceBatcher",
    "SequenceControlInput",
    "SequenceControlKind",
    "SequenceStrategyDirect",
    "SequenceStrategyOldest",
    "Tensor",
    "TimeoutAction",
    "WarmupInput",
]
