"""Messages of Triton's CUDA shared-memory extension: the HTTP register body, status as JSON and as gRPC."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Sequence, Tuple, Union

from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError
from pytriton.core.shared_memory.cuda import CudaRegion
from pytriton.core.shared_memory.cuda_runtime import IPC_HANDLE_BYTES
from pytriton.protocol.http_codec import parse_json_object


def register_request(body: Union[bytes, bytearray, memoryview]) -> Tuple[bytes, int, int]:
    """(raw handle, device id, byte size) of a POST .../register body: `{"raw_handle": {"b64": ...}, ...}`."""
    document = parse_json_object(body)
    raw_handle = document.get("raw_handle")
    if raw_handle is None:
        raise InferenceError.invalid("Shared memory register request has no 'raw_handle' field")
    encoded = raw_handle.get("b64") if isinstance(raw_handle, dict) else None
    if not isinstance(encoded, str):
        raise InferenceError.invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    try:
        handle = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InferenceError.invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
    if len(handle) != IPC_HANDLE_BYTES:  # Triton's HTTP frontend checks the decoded size as it parses
        raise InferenceError.invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return handle, _unsigned(document, "device_id"), _unsigned(document, "byte_size")


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


def _unsigned(document: Dict[str, Any], field: str) -> int:
    """A required non-negative integer field."""
    value = document.get(field)
    if type(value) is not int or value < 0:
        raise InferenceError.invalid(f"Shared memory register request has no valid '{field}' field (unsigned integer)")
    return value
