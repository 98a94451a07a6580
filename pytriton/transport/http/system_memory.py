"""HTTP routes of Triton's system shared-memory extension, under /v2/systemsharedmemory."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from pytriton.core.errors import InferenceError
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.protocol.http_codec import Body, parse_json_object
from pytriton.protocol.system_memory_codec import status_document, unsigned
from pytriton.transport.http.cuda_memory import match, method_of

__all__ = ["answer", "match", "method_of"]  # the paths are the CUDA extension's: one matcher for both


def answer(regions: SystemSharedMemory, action: str, name: str, body: Body) -> Optional[Any]:
    """Carry out an action; the status document, or None for an empty 200."""
    if action == "status":
        return status_document(regions.status(name))
    if action == "register":
        regions.register(name, *_register_request(body))
    else:
        regions.unregister(name)
    return None


def _register_request(body: Body) -> Tuple[str, int, int]:
    """(key, offset, byte size) of a POST .../register body: `{"key": ..., "offset": ..., "byte_size": ...}`."""
    document = parse_json_object(body)
    key = document.get("key")
    if not isinstance(key, str):
        raise InferenceError.invalid("Shared memory register request has no 'key' field")
    byte_size = document.get("byte_size")
    if byte_size is None:
        raise InferenceError.invalid("Shared memory register request has no 'byte_size' field")
    return key, unsigned("offset", document.get("offset", 0)), unsigned("byte_size", byte_size)
