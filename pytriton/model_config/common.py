"""Configuration structures shared by the user-facing and the internal model config, and warm-up data."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from pytriton.exceptions import PyTritonBadParameterError


class DeviceKind(enum.Enum):
    """Device kind for model deployment."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """Action applied to a request whose queue timeout expired."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """Model queue policy configuration (Triton's ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """Dynamic batcher configuration (Triton's ModelDynamicBatching)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Optional[List[int]] = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: Optional[QueuePolicy] = None
    priority_queue_policy: Optional[Dict[int, QueuePolicy]] = None


@dataclasses.dataclass
class WarmupInput:
    """Data of one input of a warm-up request (Triton's ModelWarmup.Input): zeros, random or from a .npy file.

    Args:
        dtype: numpy dtype of the data.
        shape: shape of one sample (without the batch axis).
        zero_data: fill with zeros.
        random_data: fill with random values.
        input_data_file: a .npy file holding the data.
    """

    dtype: Union[Type[np.dtype], Type[object]]
    shape: Sequence[int]
    zero_data: Optional[bool] = False
    random_data: Optional[bool] = False
    input_data_file: Optional[str] = None


@dataclasses.dataclass
class ModelWarmup:
    """Requests the model runs before it reports ready (Triton's ModelWarmup).

    Args:
        name: name of the warm-up.
        batch_size: rows of each request.
        inputs: the data of each input, by input name.
        count: how many times the request runs.
    """

    name: str
    batch_size: int
    inputs: Dict[str, WarmupInput]
    count: int


def generate_warmup_data(warmup_input: WarmupInput, batch_size: int) -> np.ndarray:
    """The array of one warm-up input: `batch_size` rows of the input's shape.

    Raises:
        PyTritonBadParameterError: no data source is set, or the file's data does not fit the shape.
    """
    if not (warmup_input.zero_data or warmup_input.random_data or warmup_input.input_data_file):
        raise PyTritonBadParameterError(
            "One of 'zero_data', 'random_data', or 'input_data_file' must be provided for warmup input."
        )
    shape = tuple(warmup_input.shape)
    full_shape = (batch_size, *shape)
    dtype = np.dtype(warmup_input.dtype)
    if warmup_input.input_data_file:
        return _file_data(warmup_input.input_data_file, shape, batch_size).astype(dtype)
    if warmup_input.zero_data:
        return np.zeros(full_shape, dtype=dtype)
    return _random_data(dtype, full_shape)


def _file_data(path: str, shape: Tuple[int, ...], batch_size: int) -> np.ndarray:
    """Data from a .npy file: one sample repeated, or rows repeated or cut to `batch_size`."""
    data: np.ndarray = np.load(path)
    full_shape = (batch_size, *shape)
    if data.shape == full_shape:
        return data
    if data.ndim == len(shape):
        return np.repeat(data[np.newaxis, ...], batch_size, axis=0)
    if data.shape[1:] == shape:
        repeats = -(-batch_size // data.shape[0])
        return np.tile(data, (repeats,) + (1,) * (data.ndim - 1))[:batch_size]
    raise PyTritonBadParameterError(f"Input data file shape {data.shape} doesn't match expected shape {full_shape}")


def _random_data(dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
    """Random values of a dtype: booleans, integers within small bounds, floats in [0, 1), strings of 8-32 chars."""
    rng = np.random.default_rng()
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        low, high = (info.min, info.max) if info.bits <= 16 else (0, 100)
        return rng.integers(low, high, size=shape, dtype=dtype, endpoint=False)
    if np.issubdtype(dtype, np.floating):
        return rng.random(shape).astype(dtype)
    if dtype.kind in "SO":
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
        count = int(np.prod(shape))
        words = ["".join(rng.choice(letters, rng.integers(8, 33))).encode() for _ in range(count)]
        return np.array(words, dtype=dtype).reshape(shape)
    return np.zeros(shape, dtype=dtype)


def generate_warmup_requests(
    model_warmup: List[ModelWarmup], input_specs: List[Any], outputs_specs: List[Any]
) -> List[Dict[str, np.ndarray]]:
    """The inputs of every warm-up request, each warm-up `count` times (the specs are accepted as PyTriton's)."""
    return [
        {name: generate_warmup_data(warmup_input, warmup.batch_size) for name, warmup_input in warmup.inputs.items()}
        for warmup in model_warmup or []
        for _ in range(warmup.count)
    ]
