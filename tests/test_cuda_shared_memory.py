"""Triton's CUDA shared-memory extension over HTTP and gRPC: Triton's answers where CUDA cannot be used, and the
registry's rules (names, bounds, copies) over a stand-in for the CUDA driver whose "device memory" is host memory.

The real driver is exercised on a GPU machine by tests/test_gpu.py (`pytest -m gpu`), with tritonclient's own
cuda_shared_memory helpers in another process.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.core.errors import InferenceError
from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.core.shared_memory.cuda_runtime import CudaError, CudaRuntime
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url
from tests.http_helpers import request
from tests.test_metrics import _bind_echo

HANDLE = bytes(range(64))
B64 = base64.b64encode(HANDLE).decode()


class HostMemoryDriver:
    """The CUDA calls the registry makes, over "allocations" that are host arrays keyed by their IPC handle."""

    def __init__(self) -> None:
        self.allocations: Dict[bytes, np.ndarray] = {}
        self.opened: Dict[int, bytes] = {}
        self.closed: List[int] = []

    def allocate(self, handle: bytes, byte_size: int) -> np.ndarray:
        memory = self.allocations[handle] = np.zeros(byte_size, dtype=np.uint8)
        return memory

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int:
        if raw_handle not in self.allocations:
            raise CudaError("cudaIpcOpenMemHandle failed: cudaErrorInvalidValue")
        address = self.allocations[raw_handle].ctypes.data
        self.opened[address] = raw_handle
        return address

    def allocation_bytes(self, address: int) -> int:
        return self.allocations[self.opened[address]].nbytes

    def close_ipc(self, address: int, device_id: int) -> None:
        self.closed.append(address)
        del self.opened[address]

    def _view(self, address: int, nbytes: int) -> np.ndarray:
        for opened, handle in self.opened.items():
            memory = self.allocations[handle]
            if opened <= address and address + nbytes <= opened + memory.nbytes:
                return memory[address - opened : address - opened + nbytes]
        raise AssertionError("an access outside every opened allocation")

    def copy_to_host(self, address: int, device_id: int, target: np.ndarray) -> None:
        target[...] = self._view(address, target.nbytes)

    def copy_to_device(self, address: int, device_id: int, source: np.ndarray) -> None:
        self._view(address, source.nbytes)[...] = source


@pytest.fixture
def driver() -> HostMemoryDriver:
    return HostMemoryDriver()


@pytest.fixture
def regions(driver: HostMemoryDriver) -> CudaSharedMemory:
    return CudaSharedMemory(driver)  # type: ignore[arg-type]


def _error(call: Callable[[], Any]) -> Tuple[str, str]:
    with pytest.raises(InferenceError) as raised:
        call()
    return raised.value.status.name, raised.value.message


def test_register_read_write_unregister(regions: CudaSharedMemory, driver: HostMemoryDriver) -> None:
    memory = driver.allocate(HANDLE, 64)
    memory[:16] = np.arange(4, dtype=np.float32).view(np.uint8)
    regions.register("input", HANDLE, 0, 64)
    assert [(r.name, r.device_id, r.byte_size) for r in regions.status()] == [("input", 0, 64)]
    assert regions.read("input", 0, 16).view(np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
    regions.write("input", 32, np.array([7, 8], dtype=np.int64))
    assert memory[32:48].view(np.int64).tolist() == [7, 8]
    assert regions.read("input", 60, 0).size == 0
    regions.unregister("input")
    assert regions.status() == [] and len(driver.closed) == 1


def test_registration_errors_are_triton_s(regions: CudaSharedMemory, driver: HostMemoryDriver) -> None:
    driver.allocate(HANDLE, 64)
    assert _error(lambda: regions.register("", HANDLE, 0, 8))[0] == "INVALID_ARGUMENT"
    assert _error(lambda: regions.register("r", HANDLE[:10], 0, 8)) == (  # gRPC's bytes: no handle CUDA can open
        "INVALID_ARGUMENT",
        "failed to register shared memory region: invalid args",
    )
    assert _error(lambda: regions.register("r", bytes(64), 0, 8)) == (
        "INVALID_ARGUMENT",
        "failed to register shared memory region: invalid args",
    )
    assert _error(lambda: regions.register("r", HANDLE, 0, 65)) == (
        "INVALID_ARGUMENT",
        "failed to register shared memory region 'r': invalid args",
    )
    assert not driver.opened  # the handle opened for the oversized region was closed again
    regions.register("r", HANDLE, 0, 64)
    assert _error(lambda: regions.register("r", HANDLE, 0, 8)) == (
        "ALREADY_EXISTS",
        "shared memory region 'r' already in manager",
    )
    assert _error(lambda: regions.status("nope")) == ("NOT_FOUND", "Unable to find cuda shared memory region: 'nope'")


def test_accesses_stay_inside_the_region(regions: CudaSharedMemory, driver: HostMemoryDriver) -> None:
    driver.allocate(HANDLE, 64)
    regions.register("r", HANDLE, 0, 32)  # a region may be smaller than its allocation
    assert _error(lambda: regions.read("other", 0, 4)) == ("NOT_FOUND", "Unable to find shared memory region: 'other'")
    assert _error(lambda: regions.read("r", 32, 1))[1] == "Invalid offset for shared memory region: 'r'"
    assert _error(lambda: regions.read("r", 30, 4))[1] == "Invalid offset + byte size for shared memory region: 'r'"
    assert _error(lambda: regions.write("r", 24, np.zeros(2, np.float64)))[0] == "INVALID_ARGUMENT"


def test_unregister_all_and_unknown_names(regions: CudaSharedMemory, driver: HostMemoryDriver) -> None:
    second = bytes(reversed(HANDLE))
    driver.allocate(HANDLE, 8)
    driver.allocate(second, 8)
    regions.register("a", HANDLE, 0, 8)
    regions.register("b", second, 0, 8)
    regions.unregister("unknown")  # not an error, as in Triton
    assert len(regions.status()) == 2
    regions.unregister()
    assert regions.status() == [] and not driver.opened


def test_status_lists_regions_by_name(regions: CudaSharedMemory, driver: HostMemoryDriver) -> None:
    # Triton keeps system and CUDA regions in one manager and lists them by name (measured for system regions).
    for index, name in enumerate(["m", "z", "a", "B"]):
        handle = bytes([index]) * 64
        driver.allocate(handle, 64)
        regions.register(name, handle, 0, 64)
    assert [region.name for region in regions.status()] == ["B", "a", "m", "z"]
    regions.unregister("")


def test_without_cuda_registration_says_gpus_are_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CudaRuntime, "load", classmethod(lambda cls: None))
    regions = CudaSharedMemory()
    assert _error(lambda: regions.register("r", HANDLE, 0, 8)) == (
        "INVALID_ARGUMENT",
        "failed to register CUDA shared memory region: 'r', GPUs not supported",
    )
    assert regions.status() == []
    regions.unregister()


def test_cuda_runtime_is_none_without_cuda_python_or_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each means "GPUs not supported" (the tests below); a GPU machine's runtime has both, so each is made here.
    from cuda.bindings import runtime

    no_device = (runtime.cudaError_t.cudaErrorNoDevice, 0)
    too_old = (runtime.cudaError_t.cudaErrorInsufficientDriver, None)  # CI's machine: a library but no driver
    for answer in (no_device, too_old):
        monkeypatch.setattr(runtime, "cudaGetDeviceCount", lambda answer=answer: answer)
        assert CudaRuntime.load() is None

    def unloadable() -> Tuple[Any, int]:
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(runtime, "cudaGetDeviceCount", unloadable)
    assert CudaRuntime.load() is None
    monkeypatch.setattr(runtime, "cudaGetDeviceCount", lambda: (runtime.cudaError_t.cudaSuccess, 1))
    assert CudaRuntime.load() is not None  # the test can fail
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # cuda-python not installed: its import fails
    assert CudaRuntime.load() is None


@pytest.fixture
def server(start_triton: Callable[..., Triton]) -> Triton:
    return start_triton(_bind_echo)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA device, on a GPU machine too (the runtime is loaded at the first registration)."""
    monkeypatch.setattr(CudaRuntime, "load", classmethod(lambda cls: None))


@pytest.fixture
def with_driver(monkeypatch: pytest.MonkeyPatch, driver: HostMemoryDriver) -> Iterator[HostMemoryDriver]:
    monkeypatch.setattr(CudaRuntime, "load", classmethod(lambda cls: driver))
    yield driver


def _http(server: Triton, method: str, path: str, body: Optional[Any] = None) -> Tuple[int, Any]:
    assert server.http_port is not None
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    status, _headers, answer = request(server.http_port, method, path, data if method == "POST" else None, HTTP_AUTH)
    return status, json.loads(answer) if answer else None


_NO_RAW_HANDLE = {"error": "Shared memory register request has no 'raw_handle' field"}
_NOT_STRING = {"error": "attempt to access JSON non-string as string"}


def _no_member(name: str) -> Dict[str, str]:
    """TritonJson's refusal of a member that is not there."""
    return {"error": f"attempt to access non-existing object member '{name}'"}


NO_GPU_HTTP = [
    ("GET", "/v2/cudasharedmemory/status", None, 200, []),
    (
        "GET",
        "/v2/cudasharedmemory/region/r/status",
        None,
        404,
        {"error": "Unable to find cuda shared memory region: 'r'"},
    ),
    (
        "POST",
        "/v2/cudasharedmemory/region/r/register",
        {"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": 16},
        400,
        {"error": "failed to register CUDA shared memory region: 'r', GPUs not supported"},
    ),
    (
        "POST",
        "/v2/cudasharedmemory/region/r/register",
        {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16},
        400,
        {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"},
    ),
    (
        "POST",
        "/v2/cudasharedmemory/region/r/register",
        {"device_id": 0, "byte_size": 16},
        400,
        {"error": "Shared memory register request has no 'raw_handle' field"},
    ),
    ("POST", "/v2/cudasharedmemory/region/r/register", b"{not json", 400, None),
    # tritonserver 2.51 (GPU build, probed) reads the fields with TritonJson: a body that is no object has none,
    # a missing member or one of the wrong type in its words (its 500 a 400 here, the client's mistake).
    ("POST", "/v2/cudasharedmemory/region/r/register", [1], 400, _NO_RAW_HANDLE),
    ("POST", "/v2/cudasharedmemory/region/r/register", {"raw_handle": 5}, 400, _no_member("b64")),
    ("POST", "/v2/cudasharedmemory/region/r/register", {"raw_handle": {}}, 400, _no_member("b64")),
    ("POST", "/v2/cudasharedmemory/region/r/register", {"raw_handle": {"b64": 5}}, 400, _NOT_STRING),
    ("POST", "/v2/cudasharedmemory/region/r/register", {"raw_handle": {"b64": "AAAA"}}, 400, _no_member("byte_size")),
    (
        "POST",
        "/v2/cudasharedmemory/region/r/register",
        {"raw_handle": {"b64": "AAAA"}, "byte_size": 8},
        400,
        _no_member("device_id"),
    ),
    (
        "POST",
        "/v2/cudasharedmemory/region/r/register",
        {"raw_handle": {"b64": "AAAA"}, "byte_size": "8", "device_id": 0},
        400,
        {"error": "attempt to access JSON non-unsigned-integer as unsigned-integer"},
    ),
    ("POST", "/v2/cudasharedmemory/region/r/unregister", None, 200, None),
    ("POST", "/v2/cudasharedmemory/unregister", None, 200, None),
    ("GET", "/v2/cudasharedmemory/region/r/register", None, 405, {"error": "Method Not Allowed"}),
    ("POST", "/v2/cudasharedmemory/status", None, 405, {"error": "Method Not Allowed"}),
    ("GET", "/v2/cudasharedmemory/region/r/bogus", None, 404, {"error": "Not Found"}),
    ("GET", "/v2/cudasharedmemory/region//status", None, 404, {"error": "Not Found"}),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "answer"), NO_GPU_HTTP)
def test_http_without_cuda_answers_as_triton(
    server: Triton, no_cuda: None, method: str, path: str, body: Any, status: int, answer: Any
) -> None:
    got_status, got = _http(server, method, path, body)
    assert got_status == status
    if answer is not None:
        assert got == answer
    elif status >= 400:
        assert "error" in got


def test_grpc_without_cuda_answers_as_triton(server: Triton, no_cuda: None) -> None:
    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        assert client.get_cuda_shared_memory_status(as_json=True, headers=GRPC_AUTH) == {}
        with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region: 'r'") as found:
            client.get_cuda_shared_memory_status("r", headers=GRPC_AUTH)
        assert found.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException, match="'r', GPUs not supported") as refused:
            client.register_cuda_shared_memory(
                "r", B64, 0, 16, headers=GRPC_AUTH
            )  # tritonclient takes the handle base64-encoded
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        # nvidia-pytriton 0.7.0 (its Triton built with GPUs, on a machine without one): any raw_handle, 7 bytes of
        # garbage too, INVALID_ARGUMENT "failed to register shared memory region: invalid args"; built without GPUs it
        # answers "GPUs not supported" whatever the handle (this server answered HTTP's "'raw_handle' must be a valid
        # base64 encoded cudaIpcMemHandle_t", though gRPC carries the handle's bytes)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url(server)))
        garbage = service_pb2.CudaSharedMemoryRegisterRequest(name="r", raw_handle=b"garbage", byte_size=16)
        with pytest.raises(grpc.RpcError) as garbled:
            stub.CudaSharedMemoryRegister(garbage, metadata=list(GRPC_AUTH.items()), timeout=10)
        assert (garbled.value.code(), garbled.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "failed to register CUDA shared memory region: 'r', GPUs not supported",
        )
        client.unregister_cuda_shared_memory("r", headers=GRPC_AUTH)
        client.unregister_cuda_shared_memory(headers=GRPC_AUTH)


def test_http_register_status_unregister(server: Triton, with_driver: HostMemoryDriver) -> None:
    with_driver.allocate(HANDLE, 128)
    body = {"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": 100}
    assert _http(server, "POST", "/v2/cudasharedmemory/region/in/register", body) == (200, None)
    listed = [{"name": "in", "device_id": 0, "byte_size": 100}]
    assert _http(server, "GET", "/v2/cudasharedmemory/status") == (200, listed)
    assert _http(server, "GET", "/v2/cudasharedmemory/region/in/status") == (200, listed)
    conflict = _http(server, "POST", "/v2/cudasharedmemory/region/in/register", body)
    # nvidia-pytriton 0.7 (tritonserver 2.51) answers a second registration of a name with 400, in its one
    # shared-memory manager for system and CUDA regions (measured for system shared memory)
    assert conflict == (400, {"error": "shared memory region 'in' already in manager"})
    assert _http(server, "POST", "/v2/cudasharedmemory/region/in/unregister") == (200, None)
    assert _http(server, "GET", "/v2/cudasharedmemory/status") == (200, [])
    assert not with_driver.opened


def test_grpc_register_status_unregister(server: Triton, with_driver: HostMemoryDriver) -> None:
    with_driver.allocate(HANDLE, 128)
    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        client.register_cuda_shared_memory("out", B64, 0, 64, headers=GRPC_AUTH)
        status = client.get_cuda_shared_memory_status(as_json=True, headers=GRPC_AUTH)
        assert status == {"regions": {"out": {"name": "out", "byte_size": "64"}}}  # proto3 JSON drops device_id 0
        with pytest.raises(InferenceServerException, match="already in manager") as conflict:
            client.register_cuda_shared_memory("out", B64, 0, 64, headers=GRPC_AUTH)
        assert conflict.value.status() == "StatusCode.ALREADY_EXISTS"
        client.unregister_cuda_shared_memory(headers=GRPC_AUTH)
        assert client.get_cuda_shared_memory_status(as_json=True, headers=GRPC_AUTH) == {}


def test_regions_are_unmapped_when_the_server_stops(
    start_triton: Callable[..., Triton], driver: HostMemoryDriver
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CudaRuntime, "load", classmethod(lambda cls: driver))
        server = start_triton(_bind_echo)
        driver.allocate(HANDLE, 8)
        body = {"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": 8}
        assert _http(server, "POST", "/v2/cudasharedmemory/region/r/register", body)[0] == 200
        server.stop()
    assert driver.opened == {} and len(driver.closed) == 1
