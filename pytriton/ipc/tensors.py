"""Dicts of numpy arrays packed for another process: fixed-size arrays as raw bytes in an arena or the body.

The sender's arena is a shared-memory segment it owns and reuses (`ArenaWriter`), grown on demand up to a
budget; what does not fit (over the budget, or when no shared memory can be had, e.g. a cgroup out of memory)
travels in the message body instead: slower, never failing. A new arena's descriptor goes with the message
that first uses it, and the receiver maps it (`ArenaReader`). Object (BYTES) arrays and any other values stay
in the packed head, to be pickled with it.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.ipc.segments import SharedMemoryUnavailable, SharedSegment

Buffer = Union[bytes, bytearray, memoryview]

_ALIGN = 64
_MIN_ARENA_BYTES = 1 << 20
# Where a packed array lies: the sender's arena, the message body, the job's input region (in the arena of
# the server, which receives the result), or a segment both sides map by id (a frontend process's buffer: its
# ref has the segment's id as a sixth item).
IN_ARENA, IN_BODY, IN_INPUTS, IN_SHARED = 0, 1, 2, 3
# Where an array that lies in a shared segment is: its id and offset, by the array's id.
SharedPlaces = Dict[int, Tuple[int, int]]

## A packed dict is (refs, others, order): refs maps names to (where, offset, nbytes, dtype, shape) for
# fixed-size arrays, others holds every other value as it is, order lists the keys when others is not
# empty (so that the dict comes back in its order). Any other item is packed as (item,).

_DTYPES: Dict[Any, np.dtype] = {}
_CODES: Dict[np.dtype, Any] = {}


def dtype_code(dtype: np.dtype) -> Any:
    """A builtin dtype as its string (cheap to pickle), any other (bfloat16) as itself.

    `isbuiltin` is 2 for a dtype registered by a library (ml_dtypes' bfloat16), whose string ('<V2') would come
    back as raw bytes: only 1 means numpy's own.
    """
    code = _CODES.get(dtype)
    if code is None:
        code = _CODES[dtype] = dtype.str if dtype.isbuiltin == 1 else dtype
    return code


def dtype_of(code: Any) -> np.dtype:
    """The dtype a code stands for."""
    dtype = _DTYPES.get(code) if isinstance(code, str) else code
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def _is_fixed_array(value: Any) -> bool:
    """Whether a value travels as raw bytes (a numpy array of a fixed-size dtype)."""
    return type(value) is np.ndarray and not value.dtype.hasobject


class ArenaWriter:
    """The sending side's arena: one segment, reused for every message, grown on demand up to a budget."""

    def __init__(self, budget_bytes: int) -> None:
        """An arena that will never hold more than `budget_bytes` (0: every tensor goes in the body)."""
        self.budget_bytes = budget_bytes
        self.segment: Optional[SharedSegment] = None
        self._view: Optional[memoryview] = None

    def pack(self, dicts: Sequence[Any]) -> Tuple[List[Any], List[Buffer], int]:
        """Pack a message's dicts of arrays: (packed items, body parts, size of a new arena or 0).

        Items that are not dicts (a callable may return anything) are kept as they are, to be pickled.
        """
        placed = self._place(dicts, overflow=False)
        if placed is not None:
            return placed[0], placed[1], 0
        new_arena = self._reserve(arena_bytes(dicts))  # too small for this message: grow, within the budget
        placed = self._place(dicts, overflow=True)
        assert placed is not None
        return placed[0], placed[1], new_arena

    def _place(
        self,
        dicts: Sequence[Any],
        overflow: bool,
        start: int = 0,
        end: Optional[int] = None,
        in_inputs: Optional[Dict[int, int]] = None,
        in_shared: Optional[SharedPlaces] = None,
    ) -> Optional[Tuple[List[Any], List[Buffer]]]:
        """Copy the arrays into the arena's [start, end); what does not fit: in the body (`overflow`), or None.

        Arrays named in `in_inputs` (by id, with their offset) lie in the job's input region: not copied.
        """
        arena = self._view
        arena_free = (len(arena) if end is None else end) if arena is not None else 0
        arena_offset, body_offset = start, 0
        body: List[Buffer] = []
        packed: List[Any] = []
        for item in dicts:
            if type(item) is not dict:
                packed.append((item,))
                continue
            refs: Dict[Any, Any] = {}
            others: Dict[Any, Any] = {}
            for name, value in item.items():
                if type(value) is not np.ndarray or value.dtype.hasobject:
                    others[name] = value
                    continue
                nbytes = value.nbytes
                if in_shared and id(value) in in_shared:
                    segment, at = in_shared[id(value)]
                    refs[name] = (IN_SHARED, at, nbytes, dtype_code(value.dtype), value.shape, segment)
                elif in_inputs and id(value) in in_inputs:
                    refs[name] = (IN_INPUTS, in_inputs[id(value)], nbytes, dtype_code(value.dtype), value.shape)
                elif arena is not None and arena_offset + nbytes <= arena_free:
                    np.copyto(np.ndarray(value.shape, value.dtype, arena, arena_offset), value)
                    refs[name] = (IN_ARENA, arena_offset, nbytes, dtype_code(value.dtype), value.shape)
                    arena_offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
                elif not overflow:
                    return None
                else:
                    body.append(_raw_bytes(value))
                    refs[name] = (IN_BODY, body_offset, nbytes, dtype_code(value.dtype), value.shape)
                    body_offset += nbytes
            packed.append((refs, others, tuple(item) if others else None))
        return packed, body

    def _reserve(self, wanted: int) -> int:
        """Make the arena hold `wanted` bytes, or as many as the budget allows; the new size, or 0 (unchanged)."""
        size = min(max(_MIN_ARENA_BYTES, 1 << (wanted - 1).bit_length()), self.budget_bytes)
        if self.segment is not None and self.segment.size >= size:
            return 0
        if size <= 0:
            return 0
        try:
            segment = SharedSegment.create(size)
        except SharedMemoryUnavailable:
            return 0  # the body carries this message; the next one tries again
        self.close()
        self.segment = segment
        self._view = segment.view()
        return size

    def close(self) -> None:
        """Release the arena."""
        if self.segment is not None:
            self._view = None
            self.segment.close()
            self.segment = None


class ArenaReader:
    """The receiving side's view of the sender's arena, replaced when the sender grows it."""

    def __init__(self) -> None:
        """No arena until the first one arrives."""
        self.segment: Optional[SharedSegment] = None
        self._view: Optional[memoryview] = None

    def adopt(self, size: int, fds: Sequence[int]) -> None:
        """Map a new arena of the sender (its descriptor came with the message)."""
        if not size or len(fds) != 1:
            for fd in fds:  # not expected: nothing says what they are
                os.close(fd)
            if size:
                raise ValueError(f"a new arena comes with one descriptor, got {len(fds)}")
            return
        self.close()
        self.segment = SharedSegment.attach(fds[0], size)
        self._view = self.segment.view()

    @property
    def view(self) -> Optional[memoryview]:
        """The whole arena, once one arrived."""
        return self._view

    def unpack(
        self,
        packed: Sequence[Any],
        body: memoryview,
        copy: bool,
        arena: Optional[np.ndarray] = None,
        inputs: Optional[np.ndarray] = None,
        shared: Optional[Callable[[int, int, int], np.ndarray]] = None,
    ) -> List[Any]:
        """Rebuild packed dicts: arrays as views of the arena (copies with `copy`) or of the body.

        With `arena` (a uint8 array over the whole arena) the arena's arrays are views of it instead; arrays
        in the job's input region are views of `inputs` (a uint8 array over the receiver's own arena); arrays in
        a shared segment are views of what `shared(segment id, offset, nbytes)` returns (uint8).
        """
        rebuilt: List[Any] = []
        for item in packed:
            if len(item) == 1:
                rebuilt.append(item[0])
                continue
            refs, others, order = item
            arrays = {name: self._array(ref, body, copy, arena, inputs, shared) for name, ref in refs.items()}
            if order is not None:
                arrays.update(others)
                arrays = {name: arrays[name] for name in order}
            rebuilt.append(arrays)
        return rebuilt

    def _array(
        self,
        ref: Tuple[Any, ...],
        body: memoryview,
        copy: bool,
        arena: Optional[np.ndarray],
        inputs: Optional[np.ndarray],
        shared: Optional[Callable[[int, int, int], np.ndarray]],
    ) -> np.ndarray:
        """The array a ref describes."""
        where, offset, nbytes, code, shape = ref[:5]
        if where == IN_SHARED:
            if shared is None:
                raise ValueError("a tensor in a shared segment where none is mapped")
            return shared(ref[5], offset, nbytes).view(dtype_of(code)).reshape(shape)
        if where == IN_INPUTS:
            if inputs is None or offset < 0 or offset + nbytes > len(inputs):
                raise ValueError("a tensor in an input region that is not there")
            return inputs[offset : offset + nbytes].view(dtype_of(code)).reshape(shape)
        if where == IN_ARENA:
            if arena is not None:
                return arena[offset : offset + nbytes].view(dtype_of(code)).reshape(shape)
            if self._view is None:
                raise ValueError("a tensor in an arena that never arrived")
            array = np.ndarray(shape, dtype_of(code), self._view, offset)  # numpy checks the bounds
            return array.copy() if copy else array
        return np.ndarray(shape, dtype_of(code), body[offset : offset + nbytes])

    def close(self) -> None:
        """Unmap the arena (arrays still viewing it keep it mapped)."""
        if self.segment is not None:
            self._view = None
            self.segment.close()
            self.segment = None


def arena_bytes(dicts: Sequence[Any], skip: Optional[Mapping[int, Any]] = None) -> int:
    """What a message's arrays take in an arena (those in `skip`, by id, take none)."""
    needed = 0
    for item in dicts:
        if type(item) is dict:
            needed += sum(
                _aligned(value.nbytes)
                for value in item.values()
                if _is_fixed_array(value) and not (skip and id(value) in skip)
            )
    return needed


def _aligned(size: int) -> int:
    """`size` rounded up to the arena's alignment."""
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


def _raw_bytes(array: np.ndarray) -> Buffer:
    """The bytes of a fixed-size array, in C order (a view when it is contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
