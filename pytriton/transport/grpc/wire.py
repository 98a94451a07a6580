"""Request parsers and response serializers of the gRPC server: large tensors are never copied into protobuf.

A ModelInferRequest's raw_input_contents become memoryviews of the received bytes, and a response's raw
outputs go out as pieces next to the serialized message head, so a tensor is written straight from its array.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.protocol.grpc_codec import EncodedResponse, Message, kept_message

_LENGTH_DELIMITED = 2
_GROUP_WIRE_TYPES = (3, 4)  # start group, end group
# Messages shorter than this are parsed by protobuf alone: scanning them in Python costs more than it saves.
SCAN_THRESHOLD_BYTES = 64 * 1024
# A message of more fields than this is left to protobuf (C) whole: scanning it field by field in Python would
# hold the event loop for seconds (a few MiB of two-byte fields, millions of them), for no tensor to keep.
MAX_SCANNED_FIELDS = 4096
# Messages up to this size are keys of what the codec read of them (a shared-memory request's is ~400 bytes).
KEYED_MESSAGE_BYTES = 2048


def _field_number(message_type: Any, field: str) -> int:
    """The field number of a message field, read from the stubs' descriptors."""
    return int(message_type.DESCRIPTOR.fields_by_name[field].number)


def _encode_varint(value: int) -> bytes:
    """A protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(message_type: Any, field: str) -> int:
    """The wire key (field number and length-delimited wire type) of a bytes or message field."""
    return (_field_number(message_type, field) << 3) | _LENGTH_DELIMITED


_RAW_INPUT_KEY = _key(service_pb2.ModelInferRequest, "raw_input_contents")
_RAW_OUTPUT_KEY = _encode_varint(_key(service_pb2.ModelInferResponse, "raw_output_contents"))
_STREAM_INFER_RESPONSE_KEY = _encode_varint(_key(service_pb2.ModelStreamInferResponse, "infer_response"))


class InferRequestFrame:
    """A received ModelInferRequest; `raw_inputs` holds its raw_input_contents when they were split off.

    `data` is the message's bytes when it is small enough to be the key of what the codec read of it
    (grpc_codec.decode_infer_request); else None.
    """

    __slots__ = ("data", "message", "raw_inputs")

    def __init__(self, message: Message, raw_inputs: Optional[List[memoryview]], data: Optional[bytes] = None) -> None:
        """Pair the message with the raw input views taken out of it (None: they are still in it) and its bytes."""
        self.message = message
        self.raw_inputs = raw_inputs
        self.data = data


def _small_key(data: Buffer) -> Optional[bytes]:
    """A small message's bytes as a key: only messages of headers alone (tensors in shared memory) repeat."""
    return data if type(data) is bytes and len(data) <= KEYED_MESSAGE_BYTES else None


def _read_varint(data: Buffer, offset: int) -> Tuple[int, int]:
    """Decode a varint at `offset`; return it and the offset after it."""
    result = 0
    shift = 0
    while shift < 64:
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, offset
        shift += 7
    raise DecodeError("varint longer than 10 bytes")


def _field_end(data: Buffer, key: int, offset: int) -> Tuple[int, int]:
    """Where a field's value starts and ends, given its key and the offset after the key."""
    wire_type = key & 7
    if wire_type == _LENGTH_DELIMITED:
        length, start = _read_varint(data, offset)
        return start, start + length
    if wire_type == 0:
        return offset, _read_varint(data, offset)[1]
    if wire_type == 1:
        return offset, offset + 8
    if wire_type == 5:
        return offset, offset + 4
    raise DecodeError(f"unsupported protobuf wire type {wire_type}")


def parse_infer_request(data: Buffer) -> InferRequestFrame:
    """Deserialize a ModelInferRequest; large raw inputs stay in `data` as memoryviews.

    The other fields go to protobuf as runs (one slice for the fields between two raw inputs), so a message costs
    a few objects whatever its fields. A field numbered 0 is no protobuf: refused at once, as protobuf would.
    """
    if len(data) < SCAN_THRESHOLD_BYTES:
        small = _small_key(data)
        message = kept_message(small) if small is not None else None  # one parsed for an earlier request
        if message is None:
            message = service_pb2.ModelInferRequest.FromString(data)
        return InferRequestFrame(message, None, small)
    view = memoryview(data)
    raw_inputs: List[memoryview] = []
    others: List[memoryview] = []
    offset, end = 0, len(data)
    run_start = 0  # where the fields since the last raw input begin
    try:
        for _ in range(MAX_SCANNED_FIELDS):
            if offset >= end:
                break
            field_start = offset
            key, offset = _read_varint(data, offset)
            if key < 8:
                raise DecodeError("invalid field number 0")
            if key & 7 in _GROUP_WIRE_TYPES:  # a group (no proto3 field is one): protobuf knows how to skip it
                return InferRequestFrame(service_pb2.ModelInferRequest.FromString(data), None)
            value_start, offset = _field_end(data, key, offset)
            if offset > end:
                raise DecodeError("truncated message")
            if key == _RAW_INPUT_KEY:
                if run_start < field_start:
                    others.append(view[run_start:field_start])
                raw_inputs.append(view[value_start:offset])
                run_start = offset
        else:
            if offset < end:
                return InferRequestFrame(service_pb2.ModelInferRequest.FromString(data), None)
    except IndexError:
        raise DecodeError("truncated message") from None
    if not raw_inputs:
        return InferRequestFrame(service_pb2.ModelInferRequest.FromString(data), None)
    if run_start < end:
        others.append(view[run_start:end])
    return InferRequestFrame(service_pb2.ModelInferRequest.FromString(b"".join(others)), raw_inputs)


def message_parts(message: Message) -> Tuple[List[Buffer], int]:
    """A protobuf message serialized, as the pieces and size the gRPC server sends."""
    data: bytes = message.SerializeToString()
    return [data], len(data)


def infer_response_parts(response: EncodedResponse) -> Tuple[List[Buffer], int]:
    """The serialized pieces of a ModelInferResponse and their total length; outputs are not copied."""
    head: bytes = response.message.SerializeToString()
    parts: List[Buffer] = [head]
    size = len(head)
    for raw in response.raw_outputs:
        length = raw.nbytes if isinstance(raw, memoryview) else len(raw)
        prefix = _RAW_OUTPUT_KEY + _encode_varint(length)
        parts += (prefix, raw)
        size += len(prefix) + length
    return parts, size


def stream_response_parts(item: Any) -> Tuple[List[Buffer], int]:
    """A ModelStreamInferResponse's pieces: a response (EncodedResponse) or an error message."""
    if not isinstance(item, EncodedResponse):
        return message_parts(item)
    parts, size = infer_response_parts(item)
    prefix = _STREAM_INFER_RESPONSE_KEY + _encode_varint(size)
    return [prefix, *parts], len(prefix) + size
