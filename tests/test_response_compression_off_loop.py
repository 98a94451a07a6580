"""A large infer response asked for compressed is compressed in a worker thread, not on the loop.

HTTP: the client's Accept-Encoding; gRPC: the server's `grpc_infer_response_compression_level` among the
encodings the client accepts (grpc's clients accept gzip and deflate).

The compressors' pool is replaced by a gated one: a large response's compression waits at the gate while other
clients' requests are answered, which a compression done on the loop (before the gate could even be reached)
would not allow. No timing: the order of answers is what is asserted.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client
import json
import queue
import zlib
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.transport import deflate
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.gated_threads import GatedThreads, another_client_answered, gated_pool

# Elements of the large output: its JSON answer is ten times the size compressed off the loop, or more.
LARGE = deflate.OFF_LOOP_BYTES


def _fill(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": np.arange(LARGE, dtype=np.float32) + item["v"][0]} for item in requests]


def _small(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": np.arange(4, dtype=np.float32) + item["v"][0]} for item in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "fill",
        _fill,
        inputs=[Tensor(name="v", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(LARGE,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "small",
        _small,
        inputs=[Tensor(name="v", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(4,))],
        config=ModelConfig(batching=False),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False, grpc_infer_response_compression_level="high") as server:
        yield server


@pytest.fixture
def compressors(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedThreads]:
    yield from gated_pool(monkeypatch, deflate, "COMPRESSORS")


def _infer_compressed(triton: Triton, model: str, encoding: str) -> Tuple[str, bytes]:
    """A JSON infer request whose client accepts `encoding`: the response's Content-Encoding and body."""
    body = json.dumps({"inputs": [{"name": "v", "shape": [1], "datatype": "FP32", "data": [2.0]}]})
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=60)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Accept-Encoding": encoding})
        response = connection.getresponse()
        assert response.status == 200
        return str(response.getheader("Content-Encoding")), response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_large_response_is_compressed_while_other_clients_are_answered(
    triton: Triton, compressors: GatedThreads, encoding: str
) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        large = pool.submit(_infer_compressed, triton, "fill", encoding)
        assert compressors.submitted.wait(30), "the large response was not left to a worker thread"
        assert [another_client_answered(triton) for _ in range(3)] == [True, True, True]
        assert not large.done()  # its compression waits at the gate: answered after the others
        compressors.gate.set()
        content_encoding, compressed = large.result(60)
    assert content_encoding == encoding
    inflated = gzip.decompress(compressed) if encoding == "gzip" else zlib.decompress(compressed)
    answer = json.loads(inflated)
    assert answer["outputs"][0]["data"] == (np.arange(LARGE, dtype=np.float32) + 2).tolist()


def test_a_small_response_is_compressed_on_the_loop(triton: Triton, compressors: GatedThreads) -> None:
    # Under OFF_LOOP_BYTES: no thread's round trip (the gate, never opened, would hold it).
    content_encoding, compressed = _infer_compressed(triton, "small", "gzip")
    assert content_encoding == "gzip"
    assert json.loads(gzip.decompress(compressed))["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]
    assert not compressors.submitted.is_set()


def _fill_over_grpc(triton: Triton, model: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        tensor = grpcclient.InferInput("v", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2], dtype=np.float32))
        return client.infer(model, [tensor]).as_numpy("y")
    finally:
        client.close()


def _stream_fill_over_grpc(triton: Triton, model: str) -> np.ndarray:
    """The same request in a ModelStreamInfer stream: its response is a stream message."""
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    answers: queue.Queue[Any] = queue.Queue()
    try:
        client.start_stream(lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("v", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2], dtype=np.float32))
        client.async_stream_infer(model, [tensor])
        answer = answers.get(timeout=60)
        assert not isinstance(answer, Exception), answer
        return answer.as_numpy("y")
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("infer", [_fill_over_grpc, _stream_fill_over_grpc], ids=["unary", "stream"])
def test_a_large_grpc_response_is_compressed_while_other_clients_are_answered(
    triton: Triton, compressors: GatedThreads, infer: Callable[[Triton, str], np.ndarray]
) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        large = pool.submit(infer, triton, "fill")
        assert compressors.submitted.wait(30), "the large response was not left to a worker thread"
        assert [_fill_over_grpc(triton, "small").tolist() for _ in range(2)] == [[2.0, 3.0, 4.0, 5.0]] * 2
        assert not large.done()
        compressors.gate.set()
        assert (large.result(60) == np.arange(LARGE, dtype=np.float32) + 2).all()
