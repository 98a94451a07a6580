"""Triton's CUDA shared-memory regions: device buffers of other processes on this host, registered by IPC handle.

A client (tritonclient.utils.cuda_shared_memory) allocates device memory, sends its cudaIpcMemHandle_t, and then
names the region, an offset and a size instead of sending tensor bytes. Where CUDA cannot be used (no cuda-python,
no device) the registry still answers status (no regions) and unregister (nothing to do), and refuses to register
as Triton built without GPU support does. Messages and statuses are Triton's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Dict, List, Optional

import numpy as np

from pytriton.core.errors import InferenceError, Status
from pytriton.core.shared_memory.cuda_runtime import IPC_HANDLE_BYTES, CudaError, CudaRuntime

LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CudaRegion:
    """One registered region: where the other process's allocation is mapped in this one."""

    name: str
    device_id: int
    byte_size: int
    address: int


class CudaSharedMemory:
    """The CUDA regions registered with one server.

    register, unregister, read and write call CUDA and block: run them off the event loop. status does not.
    """

    def __init__(self, runtime: Optional[CudaRuntime] = None) -> None:
        """No regions; CUDA is loaded at the first registration (or `runtime` is used)."""
        self._runtime = runtime
        self._loaded = runtime is not None
        self._regions: Dict[str, CudaRegion] = {}
        self._lock = threading.Lock()

    def status(self, name: str = "") -> List[CudaRegion]:
        """Every region, by name as Triton lists them, or the one named (NOT_FOUND when it is not registered)."""
        with self._lock:
            if not name:
                return [self._regions[key] for key in sorted(self._regions)]
            region = self._regions.get(name)
        if region is None:
            raise InferenceError.not_found(f"Unable to find cuda shared memory region: '{name}'")
        return [region]

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open a client's allocation by its IPC handle and register it under `name`."""
        if not name:
            raise InferenceError.invalid("'region name' is necessary to register cuda shared memory region")
        runtime = self._cuda()
        if runtime is None:
            raise InferenceError.invalid(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")
        if len(raw_handle) != IPC_HANDLE_BYTES:  # no handle CUDA could open: Triton's gRPC answer (HTTP's codec refuses
            # such a handle first, in its words)
            raise InferenceError.invalid("failed to register shared memory region: invalid args")
        with self._lock:  # held across the CUDA calls: two registrations of one name must not both open it
            if name in self._regions:
                raise InferenceError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
            try:
                address = runtime.open_ipc(raw_handle, device_id)
            except CudaError as error:
                LOGGER.info("failed to open the CUDA IPC handle of region '%s': %s", name, error)
                raise InferenceError.invalid("failed to register shared memory region: invalid args") from None
            try:
                allocated = runtime.allocation_bytes(address)
            except CudaError as error:
                LOGGER.info("failed to size the CUDA allocation of region '%s': %s", name, error)
                allocated = -1
            if byte_size > allocated:
                runtime.close_ipc(address, device_id)
                raise InferenceError.invalid(f"failed to register shared memory region '{name}': invalid args")
            self._regions[name] = CudaRegion(name, device_id, byte_size, address)

    def unregister(self, name: str = "") -> None:
        """Unregister one region, or all of them; an unknown name is not an error (as in Triton)."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(key) for key in names if key in self._regions]
            for region in regions:
                self._close(region)

    def read(self, name: str, offset: int, byte_size: int) -> np.ndarray:
        """A host copy of `byte_size` bytes of a region from `offset` (a uint8 array)."""
        region = self._region(name, offset, byte_size)
        host = np.empty(byte_size, dtype=np.uint8)
        if byte_size:
            self._copy_runtime().copy_to_host(region.address + offset, region.device_id, host)
        return host

    def write(self, name: str, offset: int, data: np.ndarray) -> None:
        """Copy a host array's bytes into a region from `offset`."""
        source = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        region = self._region(name, offset, source.nbytes)
        if source.nbytes:
            self._copy_runtime().copy_to_device(region.address + offset, region.device_id, source)

    def _region(self, name: str, offset: int, byte_size: int) -> CudaRegion:
        """A registered region that holds `byte_size` bytes from `offset`, with Triton's errors."""
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise InferenceError.not_found(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or offset >= region.byte_size:
            raise InferenceError.invalid(f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise InferenceError.invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def _cuda(self) -> Optional[CudaRuntime]:
        """The CUDA runtime, loaded once (None without CUDA)."""
        if not self._loaded:
            self._runtime = CudaRuntime.load()
            self._loaded = True
        return self._runtime

    def _copy_runtime(self) -> CudaRuntime:
        """The runtime a registered region was opened with."""
        assert self._runtime is not None  # a region exists only where CUDA was loaded
        return self._runtime

    def _close(self, region: CudaRegion) -> None:
        """Unmap a region; a failure is Triton's INTERNAL error."""
        try:
            self._copy_runtime().close_ipc(region.address, region.device_id)
        except CudaError as error:
            raise InferenceError.internal(f"failed to close CUDA IPC handle: {error}") from None
