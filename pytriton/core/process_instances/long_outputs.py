"""Long object (BYTES) arrays between the server and an instance process: pickled a piece at a time, off the loop.

An object array travelled in its RESULT message's head: pickled whole in the process (numpy's reduce: a million
short strings, 0.8 s), unpickled whole on the server's event loop as the message was read (0.1 s of every other
client's time, in one call that holds the GIL) and its size counted there (0.03 s). Now an object array of
PIECE_ELEMENTS or more leaves its response in the process (`take_out`: None keeps its place, and the dict's order)
and travels in the message body as pickled lists of PIECE_ELEMENTS elements (`Long` says where); the server rebuilds
it in a thread of its own (`rebuilt`), a piece at a time so that the loop gets the GIL between the pieces, counts its
size there (counted_strings.count_ahead) and puts it back in its response before the job's answer goes on.

A job's long inputs go the other way alike: the server finds them on the loop (`long_arrays`, cheap), leaves them out
of the JOB's head (`without`), pickles their pieces in one of the same threads (`pickled_off_loop`: a million strings
pickled whole on the loop held every other client 0.2-0.5 s) and sends the JOB in the place it kept in the channel's
order (LoopChannel.reserve); the process puts them back (`put_back`) before the call.

Frontend processes and the hub send long BYTES tensors the same way (runtime/frontends/protocol.py: `pickled_pieces`
with `plain`, `rebuilt`, `off_loop`).
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from pytriton.core.daemon_threads import DaemonThreads, awaited
from pytriton.core.tensors.counted_strings import count_ahead
from pytriton.core.tensors.raw_tensors import PIECE_ELEMENTS, plain_elements
from pytriton.ipc.channel import loads
from pytriton.ipc.tensors import Buffer

# Where a long object array of a response lies in the RESULT message's body: (response index, output name, shape,
# body offset, each piece's pickled size). A plain tuple: it travels in the head of every result that has one.
Long = Tuple[int, Any, Tuple[int, ...], int, Tuple[int, ...]]
# An array taken out: (response or request index, output or input name, shape, pickled pieces).
TakenOut = Tuple[int, Any, Tuple[int, ...], List[bytes]]
# A long object array found in a list of dicts: (index, name, the array).
Found = Tuple[int, Any, np.ndarray]
T = TypeVar("T")

# The threads that rebuild outputs and pickle inputs; one takes the GIL a piece at a time, so a few.
REBUILDERS = DaemonThreads(2, "pytriton-long-objects")


def _fresh_rebuilders() -> None:
    """In a forked child, a pool of its own: the parent's threads are not there, though counted."""
    global REBUILDERS
    REBUILDERS = DaemonThreads(2, "pytriton-long-objects")


os.register_at_fork(after_in_child=_fresh_rebuilders)


# -- taken out: outputs in the instance process, inputs in the server ------------------------------


def is_long(array: Any) -> bool:
    """Whether `array` is an object (BYTES) array of PIECE_ELEMENTS or more: one that crosses in pickled pieces."""
    return type(array) is np.ndarray and array.dtype.kind == "O" and array.size >= PIECE_ELEMENTS


def long_arrays(value: Any) -> List[Found]:
    """The object arrays of PIECE_ELEMENTS or more in a list or tuple of dicts (responses, inputs), in order."""
    found: List[Found] = []
    if not isinstance(value, (list, tuple)):
        return found
    for index, item in enumerate(value):
        if type(item) is not dict:
            continue
        for name, array in item.items():
            if is_long(array):
                found.append((index, name, array))
    return found


def without(value: Any, places: Iterable[Tuple[Any, ...]]) -> Any:
    """`value` (a list or tuple of dicts) with None for the arrays at `places` ((index, name, ...) each), in copies.

    The dicts changed are copies, in their order; `value` itself when `places` is empty.
    """
    converted: Optional[List[Any]] = None
    for index, name, *_ in places:
        if converted is None:
            converted = list(value)
        item = converted[index]
        if item is value[index]:
            item = converted[index] = dict(item)
        item[name] = None
    if converted is None:
        return value
    return tuple(converted) if type(value) is tuple else converted


def take_out(value: Any) -> Tuple[Any, List[TakenOut]]:
    """The result with its long object arrays taken out of its responses (in copies of their dicts), pickled.

    An array whose pieces do not pickle (an element of a class pickle refuses) stays where it is: the head's
    pickling says what it is, for its request alone (host._sendable). The result itself when nothing is taken out.
    """
    taken: List[TakenOut] = []
    for index, name, array in long_arrays(value):
        pieces = pickled_or_none(array)
        if pieces is not None:
            taken.append((index, name, array.shape, pieces))
    return without(value, taken), taken


def pickled_or_none(array: np.ndarray, plain: bool = False) -> Optional[List[bytes]]:
    """`pickled_pieces(array, plain)`; None when an element does not pickle."""
    try:
        return pickled_pieces(array, plain)
    except Exception:  # noqa: BLE001 - whatever pickling raises: the array goes in the head, which says so
        return None


def pickled_pieces(array: np.ndarray, plain: bool = False) -> List[bytes]:
    """The array's elements (flat), pickled PIECE_ELEMENTS at a time as lists (what pickling raises, raised).

    `plain`: elements other than bytes and str are pickled as raw_tensors.plain_elements makes them, for a process
    that imports none of the model's modules (a frontend's); an element whose str raises makes it raise.
    """
    flat = array.reshape(-1)
    return [
        pickle.dumps((plain_elements(piece) if plain else piece).tolist(), pickle.HIGHEST_PROTOCOL)
        for piece in (flat[start : start + PIECE_ELEMENTS] for start in range(0, flat.size, PIECE_ELEMENTS))
    ]


def placed(taken: Sequence[TakenOut], body: Sequence[Buffer]) -> Tuple[List[Long], List[bytes]]:
    """Where each array taken out lies once its pieces follow `body` in the message, and those pieces in order."""
    offset = sum(memoryview(part).nbytes for part in body)
    longs: List[Long] = []
    pieces: List[bytes] = []
    for index, name, shape, pickled in taken:
        sizes = tuple(len(piece) for piece in pickled)
        longs.append((index, name, shape, offset, sizes))
        pieces.extend(pickled)
        offset += sum(sizes)
    return longs, pieces


# -- in the server --------------------------------------------------------------------------------


def put_back_off_loop(value: Any, longs: Sequence[Long], body: memoryview) -> asyncio.Future[Any]:
    """`put_back(value, longs, body)` in a rebuilder thread; the future, on the running loop, gets its outcome."""
    return off_loop(lambda: put_back(value, longs, body))


def pickled_off_loop(found: Sequence[Found]) -> asyncio.Future[List[TakenOut]]:
    """The arrays `long_arrays` found, pickled (`pickled_pieces`) in a rebuilder thread; the future gets them.

    What pickling raises (an element that does not pickle) is the future's.
    """
    return off_loop(lambda: [(index, name, array.shape, pickled_pieces(array)) for index, name, array in found])


def off_loop(call: Callable[[], T]) -> asyncio.Future[T]:
    """`call()` in a rebuilder thread; the future, on the running loop, gets its outcome.

    Where no thread can start, it is done here, on the loop.
    """
    try:
        return awaited(REBUILDERS, call)
    except RuntimeError:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(call())
        except Exception as error:  # noqa: BLE001 - the waiter's, as the thread's would be
            future.set_exception(error)
        return future


def put_back(value: Any, longs: Sequence[Long], body: memoryview, count: bool = True) -> Any:
    """`value`, each long array rebuilt from `body` and put back in its dict (its size counted for the loop).

    `count`: False for a job's inputs, which the instance process puts back (no loop there counts them).
    """
    for index, name, shape, offset, sizes in longs:
        response = value[index]
        if type(response) is not dict:  # it could not leave the process (host._sendable): it fails alone
            continue
        array = rebuilt(shape, body, offset, sizes)
        if count:
            count_ahead(array)
        response[name] = array
    return value


def rebuilt(shape: Tuple[int, ...], body: memoryview, offset: int, sizes: Sequence[int]) -> np.ndarray:
    """The object array of `shape` whose elements `pickled_pieces` wrote at `offset` of `body`, a piece at a time.

    Raises ValueError when the pieces do not hold as many elements as the shape has.
    """
    count = math.prod(shape)
    flat = np.empty(count, dtype=np.object_)
    at = 0
    for size in sizes:
        items = loads(body[offset : offset + size])
        offset += size
        if at + len(items) > count:
            raise ValueError(f"pieces of more than the {count} elements of an object array of shape {shape}")
        try:
            flat[at : at + len(items)] = items
        except (ValueError, TypeError):  # elements numpy reads as sequences (lists of one length): one by one
            for item in items:
                flat[at] = item
                at += 1
        else:
            at += len(items)
        del items
    if at != count:
        raise ValueError(f"pieces of {at} elements for an object array of shape {shape}")
    return flat.reshape(shape)
