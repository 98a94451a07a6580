"""Raw tensor bytes, both ways: Triton's binary extension and gRPC raw contents, and what the engine stores.

Fixed-size datatypes are views where they can be; BYTES tensors are 4-byte little-endian lengths, each
followed by its bytes.
"""

from __future__ import annotations

import itertools
import math
import struct
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.tensors.datatypes import BF16, BF16_DTYPE, BYTES, ELEMENT_SIZE, numpy_dtype

Buffer = Union[bytes, bytearray, memoryview]

_LENGTH = struct.Struct("<I")


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a shape."""
    return math.prod(shape)


# A BYTES tensor of more elements is written a piece of this many at a time (serialize_bytes_tensor).
PIECE_ELEMENTS = 16384


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor: per element a 4-byte little-endian length, then the bytes."""
    parts: List[bytes] = []
    pack = _LENGTH.pack
    for item in array.flat:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = bytes(item) if isinstance(item, np.bytes_) else str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def object_array(items: List[Any]) -> np.ndarray:
    """A flat object array of `items`; a long list's assigned PIECE_ELEMENTS at a time.

    Assigned at once, a million strings held the GIL 20 ms, in whichever thread (a codec thread's: the loop waited).
    """
    array = np.empty(len(items), dtype=np.object_)
    if len(items) <= PIECE_ELEMENTS:
        array[:] = items
        return array
    for start in range(0, len(items), PIECE_ELEMENTS):
        array[start : start + PIECE_ELEMENTS] = items[start : start + PIECE_ELEMENTS]
    return array


def serialize_in_pieces(array: np.ndarray) -> memoryview:
    """`serialize_bytes_tensor` of a long array: each piece joined alone, then copied into one numpy buffer.

    Joined at once, a million strings' two million parts held the GIL 70-130 ms, in whichever thread (a codec
    thread's: the event loop waited for it). numpy copies without the GIL; a piece's parts are freed with it.
    """
    flat = array.reshape(-1)
    pieces = [
        serialize_bytes_tensor(flat[start : start + PIECE_ELEMENTS]) for start in range(0, flat.size, PIECE_ELEMENTS)
    ]
    out = np.empty(sum(map(len, pieces)), np.uint8)
    at = 0
    for piece in pieces:
        size = len(piece)
        out[at : at + size] = np.frombuffer(piece, np.uint8)
        at += size
    mark_leased(out)  # nothing else has it: it may go out as it is (as bytes did), not copied again
    return out.data


def element_bytes(item: Any) -> bytes:
    """An element of a BYTES output as `serialize_bytes_tensor` writes it: bytes, UTF-8, else its str's UTF-8."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    return str(item).encode("utf-8")


def plain_elements(array: np.ndarray, start: int = 0) -> np.ndarray:
    """An object array whose elements from flat index `start` on are bytes or str; the array itself when they are.

    The others become what `element_bytes` writes, in a copy (raising what an element's str raises): for an array
    that goes to another process, which may not import the classes of the model's objects.
    """
    for item in itertools.islice(array.flat, start, None):
        if type(item) is not bytes and type(item) is not str:
            break
    else:
        return array
    items = list(array.flat)
    for index in range(start, len(items)):
        item = items[index]
        if type(item) is not bytes and type(item) is not str:
            items[index] = element_bytes(item)
    plain = np.empty(len(items), dtype=object)
    plain[:] = items
    return plain.reshape(array.shape)


def deserialize_bytes_tensor(buffer: Buffer, name: str, model: str = "", count: int = -1) -> np.ndarray:
    """Deserialize a BYTES tensor of input `name` of `model` into a flat object array of bytes (trailing NULs kept).

    Checked in the order tritonserver 2.51 checks it: its core reads the length indicators (refusing one cut
    short, and stopping at an element past `count` when a count is given), then counts the elements; the model
    (NVIDIA's PyTriton, a Python backend) reads the strings and refuses one cut short, an error Triton answers as
    the model's (`in_response`).
    """
    view = memoryview(buffer)
    items: List[bytes] = []
    offset = 0
    end = len(view)
    unpack = _LENGTH.unpack_from
    cut: Optional[Tuple[int, int]] = None  # (length, bytes left) of a last string cut short
    while offset < end:
        if offset + 4 > end:
            raise InferenceError.invalid_input(
                f"incomplete string length indicator for inference input '{name}' for model '{model}', expecting "
                f"4 bytes but only {end - offset} bytes available. Please make sure the string length indicator "
                "is in one buffer."
            )
        (length,) = unpack(view, offset)
        offset += 4
        if len(items) == count:
            raise InferenceError.invalid_input(
                f"unexpected number of string elements {count + 1} for inference input '{name}' for model "
                f"'{model}', expecting {count}"
            )
        if offset + length > end:
            cut = (length, end - offset)
            items.append(b"")  # counted as the core counts it
            break
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count >= 0 and len(items) != count:
        raise InferenceError.invalid_input(
            f"expected {count} string elements for inference input '{name}' for model '{model}', got {len(items)}"
        )
    if cut is not None:
        error = InferenceError.invalid(
            f"incomplete string data for inference input '{name}', expecting string of length {cut[0]} but "
            f"only {cut[1]} bytes available"
        )
        error.in_response = True
        raise error
    return object_array(items)


def string_count(buffer: Buffer) -> int:
    """How many strings tritonserver's core counts in a BYTES tensor's raw data, to tell it from the count it expects.

    A last string cut short counts, as the core counts it; a length indicator cut short ends the count.
    """
    view = memoryview(buffer)
    end = len(view)
    offset = count = 0
    while offset + 4 <= end:
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4 + length
        count += 1
    return count


def array_from_raw(buffer: Buffer, datatype: str, shape: Sequence[int], name: str, model: str) -> np.ndarray:
    """Build an array from raw tensor bytes of input `name` of `model`; fixed-size types are zero-copy views.

    The array is writable: a read-only buffer (bytes) is copied first.
    """
    count = element_count(shape)
    if datatype == BYTES:
        return deserialize_bytes_tensor(buffer, name, model, count).reshape(shape)
    expected = count * ELEMENT_SIZE[datatype]
    size = buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
    if size != expected:
        raise InferenceError.invalid_input(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {size}"
        )
    if type(buffer) is bytes or (type(buffer) is memoryview and buffer.readonly):
        # A small gRPC message's tensors are its protobuf's bytes: copied, as inputs reach callables writable
        # (nvidia-pytriton 0.7's do: a callable may write into them, or hand them to torch.from_numpy).
        buffer = bytearray(buffer)
    return np.ndarray(shape, numpy_dtype(datatype), buffer)  # a view, in one call (frombuffer + reshape: two)


def raw_from_array(array: np.ndarray, datatype: str) -> Buffer:
    """Raw wire bytes of an array (a zero-copy view when the array is contiguous little-endian)."""
    if datatype == BYTES:
        return serialize_bytes_tensor(array) if array.size <= PIECE_ELEMENTS else serialize_in_pieces(array)
    if datatype == BF16:
        if array.dtype != BF16_DTYPE:
            array = array.astype(BF16_DTYPE)
        return np.ascontiguousarray(array).view(np.uint8).reshape(-1).data  # no buffer format for bfloat16
    if not array.size:
        return memoryview(b"")  # a view with a zero in its shape cannot be cast
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # The base ndarray: an ndarray subclass's `.data` may be an array (a masked array's is), not a buffer.
    return np.asarray(array).data.cast("B")


# Arrays over memory nobody writes into while they live (a process instance's result region, leased to the
# server until its last view is gone: core/process_instances/result_arena.py), by id; an entry leaves when its
# array dies.
_LEASED: Dict[int, Any] = {}


def mark_leased(array: np.ndarray, on_gone: Optional[Callable[[], None]] = None) -> None:
    """Count `array`'s memory as unchanging for as long as it lives (see unchanging); then call `on_gone`.

    `on_gone` runs in whichever thread lets go of the array last (a weak reference's callback: much cheaper
    than weakref.finalize, which a lease per response made a cost of the hop).
    """
    key = id(array)

    def gone(_: Any) -> None:
        _LEASED.pop(key, None)
        if on_gone is not None:
            on_gone()

    _LEASED[key] = weakref.ref(array, gone)


def unchanging(parts: Sequence[Any], owner: Any) -> bool:
    """Whether every part is immutable (bytes), lies in `owner`'s memory (see backed_by) or in a leased region."""
    return owner is not None and all(type(part) is bytes or backed_by(part, owner) for part in parts)


def backed_by(buffer: Any, owner: Any) -> bool:
    """Whether `buffer`'s memory is `owner`'s: its chain of views (memoryview.obj, ndarray.base) ends there.

    A response may go out as views, without a copy, only when no one can write into its memory
    meanwhile: memory a request brought (an identity model's output is a view of its input) is that
    request's alone, where an array a callable returned may be one it fills again on its next call.
    """
    while True:
        if buffer is owner or id(buffer) in _LEASED:
            return True
        if isinstance(buffer, memoryview):
            buffer = buffer.obj
        elif isinstance(buffer, np.ndarray) and buffer.base is not None:
            buffer = buffer.base
        else:
            return False
