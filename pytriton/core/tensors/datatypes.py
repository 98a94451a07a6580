"""Triton datatypes: names, numpy types, config enums, element sizes."""

from __future__ import annotations

from typing import Any, Dict, Optional

import ml_dtypes
import numpy as np

from pytriton.core.errors import InferenceError

BYTES = "BYTES"
BF16 = "BF16"

BF16_DTYPE = np.dtype(ml_dtypes.bfloat16)

# Protocol datatype -> numpy dtype of the arrays handed to callables (BF16 as ml_dtypes.bfloat16, as tritonclient).
_NUMPY_BY_DATATYPE: Dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    BF16: BF16_DTYPE,
    BYTES: np.dtype(np.object_),
}

# Wire element size in bytes of each fixed-size datatype.
ELEMENT_SIZE: Dict[str, int] = {name: dtype.itemsize for name, dtype in _NUMPY_BY_DATATYPE.items() if name != BYTES}

_DATATYPE_BY_KIND_SIZE: Dict[tuple, str] = {  # type: ignore[type-arg]
    (dtype.kind, dtype.itemsize): name for name, dtype in _NUMPY_BY_DATATYPE.items() if name not in (BYTES, BF16)
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of arrays holding a protocol datatype."""
    try:
        return _NUMPY_BY_DATATYPE[datatype]
    except KeyError:
        raise InferenceError.invalid(f"invalid datatype '{datatype}'") from None


def is_known_datatype(datatype: str) -> bool:
    """Tell whether a datatype name is a protocol datatype."""
    return datatype in _NUMPY_BY_DATATYPE


def datatype_of_dtype(dtype: np.dtype) -> Optional[str]:
    """The protocol datatype of a numpy dtype (bytes, str and object are BYTES); None if none fits."""
    try:
        return _DATATYPE_BY_DTYPE[dtype]  # one dict lookup on the request path; dtype == dtype is slower
    except KeyError:
        pass
    except TypeError:  # a dtype numpy cannot hash (structured with unhashable metadata): no datatype
        return None
    if dtype.kind in "OSU":
        datatype: Optional[str] = BYTES
    elif dtype == BF16_DTYPE:
        datatype = BF16
    else:
        datatype = _DATATYPE_BY_KIND_SIZE.get((dtype.kind, dtype.itemsize))
    if len(_DATATYPE_BY_DTYPE) < _DTYPE_CACHE_SIZE:
        _DATATYPE_BY_DTYPE[dtype] = datatype
    return datatype


_DTYPE_CACHE_SIZE = 256  # dtypes seen so far (sizes of str/bytes dtypes vary, so there can be many)
_DATATYPE_BY_DTYPE: Dict[np.dtype, Optional[str]] = {}


def datatype_of_config_dtype(dtype: Any) -> str:
    """The protocol datatype of a Tensor dtype given as numpy type, np.dtype, str, bytes or object."""
    if dtype in (bytes, str, object, np.bytes_, np.str_, np.object_):
        return BYTES
    if dtype == "bfloat16":
        return BF16
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unsupported tensor dtype {dtype!r}") from None
    datatype = datatype_of_dtype(resolved)
    if datatype is None:
        raise ValueError(f"unsupported tensor dtype {dtype!r}")
    return datatype


def config_enum(datatype: str) -> str:
    """The model config enum name of a datatype (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"
