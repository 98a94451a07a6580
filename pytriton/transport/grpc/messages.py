"""gRPC's length-prefixed messages: reassembled from DATA frames, decompressed and compressed, size-checked."""

from __future__ import annotations

import struct
import zlib
from typing import Callable, List, Optional, Sequence, Union

import grpc

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.transport.inflate import Failure, InflateError, InflationBudget, inflate
from pytriton.transport.receive_budget import SHARE_BYTES, ReceiveBudget, Share, watch
from pytriton.transport.receive_buffers import RECEIVE_BUFFERS

_PREFIX = struct.Struct(">BI")
PREFIX_SIZE = 5
# Messages at least this large stay in the buffer they were assembled in (protobuf parses smaller ones alone).
SCATTER_BYTES = 64 * 1024

# grpc-encoding -> zlib wbits ("deflate" is zlib-wrapped, as grpc sends it).
_WBITS = {"gzip": 31, "deflate": 15}
ENCODINGS = ("identity", *_WBITS)
ACCEPT_ENCODING = b"identity, deflate, gzip"  # as grpc's C-core (tritonserver 2.51) writes it
# The algorithms in grpc's order of strength: a compression level picks among those the client accepts.
_BY_STRENGTH = ("gzip", "deflate")


# grpc's C-core's words for a request message it cannot hand to a unary method (or parse).
UNPARSED = "Unable to parse request"


class MessageError(Exception):
    """A message that cannot be taken: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        """An error answering `code` with `details`."""
        super().__init__(details)
        self.code = code
        self.details = details
        self.completed: List[Message] = []  # the messages the same DATA completed before this one


class MessageReader:
    """Cuts the DATA of one call into messages, no larger than `limit` bytes each once decompressed.

    A message spread over several DATA frames is copied, once, into a buffer of the size its prefix
    declares (receive_buffers.py: uninitialised, reused once unreferenced; a declared size costs nothing
    until it is sent), or read straight into it (`room`, `filled`). Messages of
    SCATTER_BYTES or more stay in that buffer, writable, and their tensors are views of it; smaller ones
    become bytes.
    """

    __slots__ = (
        "_budget",
        "_encoding",
        "_filled",
        "_flag",
        "_limit",
        "_message",
        "_prefix",
        "_receive_budget",
        "granted",
        "share",
    )

    def __init__(
        self,
        encoding: Optional[str],
        limit: int,
        budget: Optional[InflationBudget] = None,
        receive_budget: Optional[ReceiveBudget] = None,
    ) -> None:
        """A reader for messages sent with grpc-encoding `encoding` (None: not compressed).

        Compressed messages, once inflated, hold their size of `budget` (the server's) while they live. Messages
        of SHARE_BYTES or more hold their declared size of `receive_budget` from their prefix until the last view
        of them is gone or `end_share`; while it has no room for one, `waiting` says so and `granted()` is called
        once it has.
        """
        self._encoding = encoding
        self._limit = limit
        self._budget = budget
        self._receive_budget = receive_budget
        self.granted: Callable[[], None] = _nothing
        self.share: Optional[Share] = None  # the share of the latest large message
        self._prefix = b""  # the start of a length prefix split between DATA frames
        self._message: Optional[memoryview] = None  # the buffer of the message under way
        self._filled = 0
        self._flag = 0

    @property
    def partial(self) -> bool:
        """Whether part of a message is still missing."""
        return self._message is not None or bool(self._prefix)

    @property
    def waiting(self) -> bool:
        """Whether the message under way waits for room in the receive budget: its stream must not send more."""
        share = self.share
        return share is not None and share.waiting and self._message is not None

    def drop(self) -> None:
        """Let go of the message under way: its call is over, and its buffer must not wait for the cycle collector."""
        self._message = None
        self._prefix = b""
        self.end_share()

    def end_share(self) -> None:
        """The call is answered or over: the latest large message's share comes back (the earlier ones' did)."""
        self.granted = _nothing  # the call's bound method: the call holds this reader, a cycle once it is over
        share, self.share = self.share, None
        if share is not None:
            share.give_back()

    def feed(self, data: Buffer) -> List[Message]:
        """The messages completed by `data`."""
        size = len(data)
        if self._message is None and not self._prefix and size >= PREFIX_SIZE:
            flag, length = _PREFIX.unpack_from(data)
            if length == size - PREFIX_SIZE:  # the usual case: one whole message in one DATA frame
                return [self._whole(flag, length, bytes(data[PREFIX_SIZE:]))]
        messages: List[Message] = []
        try:
            self._feed(data, size, messages)
        except MessageError as error:
            error.completed = messages
            raise
        return messages

    def _feed(self, data: Buffer, size: int, messages: List[Message]) -> None:
        """Append the messages completed by `data` (`size` bytes) to `messages`."""
        position = 0
        while True:
            message = self._message
            if message is None:
                if position >= size:
                    return
                taken = PREFIX_SIZE - len(self._prefix)
                prefix = self._prefix + bytes(data[position : position + taken])
                position += taken
                if len(prefix) < PREFIX_SIZE:
                    self._prefix = prefix
                    return
                self._prefix = b""
                flag, length = _PREFIX.unpack_from(prefix)
                self._check_size(length)
                self._flag, self._filled = flag, 0
                if length >= SHARE_BYTES and self._receive_budget is not None:
                    self._claim(length)
                try:
                    message = self._message = RECEIVE_BUFFERS.take(length)
                except MemoryError:  # the process's memory limit (RLIMIT_AS, a cgroup's): raised through the
                    # framing, it ended the connection, and every call on it (a client's calls share one)
                    self.end_share()
                    raise MessageError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the server is out of memory: no room for a message of {length} bytes now",
                    ) from None
            filled = self._filled
            count = min(size - position, len(message) - filled)
            message[filled : filled + count] = data[position : position + count]
            position += count
            self._filled = filled = filled + count
            if filled < len(message):
                return
            self._message = None
            if filled < SCATTER_BYTES:
                body: Buffer = message.tobytes()
            else:
                body = message if filled < SHARE_BYTES else self._watched(message)
            messages.append(self._whole(self._flag, filled, body))

    def feed_pieces(self, pieces: Sequence[Buffer]) -> List[Message]:
        """The messages completed by `pieces` (consecutive DATA payloads of the call; one alone goes to `feed`)."""
        messages: List[Message] = []
        message, filled = self._message, self._filled
        for piece in pieces:
            size = len(piece)
            if message is not None and len(message) - filled > size:  # inside the message under way
                message[filled : filled + size] = piece
                filled += size
                continue
            self._filled = filled
            try:
                messages += self.feed(piece)
            except MessageError as error:
                error.completed = messages + error.completed
                raise
            message, filled = self._message, self._filled
        self._filled = filled
        return messages

    def room(self, limit: int) -> Optional[memoryview]:
        """Where up to `limit` more bytes of the message under way go (None: none is under way)."""
        message = self._message
        if message is None:
            return None
        filled = self._filled
        return message[filled : min(len(message), filled + limit)]

    def filled(self, length: int) -> List[Message]:
        """`length` bytes were written into the room `room` gave: the message, once it is whole."""
        message = self._message
        assert message is not None, "bytes read in place with no message under way"
        self._filled += length
        if self._filled < len(message):
            return []
        self._message = None
        if self._filled >= SHARE_BYTES:
            message = self._watched(message)
        return [self._whole(self._flag, self._filled, message)]

    def _claim(self, length: int) -> None:
        """A share of the receive budget for a message of `length` bytes whose prefix has come.

        Should it wait, the stream's message before it (if large, and its bytes not gone yet) gives its share
        back: whatever holds that one until the next comes (a handler's loop variable) must not hold it for ever.
        """
        previous = self.share
        assert self._receive_budget is not None
        self.share = share = self._receive_budget.claim(length, self.granted)
        if previous is not None and share.waiting:
            previous.give_back()

    def _watched(self, message: memoryview) -> memoryview:
        """A whole large message, holding its share until its last view is gone (counted now if it still waits)."""
        share = self.share
        if share is None:
            return message
        if share.waiting:  # it came whole with its prefix, or in the window the stream had: its bytes are here
            share.force()
        return watch(message, share)

    def _check_size(self, length: int) -> None:
        """Refuse a message larger than the limit as soon as its prefix says so."""
        if length > self._limit:
            raise MessageError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {self._limit})"
            )

    def _whole(self, flag: int, length: int, payload: Buffer) -> Message:
        """A message's bytes, or a `Compressed` one (inflated by its call's task) when its flag says so."""
        if not flag:
            self._check_size(length)
            return payload
        if flag != 1:  # grpc's C-core cannot read it (tritonserver 2.51's words, probed)
            raise MessageError(grpc.StatusCode.INTERNAL, UNPARSED)
        if not length:  # nothing to inflate: an empty message, as grpc's C-core reads it (tritonserver 2.51, probed)
            return payload
        self._check_size(length)
        if self._encoding is None:  # grpc's C-core reads the bytes as they are (tritonserver 2.51 serves, probed)
            return payload
        return Compressed(payload, self._encoding, self._limit, self._budget)


class Compressed:
    """A whole message still compressed: its call inflates it (`inflated`), a step at a time, off the frame reader.

    Inflated where it arrives, a small message that inflates to the limit (2 GiB by default) would hold
    the loop, and every other call of the server, for as long as zlib takes.
    """

    __slots__ = ("_budget", "_encoding", "_limit", "_payload")

    def __init__(self, payload: Buffer, encoding: str, limit: int, budget: Optional[InflationBudget] = None) -> None:
        """A message of `payload` compressed with `encoding`, no larger than `limit` once inflated.

        Inflated, it holds its size of `budget` (the server's) while it lives.
        """
        self._payload = payload
        self._encoding = encoding
        self._limit = limit
        self._budget = budget

    async def inflated(self) -> Buffer:
        """The message's bytes (a view of them when they are SCATTER_BYTES or more, as for those not compressed).

        Raises:
            MessageError: INTERNAL when the bytes are not a stream of the encoding or it is truncated,
                RESOURCE_EXHAUSTED when the message inflates past the limit or the server's budget.
        """
        encoding = self._encoding
        # A message larger than the whole budget could never inflate: refused as too large, not "try again".
        limit = self._limit if self._budget is None else min(self._limit, self._budget.capacity)
        try:
            message, end = await inflate(self._payload, _WBITS[encoding], limit, name=encoding, budget=self._budget)
            if end < len(self._payload):  # grpc's C-core refuses it too ("not all input consumed")
                raise InflateError(Failure.CORRUPT, "bytes after the end of its stream")
        except InflateError as error:
            if error.failure is Failure.TOO_LARGE:
                raise MessageError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max (> {limit} decompressed)",
                ) from None
            if error.failure is Failure.OVER_BUDGET:
                raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{error.detail}: try again later") from None
            # grpc's C-core's words for any stream it cannot inflate (tritonserver 2.51, probed)
            raise MessageError(
                grpc.StatusCode.INTERNAL, f"Unexpected error decompressing data for algorithm {encoding}"
            ) from None
        finally:
            self._payload = b""  # the compressed bytes (possibly a receive buffer) are not needed any more
        return memoryview(message) if len(message) >= SCATTER_BYTES else bytes(message)


# A whole request message as the reader hands it to its call.
Message = Union[Buffer, Compressed]


def request_encoding(value: Optional[bytes]) -> Optional[str]:
    """The compression of a call's messages from its grpc-encoding header (None: none); UNIMPLEMENTED if unknown."""
    if value is None or value == b"identity":
        return None
    encoding = value.decode("latin-1")
    if encoding not in _WBITS:
        raise MessageError(grpc.StatusCode.UNIMPLEMENTED, f"Compression algorithm '{encoding}' is not supported")
    return encoding


def response_encoding(level: int, accepted: Optional[bytes]) -> Optional[str]:
    """The compression of responses for a compression level (0: none) among those the client accepts, as grpc does."""
    if not level or accepted is None:
        return None
    offered = {name.strip() for name in accepted.decode("latin-1").split(",")}
    usable = [name for name in _BY_STRENGTH if name in offered]
    if not usable:
        return None
    return usable[0] if level == 1 else usable[len(usable) // 2] if level == 2 else usable[-1]


def encoding_wbits(encoding: str) -> int:
    """Zlib's `wbits` for a message compression (`gzip` or `deflate`)."""
    return _WBITS[encoding]


def frame_message(
    parts: Sequence[Buffer], size: int, encoding: Optional[str], limit: int, compressed: bool = False
) -> bytes:
    """A message with its 5-byte prefix, compressed with `encoding` (None: as it is), in one buffer.

    `compressed`: the parts are the message already compressed with `encoding` (transport/deflate.py did it in a
    worker thread). Joining is the one copy of the outputs on the way out, made now: the transport may send later
    (flow control, a slow client), when the callable may have reused its output arrays.
    """
    if compressed:
        flag = 1
    elif encoding is not None:
        deflater = zlib.compressobj(wbits=_WBITS[encoding])
        body = b"".join([deflater.compress(part) for part in parts] + [deflater.flush()])
        parts, size, flag = (body,), len(body), 1
    else:
        flag = 0
    if size > limit:
        raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {limit})")
    return b"".join((_PREFIX.pack(flag, size), *parts))


def message_pieces(parts: Sequence[Buffer], size: int, limit: int) -> List[Buffer]:
    """An uncompressed message as its 5-byte prefix and the parts themselves, not joined (nothing is copied)."""
    if size > limit:
        raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {limit})")
    return [_PREFIX.pack(0, size), *parts]


def _nothing() -> None:
    """A reader's `granted` until its call sets its own, and once the call is over."""
