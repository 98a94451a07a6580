"""JSON tensor data on the wire (KServe v2 `data`), both ways; raw bytes are in `pytriton.core.tensors.raw_tensors`."""

from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from pytriton.core.errors import InferenceError, Status
from pytriton.core.tensors.datatypes import BYTES, numpy_dtype
from pytriton.core.tensors.raw_tensors import element_count, object_array


class OutOfRange(InferenceError):
    """JSON values outside their datatype's range: this server's refusal, which tritonserver 2.51 does not make.

    It wraps integers around and makes floats infinite: any other refusal of the request comes first.
    """


def array_from_json(data: Any, datatype: str, shape: Sequence[int], name: str, model: str = "") -> np.ndarray:
    """Build an array from JSON `data` (flat or nested, row-major).

    With the `model` named (HTTP infer), values JSON cannot give the datatype (`1.5` or `true` for an integer type,
    `-1` for an unsigned one, a number past 64 bits, a string for FP32, a number for BYTES...) and values or strings
    too many or too few for the shape are refused in tritonserver 2.51's words; values it would wrap around or make
    infinite (300 for INT8, 2**63 for UINT16, 1e39 for FP32) are refused in this server's.
    """
    if type(data) is not list:
        data = [data]
    try:
        return _array_from_json(data, datatype, shape, name, model)
    except InferenceError as error:
        in_triton_words = _in_triton_words(error, data, datatype, model)
        if in_triton_words is None:
            raise
        raise in_triton_words from None


def array_from_json_in_pieces(data: Any, datatype: str, shape: Sequence[int], name: str, model: str = "") -> np.ndarray:
    """`array_from_json`, a long list of numbers made an array a piece at a time (off the event loop).

    A function of its own, not an argument of array_from_json: that argument, passed down, was a cost of every
    small JSON request on the loop.
    """
    if type(data) is not list:
        data = [data]
    try:
        return _array_from_json(data, datatype, shape, name, model, _numeric_in_pieces_or_any_nesting)
    except InferenceError as error:
        in_triton_words = _in_triton_words(error, data, datatype, model)
        if in_triton_words is None:
            raise
        raise in_triton_words from None


def _in_triton_words(error: InferenceError, data: List[Any], datatype: str, model: str) -> Optional[InferenceError]:
    """array_from_json's refusal of `data` as tritonserver 2.51 words it, where it refuses such values; else None."""
    if not model or not error.message.startswith(_UNFIT) or not _fits_no_64_bit_reading(data, datatype):
        return None
    return InferenceError.invalid(_TRITON_UNFIT[datatype])


# The start of this server's refusal of values that do not fit their datatype.
_UNFIT = "unable to parse 'data'"
# What tritonserver 2.51 answers such values with, by the datatype (a 500 there, for what the client sent).
_TRITON_UNFIT = {
    **{
        f"INT{bits}": "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
        for bits in (8, 16, 32, 64)
    },
    **{
        f"UINT{bits}": "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"
        for bits in (8, 16, 32, 64)
    },
    "FP32": "Unable to parse 'data': attempt to access JSON non-number as double",
    "FP64": "Unable to parse 'data': attempt to access JSON non-number as double",
    "BOOL": "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
    BYTES: "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
}


def _fits_no_64_bit_reading(data: List[Any], datatype: str) -> bool:
    """Whether some value of refused `data` is none Triton reads for the datatype (int64, uint64, double, ...).

    False when every value is one Triton reads and then narrows (wraps 300 to INT8's 44, makes 1e39 FP32's inf).
    """
    if datatype.startswith("INT"):
        low, high = -(1 << 63), (1 << 63) - 1
    elif datatype.startswith("UINT"):
        low, high = 0, (1 << 64) - 1
    elif datatype.startswith("FP"):
        return not all(type(value) in (int, float) for value in _flatten(data))
    else:
        return True
    return not all(type(value) is int and low <= value <= high for value in _flatten(data))


def _numeric_array_of_any_nesting(data: List[Any], dtype: np.dtype) -> np.ndarray:
    """`numeric_array` of JSON data nested in any way: lists of unequal lengths too, read row-major.

    Triton reads a tensor's JSON elements in order whatever the lists around them (`[[1], [2, 3]]` is 3 values), and
    only their count must fit the shape; numpy refuses such lists, so they are flattened first (only then: the lists
    that fit a shape, the usual ones, are read whole by numpy).
    """
    try:
        return numeric_array(data, dtype)
    except ValueError:
        if not any(type(item) is list for item in data):
            raise
    return numeric_array(_flatten(data), dtype)


def _array_from_json(
    data: List[Any],
    datatype: str,
    shape: Sequence[int],
    name: str,
    model: str,
    numeric: Callable[[List[Any], np.dtype], np.ndarray] = _numeric_array_of_any_nesting,
) -> np.ndarray:
    """`array_from_json` in this server's words (numbers made an array by `numeric`)."""
    try:
        dtype = _JSON_NUMERIC.get(datatype)
        if dtype is not None:  # nesting that fits a shape: numpy flattens it row-major with the reshape below
            array = numeric(data, dtype)
        elif datatype == BYTES:
            array = object_array([_to_bytes(item, name) for item in _flatten(data)])
        elif datatype == "BOOL":
            flat = _flatten(data)
            if not all(isinstance(item, bool) for item in flat):
                raise InferenceError.invalid(f"unable to parse 'data' of input '{name}': expected JSON booleans")
            array = np.array(flat, dtype=np.bool_)
        else:
            raise InferenceError.invalid(  # Triton's words
                f"receiving {datatype} data via JSON is not supported. "
                f"Please use the binary data format for input {name}"
            )
    except OverflowError as error:
        if model and len(_flatten(data)) != element_count(shape):  # the frontend counts the values first
            raise InferenceError.invalid(_TRITON_COUNT) from None
        raise OutOfRange(
            Status.INVALID_ARGUMENT, f"unable to parse 'data' of input '{name}' as {datatype}: {error}"
        ) from None
    except (ValueError, TypeError) as error:
        raise InferenceError.invalid(f"unable to parse 'data' of input '{name}' as {datatype}: {error}") from None
    count = element_count(shape)
    if array.size != count:
        if datatype == BYTES and model:
            raise InferenceError.invalid_input(_string_count_error(array.size, count, name, model))
        if model:
            raise InferenceError.invalid(_TRITON_COUNT)
        raise InferenceError.invalid(
            f"unexpected number of elements {array.size} in 'data' of input '{name}', shape {list(shape)} "
            f"expects {count}"
        )
    try:
        return array.reshape(shape)
    except ValueError as error:  # more dimensions than numpy has (64): the model's refusal of the shape comes first
        raise InferenceError.invalid_input(
            f"input '{name}' has shape of {len(shape)} dimensions, more than an array may have: {error}"
        ) from None


# tritonserver 2.51's words (a 500 there) for JSON data of more or fewer values than the shape holds.
_TRITON_COUNT = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def _string_count_error(size: int, count: int, name: str, model: str) -> str:
    """The words of tritonserver 2.51 for a BYTES input of `size` strings where its shape holds `count`."""
    if size > count:
        return f"unexpected number of string elements {size} for inference input '{name}' for model '{model}', " + (
            f"expecting {count}"
        )
    return f"expected {count} string elements for inference input '{name}' for model '{model}', got {size}"


def _numeric_in_pieces_or_any_nesting(data: List[Any], dtype: np.dtype) -> np.ndarray:
    """`_numeric_array_of_any_nesting`, a long list a piece at a time (`_numeric_in_pieces`) where it can be."""
    pieced = _numeric_in_pieces(data, dtype)
    return pieced if pieced is not None else _numeric_array_of_any_nesting(data, dtype)


# A list of this many numbers or more is made an array a piece at a time (a few hundred µs of numpy each).
_PIECE_VALUES = 32768
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)


def _numeric_in_pieces(data: List[Any], dtype: np.dtype) -> Optional[np.ndarray]:
    """`numeric_array(data, dtype)` for a long list (flat, or of equal rows), made a piece at a time.

    None when the values are any but numbers JSON holds in 64 bits: the whole list then goes to numeric_array
    (which refuses it in its words, or reads it).

    One numpy call over 16 Mi values held the GIL for a quarter of a second, in whichever thread made it: a
    large request decoded off the event loop (transport/codec_threads.py) still held the loop that long. The
    result is the whole list's: numpy makes the whole list float64 when any value is a float, int64 when none
    is, and so is each piece made, then cast as the whole would be.
    """
    while len(data) == 1 and type(data[0]) is list:  # [[...]]: the batch dimension of one
        data = data[0]
    rows = len(data)
    if not rows:
        return None
    width = len(data[0]) if type(data[0]) is list else 0
    step = max(1, _PIECE_VALUES // width) if width else _PIECE_VALUES
    if rows * max(width, 1) < _PIECE_VALUES:
        return None
    pieces: List[np.ndarray] = []
    for start in range(0, rows, step):
        chunk = data[start : start + step]
        if _holds_bool(chunk):
            return None
        try:
            piece = np.array(chunk)
        except ValueError:  # rows of unequal lengths
            return None
        if (piece.dtype != _INT64 and piece.dtype != _FLOAT64) or piece.ndim != (2 if width else 1):
            return None
        if width and piece.shape[1] != width:
            return None
        pieces.append(piece)
    floats = any(piece.dtype == _FLOAT64 for piece in pieces)
    out = np.empty((rows, width) if width else rows, dtype)
    start = 0
    if dtype.kind == "f":
        with np.errstate(over="raise"):  # as numeric_array: a float beyond the dtype's range is refused
            for piece in pieces:
                try:
                    out[start : start + len(piece)] = piece.astype(_FLOAT64 if floats else piece.dtype).astype(dtype)
                except FloatingPointError:
                    return None
                start += len(piece)
        return out
    if floats:
        return None
    info = np.iinfo(dtype)
    for piece in pieces:
        if piece.min() < info.min or piece.max() > info.max:
            return None
        out[start : start + len(piece)] = piece
        start += len(piece)
    return out


# Datatypes JSON carries as numbers (FP16 and BF16 travel as binary data only).
_JSON_NUMERIC = {
    datatype: numpy_dtype(datatype)
    for datatype in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
}


def numeric_array(values: Any, dtype: np.dtype) -> np.ndarray:
    """An array of numbers in `dtype`; values out of its range raise OverflowError on numpy 1 and 2 alike.

    JSON booleans are not numbers (Triton refuses them), though Python's are ints and numpy turns [1, true] into
    [1, 1].
    """
    if dtype.kind in "fiu" and type(values) is list and _holds_bool(values):
        raise ValueError("expected JSON numbers, got booleans")
    if dtype.kind == "f":
        if dtype == _FLOAT32 and type(values) is list and len(values) <= _PACK_LIMIT:
            packed = _packed_float32(values)
            if packed is not None:
                return packed
        array = np.array(values)  # what JSON holds first: numpy would turn null into NaN and "2" into 2.0
        if array.size and array.dtype.kind not in "iuf":
            if array.dtype.kind != "O" or not all(type(value) in (int, float) for value in array.flat):
                raise ValueError(f"expected JSON numbers, got {_json_kind(array)}")
            array = np.array(array.tolist(), dtype=np.float64)  # integers past int64 next to negative ones
        if dtype.itemsize == 8:  # every Python float fits a float64
            return array.astype(dtype, copy=False)  # numpy made float64 already: no second copy
        with np.errstate(over="raise"):  # a float beyond the dtype's range is an error, not a warning and inf
            try:
                return array.astype(dtype, copy=False)
            except FloatingPointError:
                raise OverflowError(f"values outside the range of {dtype.name}") from None
    if dtype.kind not in "iu":
        return np.array(values, dtype=dtype)
    array = np.array(values)
    if not array.size:
        return array.astype(dtype)
    if array.dtype.kind not in "iub" and dtype == np.uint64:
        array = np.array(values, dtype=np.object_).reshape(-1)  # numpy 1 turns ints above int64 into floats
        if not all(type(value) is int for value in array):
            raise ValueError("expected integers")
        if min(array) < 0 or max(array) > np.iinfo(np.uint64).max:
            raise OverflowError("values outside the range of uint64")
        return np.array(values, dtype=np.uint64)
    if array.dtype.kind not in "iub":
        if array.dtype.kind == "f" and all(
            type(value) is int for value in np.array(values, np.object_).reshape(-1).tolist()
        ):
            raise OverflowError(f"values outside the range of {dtype.name}")  # past int64: numpy made them floats
        raise ValueError(f"expected integers, got {array.dtype.name} values")
    info = np.iinfo(dtype)
    if array.min() < info.min or array.max() > info.max:
        raise OverflowError(f"values outside the range of {dtype.name}")
    return array.astype(dtype)


def _holds_bool(values: List[Any]) -> bool:
    """Whether a JSON list, nested or not, holds a boolean (one pass over the types of each list, in C).

    Nested lists are walked with a stack, not recursion: JSON may nest a thousand deep.
    """
    pending = [values]
    while pending:
        items = pending.pop()
        kinds = set(map(type, items))
        if bool in kinds:
            return True
        if list in kinds:
            pending.extend(item for item in items if type(item) is list)
    return False


def _json_kind(array: np.ndarray) -> str:
    """What a numpy array built from JSON values holds, in JSON's words."""
    return {"b": "booleans", "U": "strings", "O": "nulls or mixed values"}.get(array.dtype.kind, array.dtype.name)


_FLOAT32 = np.dtype(np.float32)
_PACK_LIMIT = 1 << 16  # values packed in one struct call (they become its arguments)


def _packed_float32(values: List[Any]) -> Optional[np.ndarray]:
    """A flat list of numbers as float32, or None when it is not one (nested lists, strings, ...).

    struct refuses out-of-range values itself, which costs far less than numpy's conversion under
    np.errstate (what everything else goes through). For 16 values, a kept Struct packs in 200 ns where
    struct.pack_into's format string costs 310, and frombuffer with its dtype passed by position takes 140 ns
    where the keyword takes 260.
    """
    count = len(values)
    packer = _PACKERS.get(count)
    if packer is None:
        packer = struct.Struct(f"={count}f")
        if len(_PACKERS) < _KEPT_PACKERS:
            _PACKERS[count] = packer
    buffer = bytearray(4 * count)
    try:
        packer.pack_into(buffer, 0, *values)
    except struct.error:
        return None
    except OverflowError:
        raise OverflowError("values outside the range of float32") from None
    return np.frombuffer(buffer, _FLOAT32)


# Packers of the list lengths seen first (a server's requests come in a few sizes).
_PACKERS: Dict[int, struct.Struct] = {}
_KEPT_PACKERS = 256


def json_from_array(array: np.ndarray, datatype: str) -> Any:
    """JSON-serializable flat data of an array (numpy arrays are left for orjson to encode).

    FP32 values go out as the doubles they are (tritonserver widens each to a double before it writes it): a JSON
    client that reads numbers as doubles gets the value the model returned, not the shortest decimal of its float.

    FP16 and BF16 have no JSON form in Triton either way: an output of theirs asked for as JSON is refused
    (tritonserver 2.51 answers 400, in these words), so a client that asked for no binary outputs (KServe's
    InferenceRESTClient, curl) learns to ask for them here as it would there.
    """
    if datatype == BYTES:
        return [_to_text(item) for item in array.flat]
    check_json_output(datatype)
    flat = array.ravel()  # a view when the array is C-contiguous, else a C-ordered copy
    if flat.dtype.kind == "f" and flat.dtype.itemsize == 4:  # float32, of either byte order
        return flat.astype(np.float64)  # its exact values, as Triton writes them: 0.1f as 0.10000000149011612
    if flat.dtype.byteorder == ">":
        flat = flat.astype(flat.dtype.newbyteorder("<"))
    return flat


def check_json_output(datatype: str) -> None:
    """Refuse an output of a datatype JSON cannot carry (FP16, BF16), in tritonserver's words."""
    if datatype not in _JSON_NUMERIC and datatype not in (BYTES, "BOOL"):
        raise InferenceError.invalid(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
        )


def _flatten(data: List[Any]) -> List[Any]:
    """Flatten nested JSON lists, row-major."""
    if not any(isinstance(item, list) for item in data):
        return data
    flat: List[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _to_bytes(item: Any, name: str) -> bytes:
    """A JSON BYTES element as bytes."""
    if isinstance(item, str):
        return item.encode("utf-8")
    raise InferenceError.invalid(f"unable to parse 'data' of input '{name}': expected JSON strings for BYTES")


def _to_text(item: Any) -> str:
    """A BYTES element as JSON text."""
    if isinstance(item, (bytes, np.bytes_)):
        return bytes(item).decode("utf-8", errors="replace")
    return str(item)
