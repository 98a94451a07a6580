"""Inflating a compressed request a step at a time, letting the event loop serve other clients in between.

One `zlib.decompress` of a 33 KB HTTP body that inflates to 64 MiB held every other connection of the
server for 0.3-0.6 s (measured on the bench machine); a gRPC message can inflate to
grpc_max_message_bytes (2 GiB by default). Here zlib takes at most INPUT_STEP_BYTES of input and
gives at most STEP_BYTES of output per step, and the loop runs between steps: the others wait one step
(a few ms) at a time. Taking the input in slices also keeps zlib from copying the rest of a large input
as its `unconsumed_tail` after every step. Both transports use it: HTTP's Content-Encoding and gRPC's
grpc-encoding.

What inflated requests hold is also bounded server-wide (`InflationBudget`): each request is bounded by its
own limit, but a client sends a bomb for a thousandth of what it costs the server, and one connection of 100
streams of 2 MiB gzip messages that inflate to 2 GiB each could ask for 200 GiB (4 calls of 256 MiB: the server's
RSS rose by 1 GiB for 1 MiB received).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import weakref
import zlib
from typing import Optional, Tuple

import numpy as np

from pytriton.core.logs.log_budget import LogBudget
from pytriton.core.tensors.raw_tensors import Buffer

LOGGER = logging.getLogger(__name__)

STEP_BYTES = 4 * 2**20
INPUT_STEP_BYTES = 2**20
# A stream's first slice of input; each next one is twice as large, up to INPUT_STEP_BYTES. zlib copies what
# is left of a slice after a stream's end (`unused_data`): a first slice of 1 MiB made each of a body's tiny
# gzip members cost 18 us.
FIRST_INPUT_BYTES = 16 * 1024
# gzip members one body may have (RFC 1952 allows any number; writers that use several make a few, or one per
# 64 KiB block): past it the body is refused, so that millions of empty members cannot cost seconds of CPU.
MAX_MEMBERS = 4096
# A body of many gzip members lets the loop run after this many members.
_MEMBERS_PER_TURN = 256


class Failure(enum.Enum):
    """Why compressed bytes could not be inflated."""

    CORRUPT = "corrupt"  # not a stream of the format (zlib's error says where)
    TRUNCATED = "truncated"  # the input ends inside the stream
    TOO_LARGE = "too large"  # the stream inflates past the limit
    OVER_BUDGET = "over budget"  # what inflated requests hold at once would pass the server's budget


class InflateError(Exception):
    """A compressed request that cannot be taken, and why (`failure`)."""

    def __init__(self, failure: Failure, detail: str) -> None:
        """The error, `detail` saying what is wrong in words."""
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


class InflationBudget:
    """Bytes that inflated requests may hold at once, all of a server's connections together.

    A request's share is taken as zlib produces its bytes and given back when the last view of them is gone
    (the request's tensors, outputs sent as views of them, an input a model kept), from whichever thread drops
    it: hence the lock. A refusal is logged for the operator (a few a minute, then a count), since only its
    client hears of it otherwise.
    """

    def __init__(self, capacity: int) -> None:
        """A budget of `capacity` bytes."""
        self.capacity = capacity
        self.held = 0
        self._lock = threading.Lock()
        self._log = LogBudget(self._held_back)

    def take(self, size: int) -> bool:
        """Take `size` more bytes if they fit; whether they did."""
        with self._lock:
            if self.held + size > self.capacity:
                return False
            self.held += size
            return True

    def give_back(self, size: int) -> None:
        """Return `size` bytes taken earlier."""
        with self._lock:
            self.held -= size

    def refused(self) -> None:
        """A request was refused for want of room (on the event loop): tell the operator, within the log's budget."""
        line = (
            f"a compressed request was refused: decompressed requests in progress hold {self.held} of the "
            f"{self.capacity} bytes ServerLimits.max_inflated_bytes allows"
        )
        if self._log.admit(line):
            LOGGER.warning("%s", line)

    def _held_back(self, count: int, last: str) -> None:
        LOGGER.warning("... and %d more compressed requests refused for the same reason; the last: %s", count, last)


class _Share:
    """What one inflated request holds of a budget; given back once, when its bytes go or inflating fails."""

    __slots__ = ("_budget", "_taken")

    def __init__(self, budget: InflationBudget) -> None:
        self._budget = budget
        self._taken = 0

    def grow(self, size: int) -> None:
        """The request holds `size` bytes now."""
        more = size - self._taken
        if more > 0:
            if not self._budget.take(more):
                self._budget.refused()
                raise InflateError(
                    Failure.OVER_BUDGET,
                    f"decompressed requests in progress would hold more than {self._budget.capacity} bytes",
                )
            self._taken = size

    def give_back(self) -> None:
        taken, self._taken = self._taken, 0
        if taken:
            self._budget.give_back(taken)


async def inflate(
    data: Buffer,
    wbits: int,
    limit: int,
    *,
    members: bool = False,
    name: str = "compressed",
    budget: Optional[InflationBudget] = None,
) -> Tuple[Buffer, int]:
    """`data` inflated with zlib's `wbits`, refused past `limit` bytes; and where its compressed stream ended.

    With `members`, the streams that follow the first one are inflated onto it in turn, as gzip allows
    (RFC 1952 2.2): the end is then where the input ends, or where a stream that is not one begins (an error).
    Without, what follows the first stream is left to the caller (the end says where). The bytes come as a
    bytearray, or with a `budget` as a writable memoryview that holds their size of it until it and every view
    made of it are gone (the memoryview's exporter is an array watched for its end: a bytearray cannot be).

    Raises:
        InflateError: the bytes are not a compressed stream, it is truncated (the error says "the `name` stream
            is truncated"), it inflates past `limit`, or past what is left of `budget`.
    """
    view = memoryview(data).cast("B")
    inflated = bytearray()
    share = _Share(budget) if budget is not None else None
    try:
        end = await _inflate_stream(view, 0, wbits, inflated, limit, name, share)
        streams = 1
        while members and end < len(view):
            if streams == MAX_MEMBERS:
                raise InflateError(Failure.CORRUPT, f"more than {MAX_MEMBERS} {name} members")
            if not streams % _MEMBERS_PER_TURN:
                await asyncio.sleep(0)
            end = await _inflate_stream(view, end, wbits, inflated, limit, name, share)
            streams += 1
    except BaseException:
        # The error's traceback holds this frame, and a cancelled call's task, its error and the call make a
        # cycle: what was inflated would wait for the cycle collector (GBs of a bomb, seen).
        inflated.clear()
        if share is not None:
            share.give_back()
        raise
    if share is None:
        return inflated, end
    watched = np.frombuffer(inflated, np.uint8)
    weakref.finalize(watched, share.give_back)
    return memoryview(watched), end  # type: ignore[arg-type]  # ndarray exports its buffer; numpy stubs say not


async def _inflate_stream(
    view: memoryview, start: int, wbits: int, inflated: bytearray, limit: int, name: str, share: Optional[_Share]
) -> int:
    """Inflate the stream that begins at `view[start]` onto `inflated`; where it ends."""
    decompressor = zlib.decompressobj(wbits)
    position = start
    step = FIRST_INPUT_BYTES
    try:
        while not decompressor.eof:
            if position == len(view):  # all of the input was taken: what zlib still holds, then it must be over
                inflated += decompressor.flush()
                _check_size(inflated, limit)
                if share is not None:
                    share.grow(len(inflated))
                if not decompressor.eof:
                    raise InflateError(Failure.TRUNCATED, f"the {name} stream is truncated")
                break
            if position > start:
                await asyncio.sleep(0)
            pending: Buffer = view[position : position + step]
            position += len(pending)
            step = min(step * 2, INPUT_STEP_BYTES)
            while True:
                inflated += decompressor.decompress(pending, min(STEP_BYTES, limit + 1 - len(inflated)))
                _check_size(inflated, limit)
                if share is not None:
                    share.grow(len(inflated))
                # At the stream's end what follows it is in unused_data (and, past a max_length, in
                # unconsumed_tail too, where feeding it again would only append it to unused_data for ever).
                pending = decompressor.unconsumed_tail
                if decompressor.eof or not pending:
                    break
                await asyncio.sleep(0)
    except zlib.error as error:
        raise InflateError(Failure.CORRUPT, str(error)) from None
    return position - len(decompressor.unused_data)


def _check_size(inflated: bytearray, limit: int) -> None:
    """Refuse an inflated request past its limit."""
    if len(inflated) > limit:
        raise InflateError(Failure.TOO_LARGE, f"it inflates to more than {limit} bytes")
