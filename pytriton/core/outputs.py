"""Turning what a callable returned into responses: PyTriton's checks, then output selection."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceResponse, OutputTensor
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.counted_strings import counted
from pytriton.core.tensors.datatypes import (
    BF16,
    BF16_DTYPE,
    BYTES,
    datatype_of_config_dtype,
    datatype_of_dtype,
    numpy_dtype,
)
from pytriton.core.tensors.host_arrays import host_arrays
from pytriton.proxy.types import Request, Response

_ALLOWED_KINDS = "biufOSU"


class OutputNotices(Protocol):
    """Who hears of the outputs a callable's answer leaves to the server's judgement (core/logs/failure_log.py)."""

    def undeclared_output(self, name: str) -> None:
        """The callable returned output `name`, which the config does not declare (it is left out)."""

    def unreturned_output(self, name: str) -> None:
        """A request asked for output `name`, which the callable did not return (it is left out)."""


class UnsentResponse:
    """Stands in for a response dict that could not leave its instance process (an output that does not pickle).

    Its request fails with `reason`; the batch's other requests are answered.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return self.reason


def check_results(spec: ModelSpec, results: Any, request_count: int) -> List[Any]:
    """Check the shape of a callable's result: a list with one dict per request."""
    if not isinstance(results, (list, tuple)):
        raise InferenceError.internal(
            f"Outputs returned by `{spec.name}` model callable must be list of response dicts with numpy arrays. "
            f"Got outputs={_short(results, text=str)} instead."
        )
    if len(results) != request_count:
        raise InferenceError.internal(
            f"Number of outputs returned by `{spec.name}` inference callable ({len(results)}) does not match "
            f"number of requests ({request_count}) received from Triton."
        )
    return list(results)


def build_response(
    spec: ModelSpec,
    result: Any,
    requested: Optional[Sequence[str]],
    final: bool = True,
    notices: Optional[OutputNotices] = None,
) -> InferenceResponse:
    """Check one response dict and select the outputs the request gets, in wire order.

    Framework arrays (torch, cupy, jax) become numpy arrays first, so the checks and the codecs see numpy only.
    A Request or Response object (what `lambda requests: requests` returns) counts as its mapping of arrays.
    Without `strict`, an output the config does not declare is left out of the response, as NVIDIA's PyTriton
    leaves it out (strict mode refuses it instead). An output the request asked for by name that the callable did
    not return is left out too, in both modes, as NVIDIA's PyTriton and Triton's ensembles leave it out (Triton
    answers 200 without it). `notices` hears of either.

    A dict whose outputs all passed the checks before as they are, by (name, dtype), is answered unchecked
    (`spec.passed_outputs`): the checks' verdict on a non-strict model's output is a function of those two.
    """
    if type(result) is dict:
        response = _passed_response(spec, result, requested, final)
        if response is not None:
            return response
    returned = result
    result, datatypes = _checked(spec, result, notices)
    outputs: List[OutputTensor] = []
    size = 0
    # Every output asked for and nothing undeclared returned (the commonest answer): the callable's own order.
    every = requested is None and result.keys() <= spec.output_by_name.keys()
    for name in result if every else _selected(spec, result, requested, notices):
        wire_type = datatypes[name]
        value = result[name]
        if wire_type == "FP32" and spec.output_by_name[name].datatype == "BF16":
            wire_type = "BF16"
        outputs.append(OutputTensor(name, wire_type, value))
        size += counted(value) if value.dtype.kind == "O" else value.nbytes
    if spec.max_response_bytes and size > spec.max_response_bytes:
        raise _too_large(spec, [output.name for output in outputs], size)
    _remember_passed(spec, returned)
    return InferenceResponse(outputs, final)


def _passed_response(
    spec: ModelSpec, result: Dict[Any, Any], requested: Optional[Sequence[str]], final: bool
) -> Optional[InferenceResponse]:
    """`build_response` of a dict whose outputs all passed before (`spec.passed_outputs`); None for any other.

    None too when a requested output is missing (its notice) or the outputs are too large (its error): the checks'
    way says so.
    """
    if requested is not None:
        for name in requested:
            if name not in result:
                return None
    passed = spec.passed_outputs
    outputs: List[OutputTensor] = []
    size = 0
    try:
        for name, value in result.items():
            if type(value) is not np.ndarray:
                return None
            wire_type = passed.get((name, value.dtype))
            if wire_type is None:
                return None
            if requested is None or name in requested:
                outputs.append(OutputTensor(name, wire_type, value))
                size += value.nbytes
    except TypeError:  # a dtype numpy cannot hash (with unhashable metadata): the checks' way
        return None
    if spec.max_response_bytes and size > spec.max_response_bytes:
        return None
    return InferenceResponse(outputs, final)


def checked_outputs(
    spec: ModelSpec,
    result: Any,
    requested: Optional[Sequence[str]],
    notices: Optional[OutputNotices] = None,
) -> Dict[str, np.ndarray]:
    """What `build_response` checks and selects, as the arrays by name: a direct inner call's answer.

    Its caller wants the arrays, not a response for the wire: no OutputTensor, no response, no dict made again.
    An output whose (name, dtype) passed the checks before, as it was, passes again unchecked (`spec.passed_outputs`).
    """
    selected: Optional[Dict[str, Any]] = None
    if requested is None and type(result) is dict:
        passed = spec.passed_outputs
        for name, value in result.items():
            if type(value) is not np.ndarray or passed.get((name, value.dtype)) is None:
                break
        else:
            selected = dict(result)  # a copy: the callable may return a dict it keeps
    if selected is None:
        returned = result
        result, _ = _checked(spec, result, notices)
        if requested is None and result.keys() == spec.output_by_name.keys():
            selected = dict(result)  # every output, nothing else (a copy: the callable may return a dict it keeps)
        else:
            selected = {name: result[name] for name in _selected(spec, result, requested, notices)}
        _remember_passed(spec, returned)
    limit = spec.max_response_bytes
    if limit:
        size = 0
        for value in selected.values():  # a loop, not sum() over a generator: a frame less per call
            size += counted(value) if value.dtype.kind == "O" else value.nbytes
        if size > limit:
            raise _too_large(spec, list(selected), size)
    return selected


# (name, dtype) pairs remembered per model; past that the memory starts over.
PASSED_LIMIT = 256


def _remember_passed(spec: ModelSpec, returned: Any) -> None:
    """Remember the outputs of a checked answer that pass as they are, whatever their values, with their wire datatype.

    Those are declared numpy arrays of a number or bool datatype that needs no cast; the others are remembered as
    None, so that an answer with one of them is not looked at again. A strict model's checks look at shapes too:
    none remembered.
    """
    if spec.strict or type(returned) is not dict:
        return
    passed = spec.passed_outputs
    if len(passed) >= PASSED_LIMIT:
        passed.clear()
    declared = spec.output_by_name
    for name, value in returned.items():
        if type(value) is not np.ndarray:
            continue
        key = (name, value.dtype)
        try:
            if key in passed:
                continue
        except TypeError:  # a dtype numpy cannot hash: never remembered
            continue
        tensor = declared.get(name)
        wire_type: Optional[str] = None
        if tensor is not None:
            datatype = datatype_of_dtype(value.dtype)
            if (
                datatype is not None
                and datatype != BYTES
                and (datatype == tensor.datatype or not _casts(datatype, tensor.datatype))
            ):
                wire_type = BF16 if datatype == "FP32" and tensor.datatype == BF16 else datatype
        passed[key] = wire_type


def _selected(
    spec: ModelSpec, result: Dict[str, Any], requested: Optional[Sequence[str]], notices: Optional[OutputNotices]
) -> List[str]:
    """The outputs a response carries, in the order the callable returned them, as NVIDIA's PyTriton sends them.

    Its proxy hands Triton the callable's outputs in the dict's order, whatever order the request named them in
    (or none): Triton answers in that order (measured: a callable returning `diff` before `sum`, the config
    declaring `sum` first, answered `diff`, `sum` to requests naming none, `[]`, `sum,diff` and `diff,sum,diff`).
    """
    if requested is None:
        declared = spec.output_by_name
        return [name for name in result if name in declared]
    if notices is not None:
        for name in requested:
            if name not in result:
                notices.unreturned_output(name)
    wanted = set(requested)
    return [name for name in result if name in wanted]


def _checked(spec: ModelSpec, result: Any, notices: Optional[OutputNotices]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """One response dict checked (framework arrays as numpy, declared casts done) and its outputs' datatypes."""
    if isinstance(result, (Request, Response)):
        result = result.data
    if not isinstance(result, dict):
        if type(result) is UnsentResponse:
            raise InferenceError.internal(result.reason)
        raise InferenceError.internal(
            f"Outputs returned by `{spec.name}` model callable must be list of response dicts with numpy arrays. "
            f"Got response={_short(result, text=str)} instead."
        )
    result = host_arrays(result)
    datatypes: Dict[str, str] = {}
    cast: Optional[Dict[str, np.ndarray]] = None
    for name, value in result.items():
        datatype = datatypes[name] = _check_output_value(spec, name, value)
        if spec.strict:
            _check_output_against_config(spec, name, value, datatype)
        else:
            declared = spec.output_by_name.get(name)
            if declared is None:
                if notices is not None:
                    notices.undeclared_output(name)
            elif datatype != declared.datatype and _casts(datatype, declared.datatype):
                cast = cast if cast is not None else {}
                cast[name] = _cast(value, datatype, declared.datatype)
                datatypes[name] = declared.datatype
    if cast is not None:
        result = {**result, **cast}
    return result, datatypes


def _too_large(spec: ModelSpec, names: Sequence[str], size: int) -> InferenceError:
    """Outputs of more bytes than a response may carry."""
    listed = ", ".join(f"'{name}'" for name in names)
    return InferenceError.internal(
        f"the outputs {listed} returned by model '{spec.name}' take {size} bytes, more than the "
        f"{spec.max_response_bytes} bytes a response may carry on this server"
    )


def _casts(returned: str, declared: str) -> bool:
    """Whether an output returned as `returned` goes out as its declared datatype, cast as NVIDIA's PyTriton casts.

    Its proxy sends every output `astype` the declared dtype: numbers and booleans to another number type,
    numbers and booleans of a BYTES output as their text (`_as_text`), and strings of a number or BOOL output as
    the values they spell (`_cast`). FP32 values of a BF16 output (sent as BF16 below) go out as they are.
    """
    return declared != BF16


def _cast(value: np.ndarray, returned: str, declared: str) -> np.ndarray:
    """An output's array as its declared datatype, as NVIDIA's PyTriton's `astype` makes it.

    Strings (str or bytes) of a number or BOOL output are parsed by numpy (measured with 0.7: `"1.5"` and `b"1.5"`
    of an FP32 output went out as FP32 1.5); a string numpy cannot read fails the request in numpy's words, as
    0.7's traceback ends (`ValueError: could not convert string to float: 'a'`).
    """
    if declared == BYTES:
        return _as_text(value)
    if returned != BYTES:
        return value.astype(numpy_dtype(declared))
    try:
        return value.astype(numpy_dtype(declared))
    except (ValueError, TypeError, OverflowError) as error:
        raise InferenceError.internal(f"{type(error).__name__}: {error}") from None


def _as_text(value: np.ndarray) -> np.ndarray:
    """Numbers or booleans of a BYTES output as NVIDIA's PyTriton sends them: each Python value's str, encoded.

    Measured: int32 7 went out as "7", float32 0.1 as "0.10000000149011612", True as "True".
    """
    texts = [str(item).encode() for item in value.astype(object).flat]
    return np.array(texts, dtype=object).reshape(value.shape)


def _check_output_value(spec: ModelSpec, name: Any, value: Any) -> str:
    """PyTriton's checks that apply in every mode; returns the output's protocol datatype."""
    if not isinstance(name, str):
        raise InferenceError.internal(f"Not all keys returned by `{spec.name}` model callable are string")
    if not isinstance(value, np.ndarray):
        raise InferenceError.internal(not_an_array(spec.name, name, value))
    dtype = value.dtype
    datatype = datatype_of_dtype(dtype)
    if datatype is not None and datatype != "BYTES":  # every numeric datatype passes the kind check below
        return datatype
    kind = dtype.kind
    if datatype is None or (kind not in _ALLOWED_KINDS and dtype != BF16_DTYPE):
        raise InferenceError.internal(
            f"Only bool, numeric, string, unicode and object arrays are supported by Triton "
            f"(dtype.kind: {_ALLOWED_KINDS}). Returned `{name}` for model `{spec.name}` has `{kind}` dtype.kind."
        )
    if kind == "O" and value.size:
        first = value.flat[0]
        if isinstance(first, str):
            raise InferenceError.internal(
                f"Use string/byte-string instead of object for passing string in NumPy array from model `{spec.name}`."
            )
        if not isinstance(first, bytes):
            raise InferenceError.internal(
                f"Only bytes as objects dtype are supported by PyTriton. Returned `{name}` from `{spec.name}` has "
                f"`{type(first)}` type."
            )
    return datatype


def _check_output_against_config(spec: ModelSpec, name: str, value: np.ndarray, returned: str) -> None:
    """PyTriton's strict-mode checks of dtype and shape against the declared output."""
    tensor = spec.output_by_name.get(name)
    if tensor is None:
        raise InferenceError.internal(
            f"Returned output `{name}` is not defined in model config for model `{spec.name}`."
        )
    expected_dtype = next(s.dtype for s in spec.output_specs if s.name == name)
    if returned != datatype_of_config_dtype(expected_dtype) and not (tensor.datatype == "BF16" and returned == "FP32"):
        raise InferenceError.internal(
            f"Returned output `{name}` for model `{spec.name}` has invalid type. "
            f"Returned: {value.dtype} ({value.dtype.kind}). Expected: {expected_dtype}."
        )
    dims = value.shape[1:] if spec.batching else value.shape
    if len(dims) != len(tensor.dims):
        raise InferenceError.internal(
            f"Returned output `{name}` for model `{spec.name}` has invalid shapes. "
            f"Returned: {dims}. Expected: {tensor.dims}."
        )
    if any(want != -1 and want != got for got, want in zip(dims, tensor.dims)):
        raise InferenceError.internal(
            f"Returned output `{name}` for model `{spec.name}` has invalid shapes at one or more positions. "
            f"Returned: {dims}. Expected: {tensor.dims}."
        )


def not_an_array(model: Optional[str], name: Any, value: Any) -> str:
    """The message for an output value that is no numpy array: NVIDIA's words, then which output, what it is, the fix.

    `model` is None where the model's name is not known (a decorated callable called outside a server).
    """
    kind = type(value)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return (
        f"Not all values returned by {'the' if model is None else f'`{model}`'} model callable are numpy arrays: "
        f"output `{name}` is a {type_name} ({_short(value, 60)}); return it as a numpy array (np.asarray(...))"
    )


def _short(value: Any, limit: int = 200, text: Callable[[Any], str] = repr) -> str:
    """A bounded repr (or `text` of it) for error messages.

    NVIDIA's PyTriton writes what a callable returned with `str` in its own messages (`Got outputs=[0. 0. 0.]`).
    """
    written = text(value)
    return written if len(written) <= limit else written[:limit] + "..."
