"""Long infer decodes and encodes (large JSON, many strings) in worker threads, awaited by the request on the loop.

One client's 100 MB JSON request (16 Mi FP32 values) was decoded on the event loop: every other client of the
server, health checks among them, waited 1.4 s for it (a 64 Mi one: 11 s), where tritonserver 2.51 decodes in
its HTTP worker threads; a gRPC request of a million strings held them 0.3 s. The codecs, run on the loop
(`codec_place.ON_LOOP`), raise OffLoop for such a message before they changed anything; it is then handled here
again, in a worker thread, a piece at a time (`codec_place.OFF_LOOP`: orjson and numpy hold the GIL through each
call, so each call is kept short), and the loop serves the other clients between the pieces. A small message
never comes here.

The worker does not touch the server's shared-memory registry, which only the loop changes: a message that needs
it (a tensor in a region) is handled on the loop after all, as before.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable, List, NoReturn, Optional, Sequence, TypeVar, Union, cast

import numpy as np

from pytriton.core.daemon_threads import DaemonThreads, awaited
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.protocol.codec_place import ANYWHERE, OFF_LOOP, OFF_LOOP_VALUES

T = TypeVar("T")

# A response whose binary outputs come to this many bytes or more is joined in a worker thread (about 3 ms of
# copying into fresh memory on the loop: 64 MiB took 50 ms).
OFF_LOOP_JOIN_BYTES = 4 * 1024 * 1024

# The threads that decode and encode; each takes a core while it works, so a few.
CODERS = DaemonThreads(2, "pytriton-codec")


def _fresh_coders() -> None:
    """In a forked child, a pool of its own: the parent's threads are not there, though counted."""
    global CODERS
    CODERS = DaemonThreads(2, "pytriton-codec")


os.register_at_fork(after_in_child=_fresh_coders)


class _NeedsLoop(Exception):
    """The message uses the shared-memory registry: it is decoded or encoded on the loop."""


class _LoopOnly:
    """Stands for the registry in a worker thread: any use of it raises _NeedsLoop."""

    def __getattr__(self, name: str) -> NoReturn:
        raise _NeedsLoop


_LOOP_ONLY = cast(SystemSharedMemory, _LoopOnly())


async def off_loop(work: Callable[[Optional[SystemSharedMemory], int], T], memory: Optional[SystemSharedMemory]) -> T:
    """`work(registry, place)`, a codec's call the codec refused to make on the loop (OffLoop).

    In a worker thread as `work(stand-in, OFF_LOOP)`; on the loop as `work(memory, ANYWHERE)`, as before, when
    the message needs the registry or no thread can start.
    """
    stand_in = _LOOP_ONLY if memory is not None else None
    try:
        future = awaited(CODERS, lambda: work(stand_in, OFF_LOOP))
    except RuntimeError:  # no thread could start
        return work(memory, ANYWHERE)
    try:
        return await future
    except _NeedsLoop:
        return work(memory, ANYWHERE)


async def joined(parts: Sequence[Any], size: int) -> Union[bytes, memoryview]:
    """`parts` (byte-format buffers of `size` bytes in all) as one, copied in a worker thread.

    numpy leaves the GIL while it copies (bytes.join holds it): the loop serves the other clients meanwhile.
    """

    def join() -> memoryview:
        try:
            out = np.empty(size, np.uint8)
        except MemoryError:  # numpy's says "Unable to allocate ...": answered as bytes.join's, a plain MemoryError
            raise MemoryError from None
        at = 0
        for part in parts:
            view = np.frombuffer(part, np.uint8)
            out[at : at + view.size] = view
            at += view.size
        return out.data

    try:
        future = awaited(CODERS, join)
    except RuntimeError:  # no thread could start: on the loop, as before
        return b"".join(parts)
    return await future


def long_object_arrays(request: InferenceRequest, response: InferenceResponse) -> List[np.ndarray]:
    """The object arrays of OFF_LOOP_VALUES elements or more among a request's inputs and its response's outputs."""
    arrays: Iterable[np.ndarray] = [*request.inputs.values(), *(output.array for output in response.outputs)]
    seen = set()
    long = []
    for array in arrays:
        if array.dtype.hasobject and array.size >= OFF_LOOP_VALUES and id(array) not in seen:
            seen.add(id(array))
            long.append(array)
    return long


def let_go(arrays: List[np.ndarray]) -> None:
    """Free `arrays` in a codec thread, a piece at a time; the caller holds them no longer (but through the list).

    A million strings freed at once held the GIL 10-20 ms, wherever (on the loop, where the request's last
    reference went). An array that nothing else holds (nor its bases) is emptied a piece of OFF_LOOP_VALUES elements
    at a time, the other threads served between the pieces; one held elsewhere is only let go of.
    """
    if not arrays:
        return

    def free() -> None:
        while arrays:
            array = arrays.pop()
            if _alone(array):
                for start in range(0, array.size, OFF_LOOP_VALUES):
                    array.flat[start : start + OFF_LOOP_VALUES] = None
            del array

    try:
        CODERS.submit(free)
    except RuntimeError:  # no thread could start: freed here, as before
        arrays.clear()


def _alone(array: np.ndarray) -> bool:
    """Whether only the caller's name refers to `array`, and only their views to its bases (CPython's counts)."""
    if sys.getrefcount(array) > 3:  # the caller's name, this parameter, getrefcount's argument
        return False
    base = array.base
    while base is not None:
        if type(base) is not np.ndarray or sys.getrefcount(base) > 3:  # the view's base, this name, the argument
            return False
        base = base.base
    return True
