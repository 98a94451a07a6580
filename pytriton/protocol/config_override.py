"""A load's config override (HTTP `POST /v2/repository/models/{m}/load`, gRPC RepositoryModelLoad), read as Triton does.

Triton reads the override as the model's whole config (model_config.proto in JSON). A model bound with the API
keeps its callable, so the override is laid over the config the model was bound with: the fields it names
change, the others keep their value as bound. Only what the engine can change may differ from the bound config
(CHANGEABLE); a field that would change what the callable takes and returns, or one the engine cannot honour, is
refused with Triton's "failed to load" and the model goes on as it was.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, FrozenSet, List, Mapping, Optional

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from pytriton.core.engine import SpecChange
from pytriton.core.errors import InferenceError
from pytriton.core.spec import ModelSpec
from pytriton.model_config.batcher_checks import batcher_refusal
from pytriton.model_config.common import DynamicBatcher, QueuePolicy, TimeoutAction
from pytriton.model_config.sequence_checks import cache_refusal
from pytriton.protocol import documents

# The fields a load's override may change on a model bound with the API.
CHANGEABLE = frozenset(("max_batch_size", "dynamic_batching", "instance_group", "parameters", "response_cache"))
# The fields that make the callable's contract: what it takes, what it returns, and how.
CONTRACT = frozenset(
    (
        "input",
        "output",
        "batch_input",
        "batch_output",
        "model_transaction_policy",
        "sequence_batching",
        "ensemble_scheduling",
    )
)
_KIND_AUTO = model_config_pb2.ModelInstanceGroup.KIND_AUTO
_KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU
_PARAMETER_TYPES = {str: "STRING", bool: "BOOL", int: "INT", float: "DOUBLE", bytes: "BYTES"}


def poll_failed(name: str, detail: str) -> InferenceError:
    """Triton's error for a load whose model or parameters could not be read (INTERNAL), with what was wrong."""
    return InferenceError.internal(f"failed to load '{name}', failed to poll from model repository: {detail}")


def override_text(name: str, parameters: Mapping[str, Any]) -> Optional[str]:
    """The config override among a load's parameters (None: there is none).

    Raises:
        InferenceError: a file override (pytriton serves callables, not model files), a parameter Triton does
            not know, or a config that is no string.
    """
    text: Optional[str] = None
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise poll_failed(name, "Config parameter 'config' must have string type for its value")
            text = value
        elif key.startswith("file:"):
            raise poll_failed(
                name,
                f"file override '{key[:64]}' refused: pytriton serves the callables bound with Triton.bind() and "
                "loads no model files; send only a 'config' override",
            )
        else:
            kind = _PARAMETER_TYPES.get(type(value), type(value).__name__)
            raise poll_failed(name, f"Unrecognized load parameter '{key}' with type '{kind}'")
    return text


@dataclasses.dataclass(frozen=True)
class ConfigOverride:
    """A parsed config override: the message, and the fields its JSON named (by their proto names)."""

    model: str
    config: Message
    named: FrozenSet[str]
    cache_available: bool

    def apply(self, bound: ModelSpec) -> ModelSpec:
        """The spec of the model bound as `bound`, with this override laid over it.

        Raises:
            InferenceError: INVALID_ARGUMENT, "failed to load 'm' version v: ...", naming the field that cannot
                take the value asked for; INTERNAL, Triton's "failed to load 'm', failed to poll from model
                repository: ..." for a value Triton's own config checks refuse.
        """
        failed = _Failure(bound)
        current = json_format.ParseDict(
            documents.model_config(bound),
            model_config_pb2.ModelConfig(),
            ignore_unknown_fields=True,
        )
        for field in sorted(self.named - CHANGEABLE):
            if field == "name":
                if self.config.name in ("", bound.name):
                    continue
                raise failed.poll(
                    f"unexpected directory name '{bound.name}' for model '{self.config.name}', directory name must "
                    "equal model name"
                )
            if _field_bytes(self.config, field) == _field_bytes(current, field):
                continue
            if field in CONTRACT:
                raise failed(
                    f"'{field}' cannot change: it is the inference callable's contract (its inputs, outputs and "
                    "how it answers); bind the model again with Triton.bind() to change it"
                )
            raise failed(f"'{field}' cannot change: pytriton cannot honour it for a model bound with the API")
        changes: Dict[str, Any] = {}
        max_batch_size = bound.max_batch_size
        if "max_batch_size" in self.named:
            max_batch_size = self._max_batch_size(bound, failed)
            changes["max_batch_size"] = max_batch_size
        if "dynamic_batching" in self.named:
            if max_batch_size == 0:
                raise failed("'dynamic_batching' needs a batching model (max_batch_size > 0)")
            changes["batcher"] = _batcher(self.config.dynamic_batching, failed)
        batcher = changes.get("batcher", bound.batcher)
        if batcher is not None:
            _check_batcher(batcher, max_batch_size, failed)
            refusal = batcher_refusal(bound.name, batcher)
            if refusal is not None:
                raise failed.poll(refusal)
        if "instance_group" in self.named:
            changes["instance_count"] = _instance_count(self.config.instance_group, failed)
        if "parameters" in self.named:
            parameters = self.config.parameters
            changes["parameters"] = tuple(sorted((key, parameters[key].string_value) for key in parameters))
        if "response_cache" in self.named:
            enable = bool(self.config.response_cache.enable)
            if enable and bound.decoupled:
                raise failed("'response_cache' cannot be enabled for a decoupled model")
            if enable and bound.sequence_batcher is not None:  # its answers hang on each sequence's state
                raise failed.poll(cache_refusal(bound.name))
            if enable and not bound.response_cache and not self.cache_available:
                raise failed(
                    "'response_cache' cannot be enabled: the server has no response cache (start it with "
                    "TritonConfig(cache_config=['local,size=<bytes>']))"
                )
            changes["response_cache"] = enable
        return dataclasses.replace(bound, **changes)

    def _max_batch_size(self, bound: ModelSpec, failed: _Failure) -> int:
        """The override's max_batch_size, which may not turn batching on or off (the inputs' shapes change)."""
        value = int(self.config.max_batch_size)
        if value < 0:
            raise failed.poll(f"'max_batch_size' must be >= 0, got {value}")
        if (value == 0) != (bound.max_batch_size == 0):
            raise failed(
                f"'max_batch_size' cannot change from {bound.max_batch_size} to {value}: batching on or off changes "
                "the shapes the inference callable gets (the batch dimension)"
            )
        return value


def parse_override(name: str, text: str, cache_available: bool) -> ConfigOverride:
    """Read a config override as Triton does (protobuf's JSON mapping: "16" is a number too).

    Raises:
        InferenceError: Triton's "failed to load ..., failed to poll from model repository" for text that is no
            model config.
    """
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(text, config)
        document = json.loads(text)
    except (json_format.ParseError, ValueError) as error:
        raise poll_failed(name, f"Invalid config override: {error}") from None
    if not isinstance(document, dict):
        raise poll_failed(name, "Invalid config override: not a JSON object")
    fields = config.DESCRIPTOR
    named = set()
    for key in document:
        field = fields.fields_by_name.get(key) or fields.fields_by_camelcase_name.get(key)
        if field is not None:
            named.add(field.name)
    return ConfigOverride(name, config, frozenset(named), cache_available)


class _Failure:
    """Makes the error of an override that cannot apply to one model version."""

    def __init__(self, spec: ModelSpec) -> None:
        self._name = spec.name
        self._prefix = f"failed to load '{spec.name}' version {spec.version}: "

    def __call__(self, detail: str) -> InferenceError:
        return InferenceError.invalid(self._prefix + detail)

    def poll(self, detail: str) -> InferenceError:
        """The error of a config Triton's own checks refuse as it polls the repository: 500 / INTERNAL.

        tritonserver 2.51 (measured) writes the detail only to its log; here it follows, as for unreadable text.
        """
        return poll_failed(self._name, detail)


def _field_bytes(config: Message, name: str) -> bytes:
    """One field of a config alone, serialized: two configs agree on the field when these agree."""
    partial = model_config_pb2.ModelConfig()
    field = config.DESCRIPTOR.fields_by_name[name]
    value = getattr(config, name)
    repeated = getattr(field, "is_repeated", None)  # protobuf 6's; `label` is older (and deprecated)
    if repeated is None:
        repeated = field.label == FieldDescriptor.LABEL_REPEATED
    if repeated:
        getattr(partial, name).MergeFrom(value)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        if config.HasField(name):
            getattr(partial, name).CopyFrom(value)
    else:
        setattr(partial, name, value)
    serialized: bytes = partial.SerializeToString(deterministic=True)
    return serialized


def _batcher(message: Any, failed: _Failure) -> DynamicBatcher:
    """A ModelDynamicBatching message as the engine's DynamicBatcher."""
    levels = {int(level): _queue_policy(policy, failed) for level, policy in message.priority_queue_policy.items()}
    return DynamicBatcher(
        max_queue_delay_microseconds=int(message.max_queue_delay_microseconds),
        preferred_batch_size=[int(size) for size in message.preferred_batch_size] or None,
        preserve_ordering=bool(message.preserve_ordering),
        priority_levels=int(message.priority_levels),
        default_priority_level=int(message.default_priority_level),
        default_queue_policy=_queue_policy(message.default_queue_policy, failed)
        if message.HasField("default_queue_policy")
        else None,
        priority_queue_policy=levels or None,
    )


def _queue_policy(message: Any, failed: _Failure) -> QueuePolicy:
    """A ModelQueuePolicy message as the engine's QueuePolicy."""
    action = model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(message.timeout_action)
    if message.max_queue_size < 0:
        raise failed.poll(f"'max_queue_size' must be >= 0, got {message.max_queue_size}")
    return QueuePolicy(
        timeout_action=TimeoutAction(action),
        default_timeout_microseconds=int(message.default_timeout_microseconds),
        allow_timeout_override=bool(message.allow_timeout_override),
        max_queue_size=int(message.max_queue_size),
    )


def _check_batcher(batcher: DynamicBatcher, max_batch_size: int, failed: _Failure) -> None:
    """Refuse dynamic batching settings Triton would refuse to load."""
    for size in batcher.preferred_batch_size or []:
        if not 0 < size <= max_batch_size:
            raise failed.poll(f"'preferred_batch_size' {size} must be between 1 and max_batch_size ({max_batch_size})")
    if batcher.max_queue_delay_microseconds < 0:
        raise failed.poll("'max_queue_delay_microseconds' must be >= 0")
    if batcher.priority_levels < 0:
        raise failed.poll("'priority_levels' must be >= 0")
    if batcher.priority_levels and not 1 <= batcher.default_priority_level <= batcher.priority_levels:
        raise failed.poll(f"'default_priority_level' must be between 1 and priority_levels ({batcher.priority_levels})")
    for level in batcher.priority_queue_policy or {}:
        if not 1 <= level <= batcher.priority_levels:
            raise failed.poll(f"'priority_queue_policy' level {level} is outside 1..priority_levels")


def _instance_count(groups: List[Any], failed: _Failure) -> int:
    """The number of instances instance groups ask for: CPU (or AUTO) groups only, each of 1 instance at least."""
    count = 0
    for group in groups:
        if group.kind not in (_KIND_AUTO, _KIND_CPU) or len(group.gpus):
            kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
            raise failed(
                f"'instance_group' of kind {kind} (or with gpus) cannot be honoured: pytriton runs each instance "
                "of the callable as a thread or a process; put its work on a device in the callable"
            )
        count += max(int(group.count), 1)  # tritonserver 2.51 takes a count below 1, 0 or negative, as 1
    if count < 1:
        raise failed("'instance_group' must ask for at least one instance")
    return count


def spec_change(name: str, parameters: Mapping[str, Any], cache_available: bool) -> Optional[SpecChange]:
    """What a load's parameters ask of a model's spec (None: load it as bound), for Engine.load.

    Raises:
        InferenceError: Triton's "failed to load ..." for parameters that cannot be read.
    """
    text = override_text(name, parameters)
    if text is None:
        return None
    return parse_override(name, text, cache_available).apply
