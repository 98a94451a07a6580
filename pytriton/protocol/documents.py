"""Metadata, model config, statistics and repository documents, as dicts both transports serve."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pytriton.core.datatypes import config_enum
from pytriton.core.model import ServedModel
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.model_config.common import QueuePolicy

EXTENSIONS = [
    "classification_disabled",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "generate",
    "logging",
]


def server_metadata(name: str, version: str) -> Dict[str, Any]:
    """GET /v2: the server id (TritonConfig.id, "triton" by default), version and extensions."""
    return {"name": name, "version": version, "extensions": EXTENSIONS}


def _wire_shape(spec: ModelSpec, tensor: TensorDef) -> List[int]:
    """A tensor's shape in metadata: a leading -1 for the batch axis of batching models."""
    return [-1, *tensor.dims] if spec.batching else list(tensor.dims)


def model_metadata(spec: ModelSpec) -> Dict[str, Any]:
    """GET /v2/models/{m}[/versions/{v}]."""
    return {
        "name": spec.name,
        "versions": [spec.version_str],
        "platform": "python",
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": _wire_shape(spec, t)} for t in spec.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": _wire_shape(spec, t)} for t in spec.outputs],
    }


def _queue_policy(policy: Optional[QueuePolicy]) -> Dict[str, Any]:
    """A ModelQueuePolicy message."""
    policy = policy or QueuePolicy()
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": str(policy.default_timeout_microseconds),
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def _tensor_config(tensor: TensorDef, is_input: bool) -> Dict[str, Any]:
    """A ModelInput / ModelOutput message with every primitive printed."""
    config: Dict[str, Any] = {
        "name": tensor.name,
        "data_type": config_enum(tensor.datatype),
        "dims": [str(dim) for dim in tensor.dims],
        "label_filename": "",
        "is_shape_tensor": False,
    }
    if is_input:
        config.update(
            {
                "format": "FORMAT_NONE",
                "allow_ragged_batch": False,
                "optional": tensor.optional,
                "is_non_linear_format_io": False,
            }
        )
    else:
        config.update({"is_non_linear_format_io": False})
    return config


def model_config(spec: ModelSpec, cache_available: bool) -> Dict[str, Any]:
    """GET .../config: Triton's model_config.proto as JSON (int64 fields as strings, as protobuf prints them)."""
    config: Dict[str, Any] = {
        "name": spec.name,
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": spec.max_batch_size,
        "input": [_tensor_config(tensor, True) for tensor in spec.inputs],
        "output": [_tensor_config(tensor, False) for tensor in spec.outputs],
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
        "instance_group": [
            {
                "name": spec.name,
                "kind": "KIND_CPU",
                "count": spec.instance_count,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
        "model_transaction_policy": {"decoupled": spec.decoupled},
        "response_cache": {"enable": spec.response_cache and cache_available},
    }
    batcher = spec.batcher
    if spec.batching and batcher is not None:
        preferred = batcher.preferred_batch_size or [spec.max_batch_size]
        config["dynamic_batching"] = {
            "preferred_batch_size": list(preferred),
            "max_queue_delay_microseconds": str(batcher.max_queue_delay_microseconds),
            "preserve_ordering": batcher.preserve_ordering,
            "priority_levels": str(batcher.priority_levels),
            "default_priority_level": str(batcher.default_priority_level),
            "default_queue_policy": _queue_policy(batcher.default_queue_policy),
            "priority_queue_policy": {
                str(level): _queue_policy(policy) for level, policy in (batcher.priority_queue_policy or {}).items()
            },
        }
    return config


def model_statistics(models: List[ServedModel]) -> Dict[str, Any]:
    """GET .../stats."""
    return {"model_stats": [model.stats.as_dict(model.spec.name, model.spec.version_str) for model in models]}


def repository_index(models: List[ServedModel]) -> List[Dict[str, Any]]:
    """POST /v2/repository/index."""
    return [
        {"name": model.spec.name, "version": model.spec.version_str, "state": model.state.value, "reason": ""}
        for model in models
    ]
