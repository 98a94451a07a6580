"""Requests an abusive client sends to cost the server CPU out of proportion to their size.

Each is answered at the cost of reading it: the server's loop must not be held for seconds by a request
of a few hundred KiB while other clients wait.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import running_triton

# The 100,000 requested outputs took about 100 s of the loop with the quadratic check, 0.2 s without it.
ANSWER_S = 10.0


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module")
def stub() -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with running_triton(_bind, allow_http=False, allow_metrics=False) as triton:
        with grpc.insecure_channel(f"127.0.0.1:{triton.grpc_port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    return request


def test_grpc_100000_requested_outputs_are_refused_at_the_cost_of_reading_them(stub: Any) -> None:
    """Each name was looked up in the list of those before it: 100,000 distinct names held the loop for minutes."""
    request = _request()
    for index in range(100_000):
        request.outputs.add(name=f"O{index}")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=ANSWER_S)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert raised.value.details() == "unexpected inference output 'O0' for model 'identity'"
    assert time.monotonic() - started < ANSWER_S


def test_grpc_an_output_requested_100000_times_is_one_output(stub: Any) -> None:
    request = _request()
    for _ in range(100_000):
        request.outputs.add(name="OUTPUT_1")
    response = stub.ModelInfer(request, timeout=ANSWER_S)
    assert [output.name for output in response.outputs] == ["OUTPUT_1"]
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0]
