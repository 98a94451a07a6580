"""HTTP routes of Triton's CUDA shared-memory extension, under /v2/cudasharedmemory (options/http_routes.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from pytriton.core.errors import InferenceError
from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.protocol.cuda_memory_codec import register_request, status_document
from pytriton.protocol.http_codec import Body


def unnamed(name: str, kind: str) -> None:
    """Refuse a registration without a region name (`kind` "system" or "cuda"), before its body is read, as Triton."""
    if not name:
        raise InferenceError.invalid(f"'region name' is necessary to register {kind} shared memory region")


def method_of(action: str) -> str:
    """The one method an action takes: GET for status, POST otherwise."""
    return "GET" if action == "status" else "POST"


async def answer(regions: CudaSharedMemory, action: str, name: str, body: Body) -> Optional[Any]:
    """Carry out an action; the status document, or None for an empty 200. CUDA calls run off the loop."""
    if action == "status":
        return status_document(regions.status(name))
    loop = asyncio.get_running_loop()
    if action == "register":
        unnamed(name, "cuda")
        raw_handle, device_id, byte_size = register_request(body)
        await loop.run_in_executor(None, regions.register, name, raw_handle, device_id, byte_size)
    else:
        await loop.run_in_executor(None, regions.unregister, name)
    return None
