"""User-facing model configuration."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from pytriton.model_config.common import DynamicBatcher, ModelWarmup
from pytriton.model_config.sequence import SequenceBatcher


@dataclasses.dataclass
class ModelConfig:
    """Additional model configuration for serving a model.

    Args:
        batching: whether the model accepts a batch axis (max_batch_size > 0 on the wire).
        max_batch_size: the largest batch the model is given.
        batcher: dynamic batching configuration.
        response_cache: whether responses are cached (needs TritonConfig.cache_config).
        decoupled: whether the model streams zero, one or many responses per request.
        model_warmup: requests each instance runs before the model reports ready (a failure is logged only).
        sequence_batcher: Triton's sequence batcher for a stateful model, in place of `batcher` (see
            docs/inference_callables.md, "Stateful models").
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: Optional[List[ModelWarmup]] = None
    sequence_batcher: Optional[SequenceBatcher] = None
