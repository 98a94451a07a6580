"""Peak server memory while serving one large request: the `memory` pseudo-workload.

For each target, protocol and tensor size (1, 8 and 32 MiB of FP32 through the identity model), a fresh
server is started, answers one small request (so that what a first request loads is loaded), and then
one large request from tritonclient with binary tensors. The figure is the peak RSS of the server's
process tree during that request (VmHWM, reset with /proc/PID/clear_refs just before) minus its RSS just
before: what serving the request cost in memory, against the tensor's own size. A fresh server for each
size, because memory a process freed may stay in its heap and hide the next request's cost.
"""

from __future__ import annotations

import pathlib
import time
from typing import Dict, List, Optional

import numpy as np

from bench.servers import ServerProcess, Target, descendants, proc_kib

SIZES_MIB = (1, 8, 32)
PROTOCOLS = ("http", "grpc")


def _tree(pid: int) -> List[int]:
    return [pid, *descendants(pid)]


def _reset_peaks(pids: List[int]) -> None:
    for pid in pids:
        try:
            pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            pass


def _infer(server: ServerProcess, protocol: str, array: np.ndarray) -> None:
    """One identity request with binary tensors; raises when the answer is wrong."""
    if protocol == "http":
        import tritonclient.http as client

        with client.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=120.0) as http:
            tensor = client.InferInput("INPUT_1", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            output = client.InferRequestedOutput("OUTPUT_1", binary_data=True)
            result = http.infer("identity", [tensor], outputs=[output]).as_numpy("OUTPUT_1")
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]

        grpc = client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            tensor = client.InferInput("INPUT_1", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            result = grpc.infer("identity", [tensor], client_timeout=120.0).as_numpy("OUTPUT_1")
        finally:
            grpc.close()
    if result is None or not np.array_equal(result, array):
        raise RuntimeError(f"{protocol}: wrong output for a {array.nbytes >> 20} MiB tensor")


def peak_over_idle(
    target: Target, protocol: str, mib: int, cpus: Optional[str], log_dir: pathlib.Path, timeout: float
) -> Dict[str, float]:
    """Start `target`, serve one `mib` MiB request over `protocol`; its peak RSS over idle, in MiB and x the tensor."""
    server = ServerProcess(target, cpus, log_dir)
    try:
        server.wait_ready(timeout)
        _infer(server, protocol, np.ones((1, 16), np.float32))
        time.sleep(0.2)
        pids = _tree(server.proc.pid)
        idle_kib = sum(proc_kib(pid, "status", "VmRSS:") for pid in pids)
        _reset_peaks(pids)
        array = ((np.arange(mib * 2**18, dtype=np.float32) % 1024) * 0.25).reshape(1, -1)
        _infer(server, protocol, array)
        peak_kib = sum(proc_kib(pid, "status", "VmHWM:") for pid in pids)
    finally:
        server.stop()
    grown = max(peak_kib - idle_kib, 0) / 1024
    return {"peak_over_idle_mib": grown, "x_tensor": grown / mib, "idle_mib": idle_kib / 1024}
