"""HTTP routes of Triton's system shared-memory extension, under /v2/systemsharedmemory."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from pytriton.core.errors import InferenceError, json_type_error, json_uint
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.protocol.http_codec import Body, parse_json_members
from pytriton.protocol.system_memory_codec import status_document
from pytriton.transport.http.cuda_memory import method_of, unnamed

__all__ = ["answer", "method_of"]  # the methods are the CUDA extension's


def answer(regions: SystemSharedMemory, action: str, name: str, body: Body) -> Optional[Any]:
    """Carry out an action; the status document, or None for an empty 200."""
    if action == "status":
        return status_document(regions.status(name))
    if action == "register":
        unnamed(name, "system")
        regions.register(name, *_register_request(body))
    else:
        regions.unregister(name)
    return None


def _register_request(body: Body) -> Tuple[str, int, int]:
    """(key, offset, byte size) of a POST .../register body: `{"key": ..., "offset": ..., "byte_size": ...}`.

    Read as Triton's HTTP frontend reads it, field by field: a missing `key` or `byte_size`, then a value of the
    wrong JSON type (a `key` that is no string, an `offset` or `byte_size` that is no unsigned integer, null
    included) in TritonJson's words (400 here, Triton's 500).
    """
    document = parse_json_members(body)
    if "key" not in document:
        raise InferenceError.invalid("Shared memory register request has no 'key' field")
    key = document["key"]
    if not isinstance(key, str):
        raise json_type_error("non-string as string")
    offset = json_uint(document["offset"]) if "offset" in document else 0
    if "byte_size" not in document:
        raise InferenceError.invalid("Shared memory register request has no 'byte_size' field")
    return key, offset, json_uint(document["byte_size"])
