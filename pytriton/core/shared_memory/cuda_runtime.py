"""The few CUDA calls that CUDA shared memory needs, through NVIDIA's cuda-python (`cuda.bindings`), as tritonclient.

Every call blocks (the driver): call them off the event loop. `load()` is None where cuda-python is not installed
or no CUDA device can be used, which is how the server learns that it cannot serve CUDA shared memory.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Optional

import numpy as np

LOGGER = logging.getLogger(__name__)

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaError(Exception):
    """A CUDA call failed; the message names the call and CUDA's error."""


class CudaRuntime:
    """CUDA runtime and driver calls on the device a region lives on (each call selects it: any thread may call)."""

    def __init__(self, runtime: Any, driver: Any) -> None:
        """Wrap the `cuda.bindings.runtime` and `cuda.bindings.driver` modules."""
        self._runtime = runtime
        self._driver = driver
        self._lazy_peer_access = getattr(runtime, "cudaIpcMemLazyEnablePeerAccess", 1)

    @classmethod
    def load(cls) -> Optional[CudaRuntime]:
        """The runtime where cuda-python is installed and a CUDA device is visible, else None."""
        try:
            from cuda.bindings import driver, runtime  # an optional extra: pytriton[gpu]
        except ImportError:
            LOGGER.debug("CUDA shared memory is not served: cuda-python is not installed (the gpu extra)")
            return None
        try:
            error, count = runtime.cudaGetDeviceCount()
        except Exception as failure:  # noqa: BLE001  (a driver library that cannot be loaded, in some versions)
            error, count = failure, 0
        if error != runtime.cudaError_t.cudaSuccess or not count:
            LOGGER.debug("CUDA shared memory is not served: no CUDA device (%s)", error)
            return None
        return cls(runtime, driver)

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int:
        """Map another process's allocation into this one; its device address."""
        self._call("cudaSetDevice", device_id)
        handle = self._runtime.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_BYTES)  # the 64 bytes tritonclient sent
        return int(self._call("cudaIpcOpenMemHandle", handle, self._lazy_peer_access))

    def allocation_bytes(self, address: int) -> int:
        """Size of the allocation that starts at `address` (cuMemGetAddressRange)."""
        error, _base, size = self._driver.cuMemGetAddressRange(address)
        if error != self._driver.CUresult.CUDA_SUCCESS:
            raise CudaError(f"cuMemGetAddressRange failed: {error}")
        return int(size)

    def close_ipc(self, address: int, device_id: int) -> None:
        """Unmap an allocation opened by `open_ipc`."""
        self._call("cudaSetDevice", device_id)
        self._call("cudaIpcCloseMemHandle", address)

    def copy_to_host(self, address: int, device_id: int, target: np.ndarray) -> None:
        """Copy `target.nbytes` bytes from device memory into a contiguous host array."""
        self._call("cudaSetDevice", device_id)
        kind = self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call("cudaMemcpy", target.ctypes.data, address, target.nbytes, kind)

    def copy_to_device(self, address: int, device_id: int, source: np.ndarray) -> None:
        """Copy a contiguous host array into device memory, done when this returns.

        cudaMemcpy from pageable memory may return once the bytes are staged, before they reach the device: the
        process that owns the region (which reads it as soon as the response says so) saw the old bytes on an
        H200. The default stream is waited for.
        """
        self._call("cudaSetDevice", device_id)
        kind = self._runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call("cudaMemcpy", address, source.ctypes.data, source.nbytes, kind)
        self._call("cudaStreamSynchronize", 0)

    def _call(self, name: str, *args: Any) -> Any:
        """Call a runtime function; its result after the error code, or CudaError."""
        error, *results = getattr(self._runtime, name)(*args)
        if error != self._runtime.cudaError_t.cudaSuccess:
            raise CudaError(f"{name} failed: {error}")
        return results[0] if results else None
