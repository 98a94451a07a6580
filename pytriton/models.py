"""Turning Triton.bind arguments into the engine's ModelSpec and PyTriton's TritonModelConfig."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.core.ensemble_graph import EnsembleGraph, EnsembleStepDef
from pytriton.core.spec import ModelSpec, TensorDef
from pytriton.core.tensors.datatypes import datatype_of_config_dtype, is_known_datatype, numpy_dtype
from pytriton.exceptions import PyTritonBadParameterError, PyTritonModelConfigError, PyTritonValidationError
from pytriton.model_config.batcher_checks import batcher_refusal
from pytriton.model_config.common import DeviceKind, DynamicBatcher, ModelWarmup, generate_warmup_requests
from pytriton.model_config.ensemble import EnsembleStep
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.sequence_checks import resolve_sequence_batcher
from pytriton.model_config.tensor import Tensor
from pytriton.model_config.tensor_options import tensor_format, tensor_labels
from pytriton.model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig
from pytriton.options.openai import OpenAIOption
from pytriton.transport.openai.binding import check_binding

LOGGER = logging.getLogger("pytriton")
_MODEL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_model_name(model_name: str) -> None:
    """Model names may only contain alphanumerics, dots, underscores and dashes."""
    if not model_name:
        raise PyTritonValidationError("Model name cannot be empty")
    if not _MODEL_NAME.match(model_name):
        raise PyTritonValidationError(
            "Model name can only contain alphanumeric characters, dots, underscores and dashes"
        )


def as_callables(infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]]]) -> List[Callable[..., Any]]:
    """One callable per instance."""
    if not isinstance(infer_func, (list, tuple)) and not callable(infer_func):
        raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")  # 0.7's
    callables: List[Callable[..., Any]] = list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func]
    if not callables:
        raise PyTritonBadParameterError("infer_func must be a callable or a non-empty list of callables")
    for fn in callables:
        if not callable(fn):
            raise PyTritonBadParameterError(f"infer_func element {fn!r} is not callable")
    return callables


def warn_of_callables_without_requests(model_name: str, callables: Sequence[Callable[..., Any]]) -> None:
    """Warn of a plain function bound undecorated that cannot take the one argument it is called with.

    Without @batch (or @sample) a callable is called with the list of requests. `def infer(**inputs)` left
    undecorated failed every request with "infer() takes 0 positional arguments but 1 was given", which says
    nothing of the decorator (nvidia-pytriton issue #20, its own notebook). Only functions and methods whose
    signature is their own are looked at: a decorated one (`__wrapped__`) may take anything.
    """
    for fn in callables:
        function = getattr(fn, "__func__", fn)  # a bound method's function
        if not inspect.isfunction(function) or hasattr(fn, "__wrapped__") or hasattr(function, "__wrapped__"):
            continue
        try:
            inspect.signature(fn).bind(None)
        except TypeError:
            LOGGER.warning(
                "model '%s': infer_func %s takes no positional argument, but an undecorated inference callable is "
                "called with one, the list of requests: every request will fail. Decorate it with "
                "@pytriton.decorators.batch to have the inputs as keyword arguments (arrays with a batch axis).",
                model_name,
                getattr(fn, "__qualname__", repr(fn)),
            )
        except ValueError:  # no signature to read
            continue


_SHAPES = "a tuple of dims, each an int >= 1 or -1 for any size (without the batch axis), e.g. (-1,) or (3, 224, 224)"
_DTYPES = (
    "a numpy type or dtype (np.float32, np.dtype('int64'), 'float32'), bytes or object for BYTES (strings and "
    "binary data), or 'bfloat16'"
)


def _tensor_specs(model: str, tensors: Sequence[Tensor], prefix: str) -> Tuple[TensorSpec, ...]:
    """Named tensor specs; unnamed tensors get PREFIX_1, PREFIX_2, ... by position."""
    specs = []
    for index, tensor in enumerate(tensors, start=1):
        if not isinstance(tensor, Tensor):
            raise PyTritonBadParameterError(f"{prefix.lower()}s must be pytriton.model_config.Tensor, got {tensor!r}")
        name = tensor.name or f"{prefix}_{index}"
        shape = _dims(f"model '{model}': {prefix.lower()} '{name}'", tensor.shape)
        specs.append(TensorSpec(name=name, shape=shape, dtype=tensor.dtype, optional=bool(tensor.optional)))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise PyTritonModelConfigError(f"duplicate {prefix.lower()} names: {names}")
    return tuple(specs)


def _max_array_dims() -> int:
    """The most dimensions a numpy array may have: 64 from numpy 2, 32 before."""
    for dims in (64, 32):
        try:
            np.empty((1,) * dims, dtype=np.uint8)
        except ValueError:
            continue
        return dims
    return 32


# A tensor of more dimensions (its batch axis included) could be bound but never served: every request failed.
MAX_ARRAY_DIMS = _max_array_dims()


def _check_array_dims(model: str, specs: Sequence[TensorSpec], batching: bool) -> None:
    """Refuse a tensor whose arrays would have more dimensions, with the batch axis, than numpy's arrays may."""
    for spec in specs:
        dims = len(spec.shape) + (1 if batching else 0)
        if dims > MAX_ARRAY_DIMS:
            axis = " with the batch axis" if batching else ""
            raise PyTritonModelConfigError(
                f"model '{model}': tensor '{spec.name}' has {dims} dims{axis}, more than a numpy array may have "
                f"({MAX_ARRAY_DIMS}): no request could be served"
            )


def _dims(tensor: str, shape: Any) -> Tuple[int, ...]:
    """A Tensor's shape as ints >= 1 or -1; an error says what is accepted (`tensor` names it: "input 'x'")."""
    if not isinstance(shape, (tuple, list)):
        raise PyTritonModelConfigError(f"{tensor} has shape={shape!r}; expected {_SHAPES}")
    if not shape:
        # Triton refuses to load it: "model input 'x' must specify 'dims'".
        raise PyTritonModelConfigError(
            f"{tensor} has shape={tuple(shape)!r}; Triton needs at least one dim: (1,) for one value per request"
        )
    dims = []
    for dim in shape:
        try:
            value = int(dim)
        except (TypeError, ValueError):
            value = 0
        if isinstance(dim, bool) or value != dim or not (value == -1 or value >= 1):
            hint = " (-1, not None, marks a dim of any size)" if dim is None else ""
            raise PyTritonModelConfigError(f"{tensor} has shape={tuple(shape)!r}{hint}; expected {_SHAPES}")
        dims.append(value)
    return tuple(dims)


def _tensor_defs(
    model: str, specs: Sequence[TensorSpec], prefix: str, tensors: Sequence[Tensor]
) -> Tuple[TensorDef, ...]:
    """Engine tensor definitions with protocol datatypes, an input's format and an output's labels."""
    defs = []
    for spec, tensor in zip(specs, tensors):
        try:
            datatype = datatype_of_config_dtype(spec.dtype)
        except ValueError:
            raise PyTritonModelConfigError(
                f"model '{model}': {prefix.lower()} '{spec.name}' has dtype={spec.dtype!r}; expected {_DTYPES}"
                + _dtype_hint(spec.dtype)
            ) from None
        where = f"model '{model}': {prefix.lower()} '{spec.name}'"
        image_format = tensor_format(where, tensor, spec.shape, is_input=prefix == "INPUT")
        labels, label_filename = tensor_labels(where, tensor, is_output=prefix == "OUTPUT")
        defs.append(
            TensorDef(spec.name, datatype, spec.shape, bool(spec.optional), image_format, labels, label_filename)
        )
    return tuple(defs)


def _dtype_hint(dtype: Any) -> str:
    """For a Triton datatype name ('FP32', 'TYPE_FP32'), the numpy type to use instead."""
    name = str(dtype).upper()
    name = {"TYPE_STRING": "BYTES", "STRING": "BYTES"}.get(name, name[5:] if name.startswith("TYPE_") else name)
    if not isinstance(dtype, str) or not is_known_datatype(name):
        return ""
    numpy_name = "bytes" if name == "BYTES" else "'bfloat16'" if name == "BF16" else f"np.{numpy_dtype(name).name}"
    return f" ('{dtype}' is Triton's name of {numpy_name}: use that)"


def check_model_version(model_version: Any) -> None:
    """Refuse a model version that is no integer >= 0 (0.7 serves version 0, as Triton does: `versions: ["0"]`)."""
    if not isinstance(model_version, int) or model_version < 0:
        raise PyTritonBadParameterError(f"model_version must be an integer >= 0, got {model_version!r}")


def build_model(
    *,
    model_name: str,
    model_version: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    instance_count: int,
    strict: bool,
    openai: Optional[OpenAIOption] = None,
) -> Tuple[ModelSpec, TritonModelConfig]:
    """Check a binding and resolve it into the engine's spec and PyTriton's TritonModelConfig."""
    validate_model_name(model_name)
    check_model_version(model_version)
    if config.batching and config.max_batch_size < 1:
        raise PyTritonBadParameterError("max_batch_size must be >= 1 when batching is enabled")
    if config.decoupled and config.response_cache:
        raise PyTritonModelConfigError(  # tritonserver's words, where 0.7's bind says only "failed to load"
            f"Response Cache does not currently support model {model_name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )
    sequence_batcher = None
    if config.sequence_batcher is not None:
        sequence_batcher = resolve_sequence_batcher(model_name, config, inputs)
    if not config.batching and config.batcher not in (None, DynamicBatcher()):
        # PyTriton 0.7 writes no dynamic_batching for such a model either; say so instead of dropping it silently
        LOGGER.warning(
            "model '%s': ModelConfig.batcher has no effect because batching=False: a model that does not batch "
            "has no dynamic batcher, so its delay, preferred sizes, ordering, priority levels and queue policies "
            "are not applied (set batching=True, or leave batcher at its default)",
            model_name,
        )
    batcher = copy.deepcopy(config.batcher) if config.batching and sequence_batcher is None else None
    if batcher is not None:
        _check_batcher(batcher, config.max_batch_size)
        refusal = batcher_refusal(model_name, batcher)
        if refusal is not None:
            raise PyTritonModelConfigError(refusal)
    if any(tensor.optional for tensor in outputs if isinstance(tensor, Tensor)):
        raise PyTritonValidationError("Output tensors cannot be optional.")
    input_specs = _tensor_specs(model_name, inputs, "INPUT")
    output_specs = _tensor_specs(model_name, outputs, "OUTPUT")
    _check_array_dims(model_name, (*input_specs, *output_specs), config.batching)
    warmup = _warmup_requests(model_name, config.model_warmup, input_specs, output_specs)
    max_batch_size = config.max_batch_size if config.batching else 0
    spec = ModelSpec(
        name=model_name,
        version=model_version,
        inputs=_tensor_defs(model_name, input_specs, "INPUT", inputs),
        outputs=_tensor_defs(model_name, output_specs, "OUTPUT", outputs),
        max_batch_size=max_batch_size,
        batcher=batcher,
        decoupled=config.decoupled,
        response_cache=config.response_cache,
        instance_count=instance_count,
        strict=strict,
        input_specs=input_specs,
        output_specs=output_specs,
        warmup=warmup,
        sequence_batcher=sequence_batcher,
        openai=openai,
    )
    if openai is not None:
        check_binding(spec, openai)
    triton_config = TritonModelConfig(
        model_name=model_name,
        model_version=model_version,
        max_batch_size=max_batch_size,
        batching=config.batching,
        batcher=batcher,
        instance_group={DeviceKind.KIND_CPU: instance_count},
        decoupled=config.decoupled,
        inputs=list(input_specs),
        outputs=list(output_specs),
        response_cache=ResponseCache(enable=True) if config.response_cache else None,
        model_warmup=copy.deepcopy(config.model_warmup),
        sequence_batcher=copy.deepcopy(sequence_batcher),
    )
    return spec, triton_config


def rebound_config(config: TritonModelConfig, spec: ModelSpec) -> TritonModelConfig:
    """The TritonModelConfig decorators read, for a model bound again by a load with a config override."""
    return dataclasses.replace(
        copy.deepcopy(config),
        max_batch_size=spec.max_batch_size,
        batcher=copy.deepcopy(spec.batcher),
        instance_group={DeviceKind.KIND_CPU: spec.instance_count},
        backend_parameters=dict(spec.parameters),
        response_cache=ResponseCache(enable=True) if spec.response_cache else None,
    )


def _warmup_requests(
    model_name: str,
    model_warmup: Optional[List[ModelWarmup]],
    input_specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
) -> Tuple[Dict[str, np.ndarray], ...]:
    """The warm-up requests' inputs, generated now (a file that cannot be read fails the binding)."""
    if not model_warmup:
        return ()
    known = {spec.name for spec in input_specs}
    for warmup in model_warmup:
        unknown = sorted(set(warmup.inputs) - known)
        if unknown:
            LOGGER.warning(
                "warm-up '%s' of model '%s' gives inputs the model does not have: %s", warmup.name, model_name, unknown
            )
    return tuple(generate_warmup_requests(model_warmup, list(input_specs), list(output_specs)))


def _check_batcher(batcher: Any, max_batch_size: int) -> None:
    """Reject batcher settings Triton would refuse to load."""
    for size in batcher.preferred_batch_size or []:
        if not 0 < size <= max_batch_size:
            raise PyTritonModelConfigError(
                f"preferred_batch_size {size} must be between 1 and max_batch_size ({max_batch_size})"
            )
    if batcher.max_queue_delay_microseconds < 0:
        raise PyTritonModelConfigError("max_queue_delay_microseconds must be >= 0")
    if batcher.priority_levels < 0:
        raise PyTritonModelConfigError("priority_levels must be >= 0")
    # nvidia-pytriton 0.7 raises PyTritonBadParameterError for these at bind; code may catch it.
    if batcher.priority_levels and not 1 <= batcher.default_priority_level <= batcher.priority_levels:
        raise PyTritonBadParameterError(
            f"default_priority_level must be between 1 and priority_levels ({batcher.priority_levels})"
        )
    if batcher.priority_queue_policy and not batcher.priority_levels:
        raise PyTritonBadParameterError(
            "priority_queue_policy needs priority_levels: a queue policy is set for a priority level"
        )
    for level in batcher.priority_queue_policy or {}:
        if not 1 <= level <= batcher.priority_levels:
            raise PyTritonBadParameterError(f"priority_queue_policy level {level} is outside 1..priority_levels")


def build_ensemble(
    *,
    model_name: str,
    model_version: int,
    steps: Sequence[EnsembleStep],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
) -> ModelSpec:
    """Check an ensemble's binding and resolve it into the engine's spec (its steps are checked at bind).

    Raises:
        PyTritonModelConfigError: an option an ensemble cannot have (Triton's words where it has them).
    """
    validate_model_name(model_name)
    check_model_version(model_version)
    if config.batching and config.max_batch_size < 1:
        raise PyTritonBadParameterError("max_batch_size must be >= 1 when batching is enabled")
    if config.model_warmup:
        raise PyTritonModelConfigError(f"model_warmup can not be specified for ensemble '{model_name}'")
    refused = [
        option
        for option, set_ in (
            ("decoupled", config.decoupled),
            ("response_cache", config.response_cache),
            ("sequence_batcher", config.sequence_batcher is not None),
            ("batcher", config.batcher not in (None, DynamicBatcher())),
        )
        if set_
    ]
    if refused:
        raise PyTritonModelConfigError(
            f"ensemble '{model_name}' cannot have {', '.join(refused)}: its steps' models batch and queue its requests"
        )
    step_defs = []
    for index, step in enumerate(steps):
        if not isinstance(step, EnsembleStep):
            raise PyTritonBadParameterError(f"step {index} of ensemble '{model_name}' is not an EnsembleStep")
        if not isinstance(step.model_version, int) or step.model_version < -1:
            raise PyTritonBadParameterError(
                f"step {index} of ensemble '{model_name}': model_version must be -1 (latest) or a version number"
            )
        step_defs.append(
            EnsembleStepDef(
                model_name=step.model_name,
                model_version=step.model_version,
                input_map=tuple((str(k), str(v)) for k, v in dict(step.input_map).items()),
                output_map=tuple((str(k), str(v)) for k, v in dict(step.output_map).items()),
            )
        )
    input_specs = _tensor_specs(model_name, inputs, "INPUT")
    output_specs = _tensor_specs(model_name, outputs, "OUTPUT")
    return ModelSpec(
        name=model_name,
        version=model_version,
        inputs=_tensor_defs(model_name, input_specs, "INPUT", inputs),
        outputs=_tensor_defs(model_name, output_specs, "OUTPUT", outputs),
        max_batch_size=config.max_batch_size if config.batching else 0,
        batcher=None,
        decoupled=False,
        response_cache=False,
        instance_count=0,
        strict=False,
        input_specs=input_specs,
        output_specs=output_specs,
        ensemble=EnsembleGraph(tuple(step_defs)),
    )
