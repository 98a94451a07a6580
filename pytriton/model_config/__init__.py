"""Model configuration: tensors, batching, queue policies."""

from pytriton.model_config.common import DeviceKind, DynamicBatcher, QueuePolicy, TimeoutAction
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor

__all__ = ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TimeoutAction"]
