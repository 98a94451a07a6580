"""gRPC infer decodes and encodes of many strings, in a worker thread (transport/codec_threads.py).

A request or answer of a million strings (BYTES) held every other client of the server for 0.3 s when read or
written on the loop; the codec, called there with `place=ON_LOOP`, refuses such a message (OffLoop) and the
caller has it handled here again, off the loop. (The call on the loop stays at the call site: an await more per
request is a cost of every small request.)
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

from pytriton.core.request import InferenceResponse
from pytriton.core.shared_memory.system import Read, SystemSharedMemory, WriteRun
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.protocol import grpc_codec
from pytriton.protocol.grpc_codec import DecodedRequest, EncodedResponse, Message
from pytriton.transport import codec_threads


async def decoded(
    spec: ModelSpec,
    message: Message,
    raw_inputs: Optional[Sequence[Buffer]],
    forwarded: Optional[Mapping[str, str]],
    memory: Optional[SystemSharedMemory],
    data: Optional[bytes],
    deferred: List[Read],
) -> DecodedRequest:
    """`grpc_codec.decode_infer_request` of a request it refused to decode on the loop (OffLoop)."""
    return await codec_threads.off_loop(
        lambda registry, place: grpc_codec.decode_infer_request(
            spec, message, raw_inputs, forwarded, registry, data, deferred, place
        ),
        memory,
    )


async def encoded(
    spec: ModelSpec,
    request_id: str,
    response: InferenceResponse,
    final: Optional[bool],
    decoded: DecodedRequest,
    memory: Optional[SystemSharedMemory],
    writes: List[WriteRun],
) -> EncodedResponse:
    """`grpc_codec.encode_infer_response` of an answer it refused to encode on the loop (OffLoop)."""
    return await codec_threads.off_loop(
        lambda registry, place: grpc_codec.encode_infer_response(
            spec, request_id, response, final, decoded, registry, writes, place
        ),
        memory,
    )
