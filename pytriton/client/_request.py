"""Request preparation shared by all clients: argument checks, input naming, batch axis, tritonclient wrappers."""

from __future__ import annotations

import dataclasses
import logging
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from pytriton.client.exceptions import PyTritonClientModelDoesntSupportBatchingError, PyTritonClientValueError
from pytriton.model_config.triton_model_config import TritonModelConfig

LOGGER = logging.getLogger("pytriton.client")

Parameters = Dict[str, Union[str, int, bool]]
Arrays = Dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class InferCall:
    """The arguments of one `infer_sample` (sample=True) or `infer_batch` call."""

    inputs: Tuple[Any, ...]
    named_inputs: Mapping[str, Any]
    parameters: Optional[Parameters]
    headers: Optional[Parameters]
    sample: bool


def check_call(
    inputs: Tuple[Any, ...],
    named_inputs: Mapping[str, Any],
    parameters: Optional[Parameters],
    headers: Optional[Parameters],
) -> None:
    """Check what an infer call was given: inputs one way or the other, str/int/bool parameters and headers.

    Raises:
        PyTritonClientValueError: if there are no inputs, both positional and named ones,
            or parameters or headers of the wrong type.
    """
    if not inputs and not named_inputs:
        raise PyTritonClientValueError("Provide input data")
    if inputs and named_inputs:
        raise PyTritonClientValueError("Use either positional either keyword method arguments convention")
    for mapping in (parameters, headers):
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise PyTritonClientValueError("Parameters and headers must be a dictionary")
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise PyTritonClientValueError("Parameter/header key must be a string")
            if not isinstance(value, (str, int, bool)):
                raise PyTritonClientValueError("Parameter/header value must be a string, integer or boolean")


class UnsupportedArrayError(PyTritonClientValueError, RuntimeError):
    """An array the protocol cannot carry as it is (unicode text): nvidia-pytriton raises RuntimeError for it."""


def name_inputs(config: TritonModelConfig, inputs: Tuple[Any, ...], named_inputs: Mapping[str, Any]) -> Arrays:
    """Inputs by name (positional ones follow the config's order), each checked to be a supported array.

    Positional inputs past the model's are dropped, with a warning, as nvidia-pytriton drops them.

    Raises:
        PyTritonClientValueError: if an input is not a numpy array of a supported type (a unicode or
            non-bytes object array is also a RuntimeError, which nvidia-pytriton raises for it).
    """
    if inputs:
        names = [spec.name for spec in config.inputs or []]
        if len(inputs) > len(names):  # nvidia-pytriton drops the extra ones without a word: dropped, and said
            extra = len(inputs) - len(names)
            LOGGER.warning(
                "model %s has %d %s, but %d were given: the last %s",
                config.model_name,
                len(names),
                "input" if len(names) == 1 else "inputs",
                len(inputs),
                "one is not sent" if extra == 1 else f"{extra} are not sent",
            )
        named = dict(zip(names, inputs))
    else:
        named = dict(named_inputs)
    for name, array in named.items():
        _check_array(name, array)
    return named


def _check_array(name: str, array: Any) -> None:
    """Accept numeric, bool and bytes arrays (object arrays must hold bytes); refuse unicode ones."""
    if not isinstance(array, np.ndarray):
        raise PyTritonClientValueError(f"Input {name} is not a numpy array. Got {type(array)} instead.")
    if array.dtype.type == np.str_:
        raise UnsupportedArrayError(
            f"Unicode inputs are not supported. Encode numpy array for {name!r} input "
            "(ex. with np.char.encode(array, 'utf-8'))."
        )
    if array.dtype == np.object_ and array.size and not isinstance(array.reshape(-1)[0], bytes):
        element = type(array.reshape(-1)[0])
        raise UnsupportedArrayError(
            f"Numpy array for {name!r} input with dtype=object should contain encoded strings "
            f"(e.g. into utf-8). Element type: {element}"
        )
    if np_to_triton_dtype(array.dtype) is None:
        raise PyTritonClientValueError(f"Input {name!r} has an unsupported dtype {array.dtype}")


def batch_inputs(config: TritonModelConfig, inputs: Arrays, sample: bool) -> Arrays:
    """Inputs as sent: a sample gains a batch axis for batching models; a batch needs a batching model.

    Raises:
        PyTritonClientModelDoesntSupportBatchingError: if a batch is given to a model without batching.
    """
    if config.max_batch_size > 0:
        return {name: array[np.newaxis, ...] for name, array in inputs.items()} if sample else inputs
    if not sample:
        raise PyTritonClientModelDoesntSupportBatchingError(
            f"Model {config.model_name} doesn't support batching - use infer_sample method instead"
        )
    return inputs


def unbatch_outputs(config: TritonModelConfig, outputs: Arrays, sample: bool) -> Arrays:
    """Outputs as returned: a sample's outputs lose the batch axis the request gained."""
    if sample and config.max_batch_size > 0:
        return {name: array[0] for name, array in outputs.items()}
    return outputs


def infer_inputs(lib: ModuleType, inputs: Arrays) -> List[Any]:
    """The arrays wrapped in tritonclient InferInput objects of `lib`'s protocol."""
    wrapped = []
    for name, array in inputs.items():
        infer_input = lib.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        infer_input.set_data_from_numpy(array)
        wrapped.append(infer_input)
    return wrapped


def requested_outputs(lib: ModuleType, config: TritonModelConfig) -> List[Any]:
    """A tritonclient InferRequestedOutput for every output of the model."""
    return [lib.InferRequestedOutput(spec.name) for spec in config.outputs or []]


def result_arrays(result: Any) -> Arrays:
    """The outputs of a tritonclient InferResult (HTTP's response is a dict, gRPC's a message)."""
    response = result.get_response()
    if isinstance(response, dict):
        names = [output["name"] for output in response.get("outputs", [])]
    else:
        names = [output.name for output in response.outputs]
    return {name: result.as_numpy(name) for name in names}


def header_values(headers: Optional[Mapping[str, object]], lowercase: bool) -> Optional[Dict[str, str]]:
    """Headers as strings; gRPC metadata keys must be lowercase."""
    if not headers:
        return None
    return {(key.lower() if lowercase else key): str(value) for key, value in headers.items()}
