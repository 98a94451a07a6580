"""HPACK header blocks: a decoder that remembers blocks it has seen, and a literal-only encoder.

Decoding is hpack's. A gRPC client sends nearly the same block for every call of a method, and
after the first call every field of it is a reference into the dynamic table, so the bytes repeat:
decoding them again with hpack costs ~40 us a call, looking them up ~0.1 us. A remembered block
stays valid only while the dynamic table is unchanged, so any block that changes the table empties
the memory (and is not remembered: decoding it again would change the table again).

Responses never index anything (literal fields without indexing), so the encoder keeps no table and
the peer's SETTINGS_HEADER_TABLE_SIZE never matters to it.

A header list over the limit is refused on its stream alone (HeaderListTooLarge), as grpc's C-core (Triton)
does: the block is decoded to its end all the same, so that the table stays the client's, within a second,
wider bound (past it the block is an HPACK error, which ends the connection).

A list no HTTP/2 request may carry (MalformedHeaders: a field name in uppercase or with a byte a name may
not hold, a value with NUL, CR or LF, a connection-specific field, a pseudo-header that is not a request's,
twice, or after a regular field, a te other than "trailers", a content-length that is not one number; RFC
9113 8.2.1, 8.2.2, 8.3, RFC 9110 8.6) is a stream error. It is checked as a block is
first decoded, and such a block is never remembered: the blocks that repeat cost nothing more. Which
pseudo-headers a request must have is the gRPC layer's (session.py answers a missing one in grpc's words,
as Triton does).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import hpack

from pytriton.transport.grpc import frames as h2

Header = Tuple[bytes, bytes]

# The most blocks remembered per connection (blocks with a changing field, like grpc-timeout, never repeat),
# and the largest one remembered: a repeated gRPC block is a few dozen bytes of table references.
_REMEMBERED_BLOCKS = 64
_REMEMBERED_BLOCK_BYTES = 1024
# How far past the limit a header list (and a header block, in its frames) is still taken whole, decoded to its end
# (to keep the table) and refused on its stream alone; a list over it is an HPACK error. It bounds what a refused
# block costs, decoded twice: a field counts 32 bytes or more (at most 4 Ki fields, ~7 ms, a 64 KiB limit), and
# hpack's Huffman decoding costs ~0.12 us a byte (a 128 KiB block of one field: ~30 ms; a plain one: ~0.1 ms).
OVERSIZE_FACTOR = 2


class HeaderListTooLarge(Exception):
    """A header block decoded whole (the table is up to date) whose header list is over the limit."""

    def __init__(self, size: int, limit: int) -> None:
        """A list of `size` bytes as HPACK counts them (32 + name + value a field), over `limit`."""
        super().__init__(f"received metadata size exceeds hard limit ({size} vs. {limit})")  # grpc's words
        self.size = size
        self.limit = limit


class MalformedHeaders(Exception):
    """A header block decoded whole (the table is up to date) whose list no request may carry."""


_REQUEST_PSEUDO_HEADERS = frozenset((b":method", b":scheme", b":path", b":authority"))
# The bytes a field name may hold (RFC 9113 8.2.1: not 0x00-0x20, 0x41-0x5a or 0x7f-0xff; ':' leads a pseudo-header).
_NAME_BYTES = bytes(byte for byte in range(0x21, 0x7F) if not 0x41 <= byte <= 0x5A and byte != 0x3A)
# More would be past any length (nghttp2 takes 63 bits), and Python reads no number of over 4,300 digits.
_CONTENT_LENGTH_DIGITS = 18
# RFC 9113 8.2.2 (te is allowed, with "trailers" alone: another value is malformed; a missing one is the gRPC layer's).
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))


def malformed(headers: Sequence[Header]) -> Optional[str]:
    """Why a header list is malformed as a request's (RFC 9113 8.2.1, 8.2.2, 8.3; RFC 9110 8.6), or None."""
    pseudo: List[bytes] = []
    regular = False
    for name, _ in headers:
        if name[:1] == b":":
            if regular:
                return f"pseudo-header {name.decode('latin-1')} after a regular field"
            if name not in _REQUEST_PSEUDO_HEADERS:
                return f"pseudo-header {name.decode('latin-1')} is not a request's"
            if name in pseudo:
                return f"pseudo-header {name.decode('latin-1')} twice"
            pseudo.append(name)
            continue
        regular = True
        if not name or name.translate(None, _NAME_BYTES):
            return f"field name {name!r} in uppercase or with a character a name may not hold"
        if name in _CONNECTION_SPECIFIC:
            return f"connection-specific field {name.decode('latin-1')}"
    content_length = False
    for name, value in headers:
        if b"\0" in value or b"\n" in value or b"\r" in value:
            return f"field {name!r} with a NUL, CR or LF in its value"
        if name == b"te" and value != b"trailers":
            return f"te {value!r}, not trailers"
        if name == b"content-length":  # RFC 9110 8.6: digits, once (what DATA must add up to: session.py)
            if content_length:
                return "content-length twice"
            if not value.isdigit() or len(value) > _CONTENT_LENGTH_DIGITS:
                return f"content-length {value[: _CONTENT_LENGTH_DIGITS + 1]!r} is not a number of at most 18 digits"
            content_length = True
    return None


class HeaderBlockDecoder:
    """The HPACK decoder of one connection."""

    def __init__(self, max_header_list_size: int) -> None:
        """A decoder refusing header lists larger than `max_header_list_size` bytes (as HPACK counts them)."""
        self._limit = max_header_list_size
        # hpack stops a block half-way at its limit, its table changes half made: it is given the wider bound
        # (past which the connection ends anyway), and the list is measured against the limit here, decoded whole
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size * OVERSIZE_FACTOR)
        self._table: Any = self._decoder.header_table
        self._known: Dict[bytes, List[Header]] = {}

    def decode(self, block: bytes) -> List[Header]:
        """The header fields of a block, as raw bytes; the list is shared: do not change it.

        Raises:
            HeaderListTooLarge: the block's table changes made, its list within OVERSIZE_FACTOR times the limit.
            MalformedHeaders: the block's table changes made, its list one no request may carry.
            Http2Error: ENHANCE_YOUR_CALM, a list over that (the block is not a compression error).
        """
        known = self._known.get(block)
        if known is not None:
            return known
        table = self._table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers: List[Header] = list(self._decoder.decode(block, raw=True))
        except hpack.OversizedHeaderListError:
            bound = self._limit * OVERSIZE_FACTOR
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, f"header list larger than {bound} bytes") from None
        except hpack.HPACKError:
            self._known.clear()
            raise
        unchanged = (
            len(entries) == before[0] and (entries[0] if entries else None) is before[1] and table.maxsize == before[2]
        )
        if not unchanged:
            self._known.clear()
        size = sum(32 + len(name) + len(value) for name, value in headers)
        if size > self._limit:
            raise HeaderListTooLarge(size, self._limit)
        problem = malformed(headers)
        if problem is not None:
            raise MalformedHeaders(problem)
        if unchanged and len(block) <= _REMEMBERED_BLOCK_BYTES:
            if len(self._known) >= _REMEMBERED_BLOCKS:
                self._known.clear()
            self._known[block] = headers
        return headers


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix; `first` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_block(headers: Sequence[Header]) -> bytes:
    """A header block of literal fields without indexing (new names, no Huffman coding)."""
    parts: List[bytes] = []
    for name, value in headers:
        parts += (b"\x00", _integer(len(name), 7, 0), name, _integer(len(value), 7, 0), value)
    return b"".join(parts)


STATUS_200 = b"\x88"  # ":status: 200", index 8 of the static table
