"""Model config parsing: the server's model_config.proto as JSON (HTTP, or gRPC as_json) to TritonModelConfig."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.model_config.common import DeviceKind, DynamicBatcher, QueuePolicy, TimeoutAction
from pytriton.model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig


def config_from_reply(reply: Any, is_grpc: bool) -> TritonModelConfig:
    """The model config of a `get_model_config` reply (gRPC's JSON wraps it in {"config": ...})."""
    return parse_model_config(reply["config"] if is_grpc else reply)


def parse_model_config(config: Mapping[str, Any]) -> TritonModelConfig:
    """Build a TritonModelConfig from a config document; absent fields take protobuf defaults (gRPC omits them)."""
    max_batch_size = int(config.get("max_batch_size", 0))
    batcher = config.get("dynamic_batching")
    parameters = config.get("parameters") or {}
    cache = config.get("response_cache")
    return TritonModelConfig(
        model_name=str(config.get("name", "")),
        max_batch_size=max_batch_size,
        batching=max_batch_size > 0,
        batcher=_parse_batcher(batcher) if batcher is not None else None,
        instance_group={
            DeviceKind(group.get("kind", DeviceKind.KIND_AUTO.value)): group.get("count")
            for group in config.get("instance_group", [])
        },
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        backend_parameters={name: value.get("string_value", "") for name, value in parameters.items()},
        inputs=[_parse_tensor(tensor) for tensor in config.get("input", [])] or None,
        outputs=[_parse_tensor(tensor) for tensor in config.get("output", [])] or None,
        response_cache=ResponseCache(enable=bool(cache.get("enable", False))) if cache else None,
    )


def _parse_tensor(tensor: Mapping[str, Any]) -> TensorSpec:
    """A ModelInput or ModelOutput message as a TensorSpec."""
    return TensorSpec(
        name=str(tensor["name"]),
        shape=tuple(int(dim) for dim in tensor.get("dims", [])),
        dtype=_numpy_type(str(tensor.get("data_type", ""))),
        optional=bool(tensor.get("optional", False)),
    )


def _numpy_type(data_type: str) -> Any:
    """TYPE_FP32 -> np.float32; TYPE_STRING -> np.bytes_; TYPE_BOOL -> np.dtype("bool")."""
    name = data_type[len("TYPE_") :] if data_type.startswith("TYPE_") else data_type
    if name == "STRING":
        return np.bytes_
    dtype = triton_to_np_dtype(name)
    if dtype is None:
        raise PyTritonClientInferenceServerError(f"Unsupported data type {data_type!r} in the model config")
    return np.dtype("bool") if dtype is bool else dtype  # as nvidia-pytriton's parser gives it


def _parse_batcher(batcher: Mapping[str, Any]) -> DynamicBatcher:
    """A ModelDynamicBatching message as a DynamicBatcher."""
    default_policy = batcher.get("default_queue_policy")
    priority_policies: Dict[str, Any] = batcher.get("priority_queue_policy") or {}
    preferred = [int(size) for size in batcher.get("preferred_batch_size", [])]
    return DynamicBatcher(
        max_queue_delay_microseconds=int(batcher.get("max_queue_delay_microseconds", 0)),
        preferred_batch_size=preferred or None,
        preserve_ordering=bool(batcher.get("preserve_ordering", False)),
        priority_levels=int(batcher.get("priority_levels", 0)),
        default_priority_level=int(batcher.get("default_priority_level", 0)),
        default_queue_policy=_policy(default_policy) if default_policy is not None else None,
        priority_queue_policy={int(level): _policy(policy) for level, policy in priority_policies.items()} or None,
    )


def _policy(policy: Mapping[str, Any]) -> QueuePolicy:
    """A ModelQueuePolicy message as a QueuePolicy."""
    return QueuePolicy(
        timeout_action=TimeoutAction(policy.get("timeout_action", TimeoutAction.REJECT.value)),
        default_timeout_microseconds=int(policy.get("default_timeout_microseconds", 0)),
        allow_timeout_override=bool(policy.get("allow_timeout_override", False)),
        max_queue_size=int(policy.get("max_queue_size", 0)),
    )
