"""Messages of Triton's CUDA shared-memory extension: the HTTP register body, status as JSON and as gRPC."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Sequence, Tuple, Union

from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError, json_type_error, json_uint
from pytriton.core.shared_memory.cuda import CudaRegion
from pytriton.core.shared_memory.cuda_runtime import IPC_HANDLE_BYTES
from pytriton.protocol.http_codec import parse_json_members


def register_request(body: Union[bytes, bytearray, memoryview]) -> Tuple[bytes, int, int]:
    """(raw handle, device id, byte size) of a POST .../register body: `{"raw_handle": {"b64": ...}, ...}`.

    Read as tritonserver 2.51's HTTP frontend reads it (built with GPU support), field by field with TritonJson:
    no `raw_handle`, then `raw_handle.b64`, `byte_size` and `device_id` missing or of the wrong type, in its words
    (`attempt to access non-existing object member 'b64'`; 400 here, its 500s there); then the handle's base64
    and size are checked.
    A body that is no JSON object has no fields.
    """
    document = parse_json_members(body)
    if "raw_handle" not in document:
        raise InferenceError.invalid("Shared memory register request has no 'raw_handle' field")
    raw_handle = document["raw_handle"]
    encoded = _member(raw_handle, "b64")
    if not isinstance(encoded, str):
        raise json_type_error("non-string as string")
    byte_size = json_uint(_member(document, "byte_size"))
    device_id = json_uint(_member(document, "device_id"))
    try:
        handle = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InferenceError.invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
    if len(handle) != IPC_HANDLE_BYTES:  # Triton's HTTP frontend checks the decoded size as it parses
        raise InferenceError.invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return handle, device_id, byte_size


def _member(value: Any, name: str) -> Any:
    """An object's member as TritonJson's `MemberAs...` finds it; its words where there is none (400; 500 there)."""
    if not isinstance(value, dict) or name not in value:
        raise InferenceError.invalid(f"attempt to access non-existing object member '{name}'")
    return value[name]


def status_document(regions: Sequence[CudaRegion]) -> List[Dict[str, Any]]:
    """GET .../status: one object per region."""
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]


def status_message(regions: Sequence[CudaRegion]) -> Any:
    """CudaSharedMemoryStatus's response: regions by name."""
    response = service_pb2.CudaSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.device_id, status.byte_size = region.name, region.device_id, region.byte_size
    return response
