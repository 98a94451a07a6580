"""Large system shared-memory inputs and outputs are copied in a worker thread, not on the event loop.

The copiers' pool is replaced by a gated one: a large request's copy waits at the gate while other clients'
small requests are answered, which a copy done on the loop (before the gate could even be reached) would not
allow. No timing: the order of answers is what is asserted.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from pytriton.core.shared_memory import off_loop
from pytriton.core.shared_memory.system import OFF_LOOP_BYTES
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.gated_threads import GatedThreads, gated_pool
from tests.test_system_shared_memory import Segment

CLIENTS = {"http": httpclient, "grpc": grpcclient}
AUTH = {"http": HTTP_AUTH, "grpc": GRPC_AUTH}
# Elements of a large tensor: FP32, twice the size copied off the loop (16 MiB).
LARGE = 2 * OFF_LOOP_BYTES // 4


def _total(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"total": np.array([item["x"].astype(np.float64).sum()])} for item in requests]


def _fill(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": np.full(LARGE, item["v"][0], dtype=np.float32)} for item in requests]


def _bind(triton: Triton) -> None:
    config = ModelConfig(batching=False)
    triton.bind(
        "total",
        _total,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="total", dtype=np.float64, shape=(1,))],
        config=config,
    )
    triton.bind(
        "fill",
        _fill,
        inputs=[Tensor(name="v", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(LARGE,))],
        config=config,
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False) as server:
        yield server


@pytest.fixture
def segment() -> Iterator[Segment]:
    made = Segment(LARGE * 4)
    yield made
    made.destroy()


@pytest.fixture
def copiers(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedThreads]:
    yield from gated_pool(monkeypatch, off_loop, "COPIERS")


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _client(triton: Triton, protocol: str) -> Any:
    url = http_url(triton) if protocol == "http" else grpc_url(triton)
    return CLIENTS[protocol].InferenceServerClient(url)


def _infer(triton: Triton, protocol: str, model: str, inputs: List[Any], outputs: Optional[List[Any]]) -> Any:
    """An inference by a client of its own (tritonclient.http's serves the thread that made it only)."""
    client = _client(triton, protocol)
    try:
        return client.infer(model, inputs, outputs=outputs)
    finally:
        client.close()


def _small_total(triton: Triton, protocol: str) -> float:
    """Another client's small request, its data in the request."""
    lib = CLIENTS[protocol]
    client = _client(triton, protocol)
    try:
        tensor = lib.InferInput("x", [3], "FP32")
        tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        return float(client.infer("total", [tensor]).as_numpy("total")[0])
    finally:
        client.close()


def test_a_large_input_is_read_while_other_clients_are_answered_and_its_region_unregistered(
    triton: Triton, protocol: str, segment: Segment, copiers: GatedThreads
) -> None:
    lib, auth = CLIENTS[protocol], AUTH[protocol]
    shm.set_shared_memory_region(segment.handle, [np.full(LARGE, 0.5, dtype=np.float32)])
    client = _client(triton, protocol)
    try:
        client.register_system_shared_memory("large", segment.key, LARGE * 4, headers=auth)
        tensor = lib.InferInput("x", [LARGE], "FP32")
        tensor.set_shared_memory("large", LARGE * 4)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            large = pool.submit(_infer, triton, protocol, "total", [tensor], None)
            assert copiers.submitted.wait(30), "the large input was not left to a worker thread"
            assert [_small_total(triton, protocol) for _ in range(3)] == [6.0, 6.0, 6.0]
            assert not large.done()  # its read waits at the gate: answered after the small ones
            # Unregistered while read: the read goes on through its own descriptor, the file as registered.
            client.unregister_system_shared_memory("large", headers=auth)
            assert "large" not in _regions(client.get_system_shared_memory_status(headers=auth))
            copiers.gate.set()
            assert large.result(60).as_numpy("total")[0] == LARGE * 0.5
    finally:
        client.unregister_system_shared_memory(headers=auth)
        client.close()


def _regions(status: Any) -> List[str]:
    """The region names of a status answer (HTTP: a list of objects; gRPC: a message)."""
    return [entry["name"] for entry in status] if isinstance(status, list) else list(status.regions)


def test_a_large_output_is_written_while_other_clients_are_answered_and_its_region_stays_registered(
    triton: Triton, protocol: str, segment: Segment, copiers: GatedThreads
) -> None:
    lib, auth = CLIENTS[protocol], AUTH[protocol]
    client = _client(triton, protocol)
    try:
        client.register_system_shared_memory("large", segment.key, LARGE * 4, headers=auth)
        tensor = lib.InferInput("v", [1], "FP32")
        tensor.set_data_from_numpy(np.array([7], dtype=np.float32))
        output = lib.InferRequestedOutput("y")
        output.set_shared_memory("large", LARGE * 4)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            large = pool.submit(_infer, triton, protocol, "fill", [tensor], [output])
            assert copiers.submitted.wait(30), "the large output was not left to a worker thread"
            assert [_small_total(triton, protocol) for _ in range(3)] == [6.0, 6.0, 6.0]
            assert not large.done()
            # Held while it is written, as before and as Triton keeps it: refused in Triton's words.
            with pytest.raises(InferenceServerException, match="it is currently in use"):
                client.unregister_system_shared_memory("large", headers=auth)
            copiers.gate.set()
            large.result(60)
        written = shm.get_contents_as_numpy(segment.handle, np.float32, [LARGE])
        assert (written == 7).all()
    finally:
        client.unregister_system_shared_memory(headers=auth)
        client.close()


def test_a_large_input_of_a_shrunk_segment_is_refused_in_the_same_words(
    triton: Triton, protocol: str, segment: Segment
) -> None:
    lib, auth = CLIENTS[protocol], AUTH[protocol]
    client = _client(triton, protocol)
    try:
        client.register_system_shared_memory("large", segment.key, LARGE * 4, headers=auth)
        fd = os.open(f"/dev/shm{segment.key}", os.O_RDWR)
        try:
            os.ftruncate(fd, 8)
        finally:
            os.close(fd)
        tensor = lib.InferInput("x", [LARGE], "FP32")
        tensor.set_shared_memory("large", LARGE * 4)
        for _ in range(2):  # the second through the request's plan
            with pytest.raises(
                InferenceServerException,
                match="shared memory region 'large' is smaller than when it was registered: unregister it",
            ):
                client.infer("total", [tensor])
        assert _small_total(triton, protocol) == 6.0
    finally:
        client.unregister_system_shared_memory(headers=auth)
        client.close()


def test_a_large_input_and_output_in_a_stream_are_copied_off_the_loop(
    triton: Triton, segment: Segment, copiers: GatedThreads
) -> None:
    """ModelStreamInfer: the read waits at the gate while other clients are answered, then the write does."""
    answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    shm.set_shared_memory_region(segment.handle, [np.full(LARGE, 0.5, dtype=np.float32)])
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    out = Segment(LARGE * 4)
    try:
        client.register_system_shared_memory("large", segment.key, LARGE * 4, headers=GRPC_AUTH)
        client.register_system_shared_memory("out", out.key, LARGE * 4, headers=GRPC_AUTH)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("x", [LARGE], "FP32")
        tensor.set_shared_memory("large", LARGE * 4)
        client.async_stream_infer("total", [tensor], request_id="read")
        assert copiers.submitted.wait(30), "the large input was not left to a worker thread"
        assert [_small_total(triton, "grpc") for _ in range(3)] == [6.0, 6.0, 6.0]
        assert answers.empty()
        copiers.gate.set()
        result, error = answers.get(timeout=60)
        assert error is None and result.as_numpy("total")[0] == LARGE * 0.5
        copiers.gate.clear()
        copiers.submitted.clear()
        value = grpcclient.InferInput("v", [1], "FP32")
        value.set_data_from_numpy(np.array([3], dtype=np.float32))
        output = grpcclient.InferRequestedOutput("y")
        output.set_shared_memory("out", LARGE * 4)
        client.async_stream_infer("fill", [value], outputs=[output], request_id="write")
        assert copiers.submitted.wait(30), "the large output was not left to a worker thread"
        assert _small_total(triton, "grpc") == 6.0
        assert answers.empty()
        copiers.gate.set()
        result, error = answers.get(timeout=60)
        assert error is None and result.get_response().id == "write"
        assert (shm.get_contents_as_numpy(out.handle, np.float32, [LARGE]) == 3).all()
    finally:
        client.stop_stream()
        client.unregister_system_shared_memory(headers=GRPC_AUTH)
        client.close()
        out.destroy()
