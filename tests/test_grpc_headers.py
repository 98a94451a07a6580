"""HPACK header blocks: the remembering decoder agrees with hpack's on every block, whatever the table does."""

from __future__ import annotations

from typing import List, Tuple

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytriton.transport.grpc.frames import ENHANCE_YOUR_CALM, Http2Error
from pytriton.transport.grpc.headers import HeaderBlockDecoder, HeaderListTooLarge, MalformedHeaders, encode_block

Header = Tuple[bytes, bytes]

GRPC_CALL: List[Header] = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"127.0.0.1:8001"),
    (b"te", b"trailers"),
    (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-python/1.85"),
]

names = st.sampled_from([b"x-a", b"x-b", b"grpc-timeout", b"authorization", b"x-" + b"long" * 30])
# Without NUL, CR or LF: a value holding one is malformed (RFC 9113 8.2.1), refused on its stream.
values = st.binary(min_size=0, max_size=40).map(lambda value: value.translate(None, b"\0\r\n"))
extra_fields = st.lists(st.tuples(names, values), max_size=4)


def _blocks(encoder: hpack.Encoder, calls: List[List[Header]], table_sizes: List[int]) -> List[bytes]:
    blocks = []
    for index, extra in enumerate(calls):
        if index < len(table_sizes):
            encoder.header_table_size = table_sizes[index]  # emits a dynamic table size update in the next block
        blocks.append(encoder.encode(GRPC_CALL + extra, huffman=index % 2 == 0))
    return blocks


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(extra_fields, min_size=1, max_size=30),
    table_sizes=st.lists(st.sampled_from([0, 64, 256, 4096]), max_size=5),
    repeats=st.integers(min_value=1, max_value=3),
)
def test_remembered_blocks_decode_as_hpack_does(
    calls: List[List[Header]], table_sizes: List[int], repeats: int
) -> None:
    # Each call is sent `repeats` times in a row: the repeats are the blocks the decoder remembers.
    sent = [call for call in calls for _ in range(repeats)]
    blocks = _blocks(hpack.Encoder(), sent, table_sizes)
    ours, reference = HeaderBlockDecoder(65536), hpack.Decoder(max_header_list_size=65536)
    for block in blocks:
        assert ours.decode(block) == list(reference.decode(block, raw=True))


def test_a_repeated_block_is_remembered_and_still_right_after_the_table_changes() -> None:
    encoder = hpack.Encoder()
    decoder = HeaderBlockDecoder(65536)
    first = encoder.encode(GRPC_CALL)
    second = encoder.encode(GRPC_CALL)  # every field indexed now
    assert len(second) < 16 and second != first
    assert decoder.decode(first) == GRPC_CALL
    assert decoder.decode(second) is decoder.decode(second)  # remembered: the same list
    # A new field is added to the table: old indices shift, so the remembered block must go.
    changed = encoder.encode([*GRPC_CALL, (b"x-new", b"1")])
    assert decoder.decode(changed)[-1] == (b"x-new", b"1")
    again = encoder.encode(GRPC_CALL)
    assert decoder.decode(again) == GRPC_CALL


def test_oversized_header_list_is_refused_and_the_table_kept() -> None:
    # A list up to twice the limit is decoded whole, as hpack's own decoder (without a limit) does, then refused:
    # the next blocks refer to the entries it added (and hpack stopped half-way through it).
    encoder, reference = hpack.Encoder(), hpack.Decoder(max_header_list_size=1 << 20)
    decoder = HeaderBlockDecoder(1024)
    blocks = [
        encoder.encode([*GRPC_CALL, (b"x-a", b"1")]),
        encoder.encode([*GRPC_CALL, (b"x-b", b"v" * 500), (b"x-big", b"v" * 900), (b"x-c", b"2")]),
        encoder.encode([*GRPC_CALL, (b"x-a", b"1"), (b"x-c", b"2")]),
    ]
    assert decoder.decode(blocks[0]) == list(reference.decode(blocks[0], raw=True))
    expected = list(reference.decode(blocks[1], raw=True))
    with pytest.raises(HeaderListTooLarge) as refused:
        decoder.decode(blocks[1])
    assert (refused.value.size, refused.value.limit) == (sum(32 + len(n) + len(v) for n, v in expected), 1024)
    last = [*GRPC_CALL, (b"x-a", b"1"), (b"x-c", b"2")]
    assert decoder.decode(blocks[2]) == list(reference.decode(blocks[2], raw=True)) == last


def test_a_malformed_block_is_refused_each_time_it_comes_and_the_table_kept() -> None:
    # Checked only as a block is first decoded: a malformed one is never remembered, so its repeats are refused too.
    encoder = hpack.Encoder()
    decoder = HeaderBlockDecoder(65536)
    malformed = [*GRPC_CALL, (b"X-Upper", b"1")]
    first, repeat = encoder.encode(malformed), encoder.encode(malformed)
    for block in (first, repeat, repeat):
        with pytest.raises(MalformedHeaders):
            decoder.decode(block)
    assert decoder.decode(encoder.encode(GRPC_CALL)) == GRPC_CALL  # its fields went into the table


def test_header_list_over_twice_the_limit_ends_the_connection_enhance_your_calm() -> None:
    # Not COMPRESSION_ERROR: the block is good HPACK, only too large to decode.
    block = hpack.Encoder().encode([*GRPC_CALL, (b"x-big", b"v" * 5000)])
    with pytest.raises(Http2Error) as refused:
        HeaderBlockDecoder(1024).decode(block)
    assert (refused.value.code, str(refused.value)) == (ENHANCE_YOUR_CALM, "header list larger than 2048 bytes")


@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 300, 70000])
def test_encoded_literals_decode_with_hpack(size: int) -> None:
    fields = [(b"grpc-status", b"13"), (b"grpc-message", b"m" * size), (b"n" * (size % 200 + 1), b"v")]
    assert list(hpack.Decoder(max_header_list_size=1 << 20).decode(encode_block(fields), raw=True)) == fields


def test_an_entry_replaced_in_a_full_table_forgets_the_remembered_blocks() -> None:
    # A 64-byte table holds one entry: adding one evicts the other, so the table's length stays 1.
    encoder = hpack.Encoder()
    encoder.header_table_size = 64
    decoder = HeaderBlockDecoder(65536)
    first_a, repeat_a = encoder.encode([(b"x-a", b"1")]), encoder.encode([(b"x-a", b"1")])
    first_b, repeat_b = encoder.encode([(b"x-a", b"2")]), encoder.encode([(b"x-a", b"2")])
    assert repeat_a == repeat_b  # "dynamic entry 62": the same bytes, another header
    assert [decoder.decode(block) for block in (first_a, repeat_a, first_b, repeat_b)] == [
        [(b"x-a", b"1")],
        [(b"x-a", b"1")],
        [(b"x-a", b"2")],
        [(b"x-a", b"2")],
    ]


def test_only_small_blocks_are_remembered() -> None:
    decoder = HeaderBlockDecoder(65536)
    small = encode_block([(b"x-small", b"v" * 100)])  # literals without indexing: the table never changes
    large = encode_block([(b"x-large", b"v" * 3000)])
    assert decoder.decode(small) is decoder.decode(small)
    first, second = decoder.decode(large), decoder.decode(large)
    assert first == second == [(b"x-large", b"v" * 3000)] and first is not second
