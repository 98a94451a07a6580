"""Internal, resolved model configuration (what the engine and the decorators see)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

from pytriton.model_config.common import DeviceKind, DynamicBatcher, ModelWarmup
from pytriton.model_config.sequence import SequenceBatcher


@dataclasses.dataclass
class ResponseCache:
    """Model response cache configuration."""

    enable: bool


@dataclasses.dataclass
class TensorSpec:
    """A named tensor: name, shape without batch axis, numpy scalar type, optional flag."""

    name: str
    shape: tuple  # type: ignore[type-arg]
    dtype: Any
    optional: Optional[bool] = False


@dataclasses.dataclass
class TritonModelConfig:
    """Resolved model configuration, as PyTriton's TritonModelConfig."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: Optional[DynamicBatcher] = None
    instance_group: Dict[DeviceKind, Optional[int]] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: Dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Optional[Sequence[TensorSpec]] = None
    outputs: Optional[Sequence[TensorSpec]] = None
    response_cache: Optional[ResponseCache] = None
    model_warmup: Optional[List[ModelWarmup]] = None
    sequence_batcher: Optional[SequenceBatcher] = None

    @property
    def backend(self) -> str:
        """The backend name Triton shows for PyTriton models."""
        return "python"
