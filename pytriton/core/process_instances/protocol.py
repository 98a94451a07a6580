"""What the server and an instance process say to each other, and how tensors and errors travel.

Messages are tuples whose first item is a tag (below). Those of every batch (JOB, RESULT, END) are plain
tuples of builtins: pickling a NamedTuple or a class costs ten times more (6.5 us against 0.5 us to pickle
a job's head here), about a tenth of what a process hop may cost. Rare ones carry a NamedTuple.

Tensors of fixed-size dtypes go through the sender's arena, a shared-memory segment it owns and reuses.
Each message takes a region of it, lent to the receiver until the receiver says it no longer views it
(core/input_arena.py for a job's inputs, core/result_arena.py for its results). The arena grows to fit,
up to a budget; whatever does not fit (over the budget, or when no shared memory can be had, e.g. a
cgroup out of memory) travels in the message body instead: slower, never failing. A new arena's
descriptor goes with the message that first uses it. Object (BYTES) arrays and any other values are
pickled in the head. An output that lies in its job's input region (an identity's, a slice of an input)
is not copied: the result names where it lies in the server's own arena.
"""

from __future__ import annotations

import importlib
import os
import pickle
import traceback
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

import numpy as np

from pytriton.core.errors import FailureReason, InferenceError, Status
from pytriton.core.raw_tensors import Buffer
from pytriton.core.shared_memory import SharedMemoryUnavailable, SharedSegment
from pytriton.exceptions import PyTritonError

# Server to instance: (INIT, Init) (the body holds the pickled callable), (JOB, job id, streaming, requests,
# new arena size, jobs whose results the server no longer reads), (STOP, job id), (EXIT,).
INIT, JOB, STOP, EXIT = 1, 2, 3, 4
# Instance to server: (READY, kind, pid), (START_FAILED, traceback), (RESULT, job id, outputs, new arena size,
# final, released), (FAILURE, job id, ErrorInfo, released), (END, job id, released); `released` names the jobs
# whose inputs the process no longer views (usually the job answered: none when a model keeps its inputs).
READY, START_FAILED, RESULT, FAILURE, END = 11, 12, 13, 14, 15

_ALIGN = 64
_MIN_ARENA_BYTES = 1 << 20
# Where a packed array lies: the sender's arena, the message body, or the job's input region (in the arena of
# the server, which receives the result).
IN_ARENA, IN_BODY, IN_INPUTS = 0, 1, 2

# A request of a job: (inputs, parameters, requested output names); inputs and outputs travel as packed dicts.
JobRequest = Tuple[Any, Optional[Dict[str, Any]], Optional[List[str]]]


class Init(NamedTuple):
    """What an instance process runs and how."""

    model_name: str
    instance_index: int
    factory: bool
    sys_path: List[str]
    model_config: Any
    arena_budget: int


class ErrorInfo(NamedTuple):
    """An exception of the instance process, sendable whatever its class."""

    type_name: str
    module: str
    message: str
    traceback: str
    pickled: Optional[bytes]


# -- tensors ------------------------------------------------------------------------------------
#
# A packed dict is (refs, others, order): refs maps names to (where, offset, nbytes, dtype, shape) for
# fixed-size arrays, others holds every other value as it is, order lists the keys when others is not
# empty (so that the dict comes back in its order). Any other item is packed as (item,).

_DTYPES: Dict[Any, np.dtype] = {}
_CODES: Dict[np.dtype, Any] = {}


def _dtype_code(dtype: np.dtype) -> Any:
    """A builtin dtype as its string (cheap to pickle), any other (bfloat16) as itself."""
    code = _CODES.get(dtype)
    if code is None:
        code = _CODES[dtype] = dtype.str if dtype.isbuiltin else dtype
    return code


def _dtype_of(code: Any) -> np.dtype:
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
                if in_inputs and id(value) in in_inputs:
                    refs[name] = (IN_INPUTS, in_inputs[id(value)], nbytes, _dtype_code(value.dtype), value.shape)
                elif arena is not None and arena_offset + nbytes <= arena_free:
                    np.copyto(np.ndarray(value.shape, value.dtype, arena, arena_offset), value)
                    refs[name] = (IN_ARENA, arena_offset, nbytes, _dtype_code(value.dtype), value.shape)
                    arena_offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
                elif not overflow:
                    return None
                else:
                    body.append(_raw_bytes(value))
                    refs[name] = (IN_BODY, body_offset, nbytes, _dtype_code(value.dtype), value.shape)
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
    ) -> List[Any]:
        """Rebuild packed dicts: arrays as views of the arena (copies with `copy`) or of the body.

        With `arena` (a uint8 array over the whole arena) the arena's arrays are views of it instead; arrays
        in the job's input region are views of `inputs` (a uint8 array over the receiver's own arena).
        """
        rebuilt: List[Any] = []
        for item in packed:
            if len(item) == 1:
                rebuilt.append(item[0])
                continue
            refs, others, order = item
            arrays = {name: self._array(ref, body, copy, arena, inputs) for name, ref in refs.items()}
            if order is not None:
                arrays.update(others)
                arrays = {name: arrays[name] for name in order}
            rebuilt.append(arrays)
        return rebuilt

    def _array(
        self,
        ref: Tuple[int, int, int, Any, Tuple[int, ...]],
        body: memoryview,
        copy: bool,
        arena: Optional[np.ndarray],
        inputs: Optional[np.ndarray],
    ) -> np.ndarray:
        """The array a ref describes."""
        where, offset, nbytes, code, shape = ref
        if where == IN_INPUTS:
            if inputs is None or offset < 0 or offset + nbytes > len(inputs):
                raise ValueError("a tensor in an input region that is not there")
            return inputs[offset : offset + nbytes].view(_dtype_of(code)).reshape(shape)
        if where == IN_ARENA:
            if arena is not None:
                return arena[offset : offset + nbytes].view(_dtype_of(code)).reshape(shape)
            if self._view is None:
                raise ValueError("a tensor in an arena that never arrived")
            array = np.ndarray(shape, _dtype_of(code), self._view, offset)  # numpy checks the bounds
            return array.copy() if copy else array
        return np.ndarray(shape, _dtype_of(code), body[offset : offset + nbytes])

    def close(self) -> None:
        """Unmap the arena (arrays still viewing it keep it mapped)."""
        if self.segment is not None:
            self._view = None
            self.segment.close()
            self.segment = None


def result_items(value: Any) -> Optional[Tuple[bool, Sequence[Any]]]:
    """A callable's result as (whether a tuple, its items) when it is a list or tuple, else None."""
    if isinstance(value, (list, tuple)):
        return type(value) is tuple, value
    return None


def result_value(as_tuple: Optional[bool], items: List[Any]) -> Any:
    """The list or tuple a result was."""
    return tuple(items) if as_tuple else items


def pack_result(writer: ArenaWriter, value: Any) -> Tuple[Any, List[Buffer], int]:
    """Pack what a callable returned: a list or tuple of dicts of arrays as such, anything else as it is."""
    items = result_items(value)
    if items is None:
        return (None, value), [], 0
    packed, body, arena = writer.pack(items[1])
    return (items[0], packed), body, arena


def unpack_result(reader: ArenaReader, packed: Any, body: memoryview) -> Any:
    """What pack_result packed, tensors copied out of the arena (the sender reuses it for its next message)."""
    as_tuple, items = packed
    if as_tuple is None:
        return items
    return result_value(as_tuple, reader.unpack(items, body, copy=True))


def arena_bytes(dicts: Sequence[Any], skip: Optional[Dict[int, int]] = None) -> int:
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


# -- errors -------------------------------------------------------------------------------------


class RemoteError(Exception):
    """An exception raised in an instance process; its class is named like the original's.

    Attributes:
        remote_traceback: the traceback formatted in the process that raised it.
    """

    remote_traceback = ""


_REMOTE_CLASSES: Dict[Tuple[str, str], Type[RemoteError]] = {}


def error_info(error: BaseException) -> ErrorInfo:
    """Describe an exception so that the server can raise its like."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    pickled: Optional[bytes] = None
    if isinstance(error, InferenceError):
        pickled = pickle.dumps(("inference", error.status.name, error.message, error.reason.name))
    elif isinstance(error, PyTritonError):
        pickled = pickle.dumps(("pytriton", type(error).__module__, type(error).__qualname__, error.message))
    return ErrorInfo(type(error).__name__, type(error).__module__, str(error), text, pickled)


def rebuild_error(info: ErrorInfo) -> BaseException:
    """The exception an ErrorInfo describes: pytriton's own classes as themselves, others as RemoteError."""
    error: BaseException
    if info.pickled is not None:
        kind, *fields = pickle.loads(info.pickled)
        if kind == "inference":
            status, message, reason = fields
            error = InferenceError(Status[status], message, FailureReason[reason])
        else:
            module, qualname, message = fields
            cls = _pytriton_class(module, qualname)
            error = cls(message) if cls is not None else _remote_class(info)(info.message)
    else:
        error = _remote_class(info)(info.message)
    setattr(error, "remote_traceback", info.traceback)  # noqa: B010 - any class may carry it
    return error


def _pytriton_class(module: str, qualname: str) -> Optional[Type[PyTritonError]]:
    """A PyTritonError subclass of pytriton's own modules, by name."""
    if not module.startswith("pytriton."):
        return None
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, PyTritonError) else None


def _remote_class(info: ErrorInfo) -> Type[RemoteError]:
    """A RemoteError subclass named like the original exception class."""
    key = (info.module, info.type_name)
    cls = _REMOTE_CLASSES.get(key)
    if cls is None:
        cls = _REMOTE_CLASSES[key] = type(info.type_name, (RemoteError,), {"__module__": info.module})
    return cls
