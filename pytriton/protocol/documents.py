"""Metadata, model config, statistics and repository documents, as dicts both transports serve."""

from __future__ import annotations

from typing import Any, Dict, List

from pytriton.core.model import RepositoryEntry, ServedModel
from pytriton.core.sequences.controls import corrid_dtype
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.core.tensors.datatypes import config_enum
from pytriton.model_config.common import QueuePolicy
from pytriton.model_config.sequence import SequenceBatcher, SequenceControlInput, SequenceControlKind

# In tritonserver 2.51's order (nvidia-pytriton 0.7 listed these, with cuda_shared_memory after
# system_shared_memory and without generate).
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "generate",
    "trace",
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
        "platform": "ensemble" if spec.ensemble is not None else "python",
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": _wire_shape(spec, t)} for t in spec.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": _wire_shape(spec, t)} for t in spec.outputs],
    }


def _queue_policy(policy: QueuePolicy) -> Dict[str, Any]:
    """A ModelQueuePolicy message."""
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def _input_config(tensor: TensorDef) -> Dict[str, Any]:
    """A ModelInput message with every field Triton prints."""
    return {
        "name": tensor.name,
        "data_type": config_enum(tensor.datatype),
        "format": tensor.format,
        "dims": list(tensor.dims),
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": tensor.optional,
        "is_non_linear_format_io": False,
    }


def _output_config(tensor: TensorDef) -> Dict[str, Any]:
    """A ModelOutput message with every field Triton prints."""
    return {
        "name": tensor.name,
        "data_type": config_enum(tensor.datatype),
        "dims": list(tensor.dims),
        "label_filename": tensor.label_filename,
        "is_shape_tensor": False,
        "is_non_linear_format_io": False,
    }


def _dynamic_batching(spec: ModelSpec) -> Dict[str, Any]:
    """A ModelDynamicBatching message (a default queue policy only when one is set, as Triton prints it)."""
    batcher = spec.batcher
    assert batcher is not None
    document: Dict[str, Any] = {
        "preferred_batch_size": list(batcher.preferred_batch_size or [spec.max_batch_size]),
        "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
        "preserve_ordering": batcher.preserve_ordering,
        "priority_levels": batcher.priority_levels,
        "default_priority_level": batcher.default_priority_level,
    }
    if batcher.default_queue_policy is not None:
        document["default_queue_policy"] = _queue_policy(batcher.default_queue_policy)
    document["priority_queue_policy"] = {
        str(level): _queue_policy(policy) for level, policy in (batcher.priority_queue_policy or {}).items()
    }
    return document


def _sequence_batching(batcher: SequenceBatcher) -> Dict[str, Any]:
    """A ModelSequenceBatching message as Triton prints it (its strategy only when one is set)."""
    document: Dict[str, Any] = {}
    if batcher.direct is not None:
        document["direct"] = {
            "max_queue_delay_microseconds": batcher.direct.max_queue_delay_microseconds,
            "minimum_slot_utilization": _float(batcher.direct.minimum_slot_utilization),
        }
    if batcher.oldest is not None:
        document["oldest"] = {
            "max_candidate_sequences": batcher.oldest.max_candidate_sequences,
            "preferred_batch_size": list(batcher.oldest.preferred_batch_size or []),
            "max_queue_delay_microseconds": batcher.oldest.max_queue_delay_microseconds,
            "preserve_ordering": batcher.oldest.preserve_ordering,
        }
    document["max_sequence_idle_microseconds"] = batcher.max_sequence_idle_microseconds
    document["control_input"] = [_control_input(control) for control in batcher.control_inputs]
    document["state"] = []
    document["iterative_sequence"] = False
    return document


def _float(value: float) -> float:
    """A float field as Triton's JSON writer prints it: a whole number without its ".0"."""
    number = float(value)
    return int(number) if number.is_integer() else number


def _control_input(control: SequenceControlInput) -> Dict[str, Any]:
    """A ModelSequenceBatching.ControlInput message: the input's name and its one control."""
    data_type = "TYPE_INVALID"
    if control.kind is SequenceControlKind.CONTROL_SEQUENCE_CORRID:
        dtype = corrid_dtype(control.data_type)
        data_type = "TYPE_STRING" if dtype.kind == "O" else f"TYPE_{dtype.name.upper()}"
    return {
        "name": control.name,
        "control": [
            {
                "kind": control.kind.value,
                "int32_false_true": [int(value) for value in control.int32_false_true or []],
                "fp32_false_true": [_float(value) for value in control.fp32_false_true or []],
                "bool_false_true": [bool(value) for value in control.bool_false_true or []],
                "data_type": data_type,
            }
        ],
    }


def model_config(spec: ModelSpec) -> Dict[str, Any]:
    """GET .../config: Triton's model_config.proto as its HTTP endpoint prints it (every field, int64 as numbers).

    Optional messages appear only when set: dynamic batching for batching models (sequence batching for
    models with a sequence batcher), the transaction policy
    for decoupled ones, the response cache when enabled.
    """
    if spec.ensemble is not None:
        return _ensemble_config(spec)
    config = _config_head(spec, "", "python")
    config.update(
        optimization={
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        }
    )
    if spec.batching and spec.batcher is not None:
        config["dynamic_batching"] = _dynamic_batching(spec)
    if spec.sequence_batcher is not None:
        config["sequence_batching"] = _sequence_batching(spec.sequence_batcher)
    config.update(
        {
            "instance_group": [
                {
                    "name": f"{spec.name}_0",
                    "kind": "KIND_CPU",
                    "count": spec.instance_count,
                    "gpus": [],
                    "secondary_devices": [],
                    "profile": [],
                    "passive": False,
                    "host_policy": "",
                }
            ],
            "default_model_filename": "model.py",
            "cc_model_filenames": {},
            "metric_tags": {},
            "parameters": {name: {"string_value": value} for name, value in spec.parameters},
            "model_warmup": [],  # warm-up runs before the model is ready; Triton shows none, as for PyTriton's
        }
    )
    if spec.decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    if spec.response_cache:  # as Triton: what the model asks for, whether or not the server has a cache
        config["response_cache"] = {"enable": True}
    return config


def _ensemble_config(spec: ModelSpec) -> Dict[str, Any]:
    """An ensemble's config as Triton 2.51 prints it: no backend, optimization, batcher or instances; its steps."""
    assert spec.ensemble is not None
    config = _config_head(spec, "ensemble", "")
    steps = [
        {
            "model_name": step.model_name,
            "model_version": step.model_version,
            "input_map": dict(step.input_map),
            "output_map": dict(step.output_map),
            "model_namespace": "",
        }
        for step in spec.ensemble.steps
    ]
    config.update(
        {
            "ensemble_scheduling": {"step": steps},
            "instance_group": [],
            "default_model_filename": "",
            "cc_model_filenames": {},
            "metric_tags": {},
            "parameters": {name: {"string_value": value} for name, value in spec.parameters},
            "model_warmup": [],
            "model_transaction_policy": {"decoupled": spec.decoupled},  # a decoupled step makes it so
        }
    )
    return config


def _config_head(spec: ModelSpec, platform: str, backend: str) -> Dict[str, Any]:
    """The fields every model config starts with, in Triton's order: names, the batch size, the tensors."""
    return {
        "name": spec.name,
        "platform": platform,
        "backend": backend,
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": spec.max_batch_size,
        "input": [_input_config(tensor) for tensor in spec.inputs],
        "output": [_output_config(tensor) for tensor in spec.outputs],
        "batch_input": [],
        "batch_output": [],
    }


def model_statistics(models: List[ServedModel]) -> Dict[str, Any]:
    """GET .../stats."""
    return {"model_stats": [model.stats.as_dict(model.spec.name, model.spec.version_str) for model in models]}


def repository_index(entries: List[RepositoryEntry]) -> List[Dict[str, Any]]:
    """POST /v2/repository/index: each model version and its state; a reason only where there is one, as Triton."""
    documents: List[Dict[str, Any]] = []
    for entry in entries:
        document = {"name": entry.name, "version": entry.version, "state": entry.state}
        if entry.reason:
            document["reason"] = entry.reason
        documents.append(document)
    return documents
