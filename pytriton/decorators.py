"""Inference callable decorators and the Triton context they read, as in NVIDIA's PyTriton."""

from __future__ import annotations

import bisect
import inspect
import itertools
import operator
import typing
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import wrapt

from pytriton.constants import TRITON_CONTEXT_FIELD_NAME
from pytriton.context import ModelConfigDict, TritonContext
from pytriton.core.outputs import not_an_array
from pytriton.core.tensors.host_arrays import host_arrays
from pytriton.core.tensors.raw_tensors import serialize_bytes_tensor
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "ConstantPadder",
    "InferenceRequest",
    "InferenceRequests",
    "InferenceResult",
    "InferenceResults",
    "InputNames",
    "ModelConfigDict",
    "TritonContext",
    "batch",
    "convert_output",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "get_triton_context",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]

InputNames = typing.List[str]
InferenceRequest = typing.Dict[str, np.ndarray]
InferenceRequests = typing.Union[typing.List[InferenceRequest], typing.Tuple[InferenceRequest, ...]]
InferenceResult = typing.Dict[str, np.ndarray]
InferenceResults = typing.Union[typing.List[InferenceResult], typing.Tuple[InferenceResult, ...]]

# Keyword arguments that decorators pass through untouched: they are never model inputs.
# Note: the `triton_context` keyword added by @triton_context is *not* one of them (as in NVIDIA's PyTriton).
_SPECIAL_KEYS = ["__triton_context__"]

_Wrapper = Callable[[Callable[..., Any], Any, Tuple[Any, ...], Dict[str, Any]], Any]


def _each_result(outputs: Any, finish: Callable[[Any], Any]) -> Any:
    """`finish` applied to what a wrapped callable returned: each step, what it awaits to, or the outputs.

    A generator's steps (sync or async) are finished one by one, a coroutine's result once awaited. NVIDIA's
    decorators take sync callables only; here an `async def` callable or async generator under them is awaited on
    the server's loop, as it would be undecorated.
    """
    if inspect.isgenerator(outputs):
        return (finish(step) for step in outputs)
    if inspect.isasyncgen(outputs):
        return _finished_steps(outputs, finish)
    if inspect.isawaitable(outputs):
        return _finished(outputs, finish)
    return finish(outputs)


async def _finished(outputs: Any, finish: Callable[[Any], Any]) -> Any:
    return finish(await outputs)


async def _finished_steps(steps: Any, finish: Callable[[Any], Any]) -> Any:
    try:
        async for step in steps:
            yield finish(step)
    finally:
        await steps.aclose()  # closed with this one (a cancelled stream), not left to the garbage collector


async def _awaited_in_turn(calls: List[Any]) -> List[Any]:
    """What each of the coroutines comes to, awaited one after the other; those left are closed if one raises."""
    results: List[Any] = []
    try:
        for call in calls:
            results.append(await call)
    finally:
        for call in calls[len(results) + 1 :]:
            call.close()
    return results


def _decorator(wrapper: _Wrapper) -> Callable[..., Any]:
    """Typed front of `wrapt.decorator`: turn a (wrapped, instance, args, kwargs) wrapper into a decorator."""
    return typing.cast(Callable[..., Any], wrapt.decorator(wrapper))


class _WrappedWithWrapper(NamedTuple):
    """One level of a wrapt decorator stack: the wrapped callable and the wrapper applied to it (if any)."""

    wrapped: Optional[Callable[..., Any]]
    wrapper: Optional[Callable[..., Any]]


def _get_wrapt_stack(wrapped: Any) -> List[_WrappedWithWrapper]:
    """The wrapt decorators stacked on a callable, outermost first."""
    stack = []
    current = wrapped
    while current is not None:
        stack.append(_WrappedWithWrapper(current, getattr(current, "_self_wrapper", None)))
        current = getattr(current, "__wrapped__", None)
    return stack


def get_inference_request_batch_size(inference_request: InferenceRequest) -> int:
    """Get the batch size of a request: the first axis of its first input.

    Raises:
        ValueError: if that input has no axis (a 0-dimensional array), as NVIDIA's unpacking of its shape raises.
    """
    first_input = next(iter(inference_request.values()))
    batch_size, *_dims = first_input.shape
    return int(batch_size)


def get_triton_context(wrapped: Any, instance: Any) -> TritonContext:
    """Retrieve the Triton context that binding attached to a callable (or to the object of a bound method)."""
    caller = instance or wrapped
    if not hasattr(caller, "__triton_context__"):
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    return caller.__triton_context__  # type: ignore[no-any-return]


def get_model_config(wrapped: Any, instance: Any) -> TritonModelConfig:
    """Retrieve the TritonModelConfig of a bound callable (usable from custom wrapt decorators)."""
    return get_triton_context(wrapped, instance).model_configs[wrapped]


def convert_output(
    outputs: Union[Dict[str, Any], List[Any], Tuple[Any, ...]],
    wrapped: Any = None,
    instance: Any = None,
    model_config: Optional[TritonModelConfig] = None,
) -> Dict[str, Any]:
    """Convert outputs given as a list or tuple (in model config output order) into a dict of outputs."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        if model_config is None:
            model_config = get_model_config(wrapped, instance)
        config_outputs = list(model_config.outputs or [])
        if len(outputs) != len(config_outputs):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: value for spec, value in zip(config_outputs, outputs)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


@_decorator
def sample(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Pass the first request's inputs as keyword arguments (non-batching models) and wrap the result in a list."""
    kwargs.update(args[0][0])
    outputs: Any = wrapped(*args[1:], **kwargs)
    return _each_result(outputs, lambda result: [convert_output(result, wrapped, instance)])


@_decorator
def batch(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Concatenate the requests' inputs into batches passed as keyword arguments, and split the outputs back.

    Every request must have the same set of inputs (put @group_by_keys above @batch when they may differ).

    Raises:
        PyTritonValidationError: if the requests have different sets of inputs, or an output is no numpy array
            (or one without a batch axis).
        ValueError: if an output's batch size differs from the sum of the requests' batch sizes.
    """
    requests = args[0]
    input_names = requests[0].keys()
    for request in requests[1:]:
        if input_names != request.keys():
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")

    call_kwargs = dict(kwargs)
    for name in input_names:
        call_kwargs[name] = _batched([request[name] for request in requests])
    outputs = wrapped(*args[1:], **call_kwargs)

    def _split(result: Any) -> List[Dict[str, Any]]:
        converted = host_arrays(convert_output(result, wrapped, instance))  # one host copy, then views
        _check_batch_outputs(converted, wrapped, instance)
        batch_sizes = [get_inference_request_batch_size(request) for request in requests]
        total = sum(batch_sizes)
        wrong = {name: tensor.shape for name, tensor in converted.items() if tensor.shape[0] != total}
        if wrong:
            described = ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
            raise ValueError(
                f"Received output tensors with different batch sizes: {described}. Expected batch size: {total}. "
            )
        split = []
        start = 0
        for size in batch_sizes:
            split.append({name: tensor[start : start + size, ...] for name, tensor in converted.items()})
            start += size
        return split

    return _each_result(outputs, _split)


def _check_batch_outputs(outputs: Dict[str, Any], wrapped: Any, instance: Any) -> None:
    """Refuse outputs @batch cannot split, with a message naming the output and the fix.

    Without it a list came back as "AttributeError: 'list' object has no attribute 'shape'", raised from here.
    """
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray):
            raise PyTritonValidationError(not_an_array(_model_name(wrapped, instance), name, value))
        if value.ndim == 0:
            raise PyTritonValidationError(
                f"Output `{name}` returned by a @batch callable is a 0-dimensional array ({value!r}); "
                "@batch outputs need the batch axis first: one row per sample of the batch"
            )


def _model_name(wrapped: Any, instance: Any) -> Optional[str]:
    """The name of the model a callable is bound as, None when it is not bound (called outside a server)."""
    try:
        return get_model_config(wrapped, instance).model_name
    except (PyTritonValidationError, KeyError):
        return None


def _batched(arrays: List[np.ndarray]) -> np.ndarray:
    """The requests' arrays of one input, one after the other along the batch axis.

    A request alone whose array is writable is passed as it is: it lies in the request's own memory, which
    nothing else reads or writes (np.concatenate copied it: a second 1 GiB for a 1 GiB tensor, and seconds of
    the GIL). A read-only one (a small request's bytes) is copied, as the callable may write into its inputs.
    A 0-dimensional one goes to np.concatenate too, which refuses it (ValueError) as NVIDIA's @batch does.
    """
    if len(arrays) == 1 and arrays[0].flags.writeable and arrays[0].ndim > 0:
        return arrays[0]
    return np.concatenate(arrays)


@_decorator
def group_by_keys(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Call the wrapped callable once per group of requests with the same set of inputs; keep the request order."""
    requests = args[0]
    keyed = sorted(
        ((index, tuple(sorted(request.keys())), request) for index, request in enumerate(requests)),
        key=operator.itemgetter(1),
    )
    groups: List[Tuple[int, ...]] = []
    calls: List[Any] = []
    for _, group in itertools.groupby(keyed, key=operator.itemgetter(1)):
        indices, _names, group_requests = zip(*group)
        groups.append(indices)
        calls.append(wrapped(list(group_requests), *args[1:], **kwargs))

    def _in_request_order(results: List[Any]) -> List[Any]:
        indexed_results = [pair for indices, result in zip(groups, results) for pair in zip(indices, result)]
        indexed_results.sort(key=operator.itemgetter(0))
        return [result for _, result in indexed_results]

    if calls and inspect.isawaitable(calls[0]):  # an `async def` callable: each group's call awaited in turn
        return _each_result(_awaited_in_turn(calls), _in_request_order)
    return _in_request_order(calls)


def group_by_values(
    *keys: str, pad_fn: Optional[Callable[[InferenceRequests], InferenceRequests]] = None
) -> Callable[..., Any]:
    """Split a batch into sub-batches with equal values of the selected inputs and call the callable on each.

    Put it below @batch (it works on keyword inputs). The sub-results are merged back into one batch in the
    original sample order; `pad_fn` (e.g. ConstantPadder) can first make their shapes compatible.

    Raises:
        PyTritonRuntimeError: if it is placed above @batch.
    """

    def _value_key(value: Any) -> Hashable:
        """A sortable, hashable key for one sample's value of an input."""
        if isinstance(value, np.ndarray):
            if value.dtype == np.object_ or value.dtype.type == np.bytes_:
                return serialize_bytes_tensor(value)
            return value.tobytes()
        return typing.cast(Hashable, value)

    def _groups(request: Dict[str, np.ndarray], batch_size: int) -> Iterator[Tuple[Tuple[int, ...], InferenceRequest]]:
        """Yield (sample indices, sub-request) for each group of equal key values, in key order."""
        keyed = sorted(
            ((index, tuple(_value_key(request[key][index]) for key in keys)) for index in range(batch_size)),
            key=operator.itemgetter(1),
        )
        for _, group in itertools.groupby(keyed, key=operator.itemgetter(1)):
            indices = tuple(index for index, _ in group)
            selector = np.asarray(indices, dtype=np.intp)
            yield indices, {name: value[selector, ...] for name, value in request.items()}

    @_decorator
    def _wrapper(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        wrappers = [level.wrapper for level in _get_wrapt_stack(wrapped) if level.wrapper is not None]
        if batch in wrappers:
            raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")

        request = {name: value for name, value in kwargs.items() if name not in _SPECIAL_KEYS}
        special = {name: value for name, value in kwargs.items() if name in _SPECIAL_KEYS}
        batch_size = get_inference_request_batch_size(request)

        indices_list: List[Tuple[int, ...]] = []
        calls: List[Any] = []
        for indices, sub_request in _groups(request, batch_size):
            indices_list.append(indices)
            calls.append(wrapped(*args, **sub_request, **special))

        def _merged(outputs: List[Any]) -> Dict[str, np.ndarray]:
            results = [host_arrays(output) for output in outputs]
            if pad_fn is not None:
                results = list(pad_fn(tuple(results)))
            merged = {
                name: np.zeros((batch_size, *data.shape[1:]), dtype=data.dtype) for name, data in results[0].items()
            }
            for indices, result in zip(indices_list, results):
                selector = np.asarray(indices, dtype=np.intp)
                for name, data in result.items():
                    merged[name][selector, ...] = data
            return merged

        if calls and inspect.isawaitable(calls[0]):  # an `async def` callable: each group's call awaited in turn
            return _each_result(_awaited_in_turn(calls), _merged)
        return _merged(calls)

    return _wrapper


class ConstantPadder:
    """Padder that pads the given batches with a constant value."""

    def __init__(self, pad_value: Any = 0) -> None:
        """Create a padder using `pad_value` (bytes and string arrays are always padded with empty values)."""
        self.pad_value = pad_value

    def __call__(self, batches_list: InferenceResults) -> InferenceResults:
        """Pad each tensor to the largest shape (and string length) of that name so the batches can be merged.

        Raises:
            PyTritonRuntimeError: if the arrays of one name have different dtypes.
        """
        names = list(dict.fromkeys(name for batch_dict in batches_list for name in batch_dict))
        padded: List[Dict[str, np.ndarray]] = [{} for _ in batches_list]
        for name in names:
            present = [
                (index, batch_dict[name])
                for index, batch_dict in enumerate(batches_list)
                if batch_dict.get(name) is not None  # a None value is left out of the padded batch, as in NVIDIA's
            ]
            arrays = [array for _, array in present]
            target_shape = _padded_shape(arrays)
            target_dtype = _padded_dtype(arrays)
            if target_dtype.kind == "U":
                pad_value: Any = ""
            elif target_dtype.kind in "SO":
                pad_value = b""
            else:
                pad_value = self.pad_value
            for index, array in present:
                widths = [(0, 0)] + [(0, target - size) for size, target in zip(array.shape[1:], target_shape)]
                padded[index][name] = np.pad(array, widths, mode="constant", constant_values=pad_value).astype(
                    target_dtype
                )
        return [{name: batch_dict[name] for name in names if name in batch_dict} for batch_dict in padded]


def _padded_shape(arrays: Sequence[np.ndarray]) -> Tuple[int, ...]:
    """The shape (without batch axis) that fits every array."""
    return tuple(int(dim) for dim in np.max([array.shape[1:] for array in arrays], axis=0))


def _padded_dtype(arrays: Sequence[np.ndarray]) -> np.dtype:
    """The common dtype of arrays; bytes and unicode strings get the longest item length."""
    dtypes = [array.dtype for array in arrays]
    first = dtypes[0]
    if any(dtype.kind != first.kind for dtype in dtypes):
        raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
    if first.kind in "SU":
        longest = max(int(dtype.str[2:]) for dtype in dtypes)
        return np.dtype(f"{first.str[:2]}{longest}")
    if any(dtype != first for dtype in dtypes):
        raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
    return first


def fill_optionals(**defaults: Any) -> Callable[..., Any]:
    """Fill inputs missing from requests with default values (NumPy arrays without the batch axis).

    Put it at the top of the decorator stack so grouping decorators below can make bigger groups.

    Raises:
        PyTritonBadParameterError: if a default names an unknown input, is not a NumPy array, or its dtype or shape
            does not match the input (checked on each call, against the bound model config).
    """

    def _verify_defaults(model_config: TritonModelConfig) -> None:
        """Check the defaults against the model inputs."""
        specs = {spec.name: spec for spec in model_config.inputs or []}
        unknown = sorted(set(defaults) - set(specs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")

        not_numpy = {name: value for name, value in defaults.items() if not isinstance(value, np.ndarray)}
        if not_numpy:
            described = ", ".join(f"{name}={value}" for name, value in not_numpy.items())
            raise PyTritonBadParameterError(f"Could not use {described} defaults as they are not NumPy arrays")

        wrong_dtypes = {
            name: (value.dtype, specs[name].dtype)
            for name, value in defaults.items()
            if value.dtype != specs[name].dtype
        }
        if wrong_dtypes:
            described = ", ".join(
                f"{name}: dtype={have} expected_dtype={expected}" for name, (have, expected) in wrong_dtypes.items()
            )
            raise PyTritonBadParameterError(
                f"Could not use {described} defaults as they have different than input signature dtypes"
            )

        def _shape_matches(have: Tuple[int, ...], expected: Tuple[int, ...]) -> bool:
            return len(have) == len(expected) and all(e == -1 or h == e for h, e in zip(have, expected))

        wrong_shapes = {
            name: (value.shape, specs[name].shape)
            for name, value in defaults.items()
            if not _shape_matches(value.shape, tuple(specs[name].shape))
        }
        if wrong_shapes:
            described = ", ".join(
                f"{name}: shape={have} expected_shape={expected}" for name, (have, expected) in wrong_shapes.items()
            )
            raise PyTritonBadParameterError(
                f"Could not use {described} defaults as they have different than input signature shapes"
            )

    @_decorator
    def _wrapper(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        model_config = get_model_config(wrapped, instance)
        _verify_defaults(model_config)
        (requests,) = args
        batching = model_config.batching
        for request in requests:
            missing = [name for name in defaults if name not in request]
            if not missing:
                continue
            batch_size = get_inference_request_batch_size(request) if batching else 0
            for name in missing:
                value = defaults[name]
                if batching:
                    value = np.tile(value, (batch_size,) + (1,) * value.ndim)
                request[name] = value
        return wrapped(*args, **kwargs)

    return _wrapper


@_decorator
def triton_context(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Pass the TritonContext of the bound callable as the `triton_context` keyword argument."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **kwargs)


@_decorator
def pad_batch(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Pad the input batches by repeating their last row, up to the nearest preferred batch size or max_batch_size."""
    inputs = {name: value for name, value in kwargs.items() if name != "__triton_context__"}
    current_size = next(iter(inputs.values())).shape[0]
    config = get_model_config(wrapped, instance)
    sizes: List[int] = []
    if config.batcher is not None and config.batcher.preferred_batch_size is not None:
        sizes = sorted(config.batcher.preferred_batch_size)
    sizes.append(config.max_batch_size)
    target_size = sizes[bisect.bisect_left(sizes, current_size)]

    for name, array in inputs.items():
        rows = array.shape[0]
        # every row once, the last one up to the target; an empty batch asks np.ones for -1 rows and gets NVIDIA's
        # ValueError ("negative dimensions are not allowed")
        repeats = np.concatenate([np.ones(rows - 1, dtype=np.int64), [target_size - rows + 1]])
        kwargs[name] = np.repeat(array, repeats, axis=0)
    return wrapped(*args, **kwargs)


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Callable[..., Any]:
    """Replace the selected inputs with their first element (all elements must be equal when `strict`).

    Works below @batch (keyword inputs) or directly on a list of requests; only for models that support batching.
    Single-element arrays become scalars unless `squeeze_single_values` is False.

    Raises:
        PyTritonBadParameterError: if a key is one of the reserved keyword names.
        PyTritonRuntimeError: on a call, if the model does not support batching, or if `strict` and the values
            of a selected input differ.
    """
    not_allowed = [key for key in keys if key in _SPECIAL_KEYS]
    if not_allowed:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(not_allowed)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL_KEYS)}"
        )

    def _replace(request: Any) -> Any:
        """Replace the selected inputs of one request (a dict or Request) in place."""
        for name in keys:
            if name not in request:
                continue
            values = request[name]
            if strict:
                # object arrays (strings) compare element-wise; others compare whole samples
                unique = np.unique(values, axis=None if values.dtype == object else 0)
                if len(unique) > 1:
                    raise PyTritonRuntimeError(
                        f"The values on the {name!r} input are not equal. "
                        "To proceed, either disable strict mode in @first_value wrapper "
                        "or ensure that the values always are consistent. "
                        f"The current values of {name!r} are {values!r}."
                    )
            first = values[0]
            if squeeze_single_values and not np.isscalar(first) and all(dim == 1 for dim in first.shape):
                first = np.squeeze(first)[()]
            request[name] = first
        return request

    @_decorator
    def _wrapper(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        model_config = get_model_config(wrapped, instance)
        if not model_config.batching:
            raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support batching.")
        if set(kwargs) - set(_SPECIAL_KEYS):
            return wrapped(*args, **_replace(kwargs))
        requests, *other_args = args
        return wrapped([_replace(request) for request in requests], *other_args, **kwargs)

    return _wrapper
