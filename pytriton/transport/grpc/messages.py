"""gRPC's length-prefixed messages: reassembled from DATA frames, decompressed and compressed, size-checked."""

from __future__ import annotations

import struct
import zlib
from typing import List, Optional, Sequence

import grpc

from pytriton.core.raw_tensors import Buffer

_PREFIX = struct.Struct(">BI")
PREFIX_SIZE = 5

# grpc-encoding -> zlib wbits ("deflate" is zlib-wrapped, as grpc sends it).
_WBITS = {"gzip": 31, "deflate": 15}
ENCODINGS = ("identity", *_WBITS)
ACCEPT_ENCODING = b"identity,deflate,gzip"
# The algorithms in grpc's order of strength: a compression level picks among those the client accepts.
_BY_STRENGTH = ("gzip", "deflate")


class MessageError(Exception):
    """A message that cannot be taken: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        """An error answering `code` with `details`."""
        super().__init__(details)
        self.code = code
        self.details = details


class MessageReader:
    """Cuts the DATA of one call into messages, no larger than `limit` bytes each once decompressed."""

    __slots__ = ("_buffer", "_encoding", "_limit")

    def __init__(self, encoding: Optional[str], limit: int) -> None:
        """A reader for messages sent with grpc-encoding `encoding` (None: not compressed)."""
        self._encoding = encoding
        self._limit = limit
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        """Whether part of a message is still missing."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> List[bytes]:
        """The messages completed by `data`."""
        buffer = self._buffer
        if not buffer and len(data) >= PREFIX_SIZE:  # the usual case: one whole message in one DATA frame
            flag, length = _PREFIX.unpack_from(data)
            if length == len(data) - PREFIX_SIZE:
                return [self._message(flag, length, data[PREFIX_SIZE:])]
        buffer += data
        messages: List[bytes] = []
        while len(buffer) >= PREFIX_SIZE:
            flag, length = _PREFIX.unpack_from(buffer)
            self._check_size(length)
            end = PREFIX_SIZE + length
            if len(buffer) < end:
                break
            messages.append(self._message(flag, length, bytes(buffer[PREFIX_SIZE:end])))
            del buffer[:end]
        if len(buffer) >= PREFIX_SIZE:
            self._check_size(_PREFIX.unpack_from(buffer)[1])
        return messages

    def _check_size(self, length: int) -> None:
        """Refuse a message larger than the limit as soon as its prefix says so."""
        if length > self._limit:
            raise MessageError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {self._limit})"
            )

    def _message(self, flag: int, length: int, payload: bytes) -> bytes:
        """A message's bytes, decompressed when its flag says it is compressed."""
        if not flag:
            self._check_size(length)
            return payload
        if flag != 1:
            raise MessageError(grpc.StatusCode.INTERNAL, f"invalid message compression flag {flag}")
        if self._encoding is None:
            raise MessageError(grpc.StatusCode.INTERNAL, "compressed message without a grpc-encoding")
        self._check_size(length)
        inflater = zlib.decompressobj(_WBITS[self._encoding])
        try:
            message = inflater.decompress(payload, self._limit + 1)
        except zlib.error as error:
            raise MessageError(
                grpc.StatusCode.INTERNAL, f"cannot decompress a {self._encoding} message: {error}"
            ) from None
        if len(message) > self._limit:
            raise MessageError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max (> {self._limit} decompressed)"
            )
        if not inflater.eof:
            raise MessageError(grpc.StatusCode.INTERNAL, f"truncated {self._encoding} message")
        return message


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


def frame_message(parts: Sequence[Buffer], size: int, encoding: Optional[str], limit: int) -> bytes:
    """A message with its 5-byte prefix, compressed with `encoding` (None: as it is), in one buffer.

    Joining is the one copy of the outputs on the way out, made now: the transport may send later
    (flow control, a slow client), when the callable may have reused its output arrays.
    """
    if encoding is not None:
        deflater = zlib.compressobj(wbits=_WBITS[encoding])
        body = b"".join([deflater.compress(part) for part in parts] + [deflater.flush()])
        parts, size, flag = (body,), len(body), 1
    else:
        flag = 0
    if size > limit:
        raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {limit})")
    return b"".join((_PREFIX.pack(flag, size), *parts))
