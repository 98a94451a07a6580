"""On a GPU machine (`pytest -m gpu`, see bench/README.md): NVML metrics, CUDA tensors as outputs, and CUDA shared
memory registered with tritonclient's own cuda_shared_memory helpers from another process.

Deselected by default (pyproject's addopts); selected where no GPU is found, each test fails and says so.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest

from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.decorators import batch
from pytriton.model_config import Tensor
from pytriton.triton import Triton

pytestmark = pytest.mark.gpu

TOKEN = "gpu-tests"
HTTP_TOKEN = {"triton-access-token": TOKEN}
GRPC_TOKEN = {"triton-grpc-protocol-triton-access-token": TOKEN}


@pytest.fixture(scope="module")
def torch() -> Any:
    try:
        import torch
    except ImportError:
        pytest.fail("the GPU tests need torch with CUDA", pytrace=False)
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: run the GPU tests (-m gpu) on a GPU machine", pytrace=False)
    return torch


def test_gpu_metrics_are_read_from_nvml(torch: Any, start_triton: Callable[..., Triton]) -> None:
    import pynvml

    from tests.test_gpu_metrics import GPU_FAMILIES
    from tests.test_metrics import _bind_echo, sample, scrape

    pynvml.nvmlInit()
    uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    families = scrape(start_triton(_bind_echo, metrics_interval_ms=100))
    for name, kind in GPU_FAMILIES.items():
        assert families[name].type == kind
    labelled = sorted(s.labels["gpu_uuid"] for s in families["nv_gpu_utilization"].samples)
    assert labelled == sorted(uuids) if visible is None else set(labelled) <= set(uuids)
    first = labelled[0]
    assert sample(families, "nv_gpu_memory_total_bytes", gpu_uuid=first) > 2**30
    assert 0 < sample(families, "nv_gpu_memory_used_bytes", gpu_uuid=first)
    assert 0.0 <= sample(families, "nv_gpu_utilization", gpu_uuid=first) <= 1.0
    assert sample(families, "nv_gpu_power_usage", gpu_uuid=first) > 0


def test_cuda_tensors_are_served(torch: Any, start_triton: Callable[..., Triton]) -> None:
    import tritonclient.http as httpclient

    from tests.conftest import http_url

    @batch
    def double(x: np.ndarray) -> Dict[str, Any]:
        on_gpu = torch.as_tensor(x, device="cuda")
        return {"y": on_gpu * 2, "half": on_gpu.to(torch.bfloat16)}

    def bind(triton: Triton) -> None:
        outputs = [Tensor(name="y", dtype=np.float32, shape=(-1,)), Tensor(name="half", dtype="bfloat16", shape=(-1,))]
        triton.bind("double", double, [Tensor(name="x", dtype=np.float32, shape=(-1,))], outputs, strict=True)

    server = start_triton(bind)
    with httpclient.InferenceServerClient(http_url(server)) as client:
        request = httpclient.InferInput("x", [2, 3], "FP32")
        request.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        result = client.infer("double", [request])
    assert result.as_numpy("y").tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert result.get_output("half")["datatype"] == "BF16"


SERVER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from bench.model_server import _security_kwargs
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0)
    with Triton(config=config, **_security_kwargs()) as triton:
        vector = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
        echo = lambda requests: [{"x": request["x"]} for request in requests]  # noqa: E731
        triton.bind("echo", echo, vector, vector, config=ModelConfig(max_batch_size=8))
        triton.run()
        print(json.dumps([triton.http_port, triton.grpc_port]), flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture
def server_process(torch: Any) -> Iterator[List[int]]:
    """A server in another process: CUDA IPC handles cannot be opened by the process that made them."""
    env = dict(os.environ, BENCH_ACCESS_TOKEN=TOKEN)
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stdin is not None
    ports = json.loads(process.stdout.readline())
    yield ports
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    process.stdout.close()  # unclosed, it is a ResourceWarning, which the suite's filterwarnings makes an error


def test_cuda_shared_memory_with_tritonclient_helpers(server_process: List[int]) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    http_port, grpc_port = server_process
    region = cudashm.create_shared_memory_region("input", 64, 0)
    try:
        cudashm.set_shared_memory_region(region, [np.arange(16, dtype=np.float32)])
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        with pytest.raises(Exception, match="invalid args"):  # larger than the allocation
            http.register_cuda_shared_memory("too_big", cudashm.get_raw_handle(region), 0, 1 << 30, headers=HTTP_TOKEN)
        http.register_cuda_shared_memory("input", cudashm.get_raw_handle(region), 0, 64, headers=HTTP_TOKEN)
        assert http.get_cuda_shared_memory_status(headers=HTTP_TOKEN) == [
            {"name": "input", "device_id": 0, "byte_size": 64}
        ]
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        listed = grpc.get_cuda_shared_memory_status(headers=GRPC_TOKEN, as_json=True)
        assert listed["regions"]["input"]["byte_size"] == "64"
        with pytest.raises(Exception, match="already in manager"):
            grpc.register_cuda_shared_memory("input", cudashm.get_raw_handle(region), 0, 64, headers=GRPC_TOKEN)
        grpc.unregister_cuda_shared_memory("input", headers=GRPC_TOKEN)
        assert http.get_cuda_shared_memory_status(headers=HTTP_TOKEN) == []
    finally:
        cudashm.destroy_shared_memory_region(region)


OWNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tritonclient.utils.cuda_shared_memory as cudashm

    region = cudashm.create_shared_memory_region("owned", 64, 0)
    cudashm.set_shared_memory_region(region, [np.arange(16, dtype=np.float32)])
    print(cudashm.get_raw_handle(region).decode(), flush=True)
    sys.stdin.readline()  # the test has written into the region
    print(cudashm.get_contents_as_numpy(region, np.float32, [16]).tolist(), flush=True)
    sys.stdin.readline()
    cudashm.destroy_shared_memory_region(region)
    """
)


def test_registered_device_memory_is_read_and_written(torch: Any) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert owner.stdout is not None and owner.stdin is not None
    regions = CudaSharedMemory()
    try:
        raw_handle = base64.b64decode(owner.stdout.readline())
        regions.register("owned", raw_handle, 0, 64)
        assert regions.read("owned", 0, 64).view(np.float32).tolist() == list(range(16))
        regions.write("owned", 16, np.array([-1.0, -2.0], dtype=np.float32))
        owner.stdin.write("written\n")
        seen = json.loads(owner.stdout.readline())
        assert seen == [0.0, 1.0, 2.0, 3.0, -1.0, -2.0, *map(float, range(6, 16))]
        regions.unregister()
    finally:
        owner.stdin.write("done\n")
        owner.stdin.close()
        owner.wait(timeout=60)
        owner.stdout.close()
