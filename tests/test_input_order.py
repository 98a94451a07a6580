"""A callable gets its request's inputs in the order the model declares them, as nvidia-pytriton 0.7.0 hands them.

0.7's proxy reads a request's inputs by the model config's names: `request.data`'s keys, `@batch`'s keyword
arguments and the batch size `@batch` reads off the first input follow the config, whatever order the client sent
them in (measured: inputs k, a, b sent as k-a-b, b-a-k and a-b-k reach the callable as k, a, b, with and without
`@batch`). This server handed them on in the request's order.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.compose import call_model, call_model_async
from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

NAMES = ("k", "a", "b")
OUTPUT = [Tensor(name="o", dtype=bytes, shape=(1,))]


def _plain(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"o": np.array([",".join(item.data).encode()], dtype=object)} for item in requests]


@batch
def _batched(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    rows = next(iter(inputs.values())).shape[0]  # the first input's batch size, as @batch reads it
    return {"o": np.array([[",".join(inputs).encode()]] * rows, dtype=object)}


def _calling(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    ones = np.ones(1, np.float32)
    return [call_model("plain", {"b": ones, "a": ones, "k": ones}) for _ in requests]


async def _calling_async(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    ones = np.ones(1, np.float32)
    return [await call_model_async("plain", {"b": ones, "a": ones, "k": ones}) for _ in requests]


def _bind(triton: Triton) -> None:
    inputs = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in NAMES]
    triton.bind("plain", _plain, inputs=inputs, outputs=OUTPUT, config=ModelConfig(batching=False))
    triton.bind("batched", _batched, inputs=inputs, outputs=OUTPUT, config=ModelConfig(max_batch_size=4))
    triton.bind(
        "in_process", ProcessInstances(_plain), inputs=inputs, outputs=OUTPUT, config=ModelConfig(batching=False)
    )
    triton.bind("batch_decorated", _batched, inputs=inputs, outputs=OUTPUT, config=ModelConfig(batching=False))
    for name, fn in (("calling", _calling), ("calling_async", _calling_async)):
        triton.bind(name, fn, inputs=inputs[:1], outputs=OUTPUT, config=ModelConfig(batching=False))


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind) as server:
        yield server


@pytest.mark.parametrize("order", ["kab", "bak", "abk"])
@pytest.mark.parametrize("model", ["plain", "batched", "in_process"])
def test_the_callable_gets_the_inputs_in_the_models_order(triton: Triton, model: str, order: str) -> None:
    shape = [1, 1] if model == "batched" else [1]
    inputs = [{"name": name, "datatype": "FP32", "shape": shape, "data": [1.0]} for name in order]
    status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == ["k,a,b"]
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        tensors = [grpcclient.InferInput(name, shape, "FP32") for name in order]
        for tensor in tensors:
            tensor.set_data_from_numpy(np.ones(shape, np.float32))
        assert client.infer(model, tensors).as_numpy("o").reshape(-1).tolist() == [b"k,a,b"]


def test_batch_reads_the_batch_size_off_the_models_first_input(triton: Triton) -> None:
    # A model without batching whose callable is decorated with @batch; `b` first in the request, of 1 row where `k`
    # has 2: 0.7's @batch reads 2 off k (its config's first input) and answers 2 rows. This server read 1 off b and
    # failed the request: "Received output tensors with different batch sizes".
    shapes = {"b": [1], "a": [2], "k": [2]}
    inputs = [
        {"name": name, "datatype": "FP32", "shape": shape, "data": [1.0] * shape[0]} for name, shape in shapes.items()
    ]
    status, _, raw = request(
        triton.http_port, "POST", "/v2/models/batch_decorated/infer", json.dumps({"inputs": inputs})
    )
    assert status == 200 and json.loads(raw)["outputs"][0] == {
        "name": "o",
        "datatype": "BYTES",
        "shape": [2, 1],
        "data": ["k,a,b", "k,a,b"],
    }


@pytest.mark.parametrize("model", ["calling", "calling_async"])
def test_an_inner_call_hands_the_inputs_in_the_models_order(triton: Triton, model: str) -> None:
    # The inner call runs `plain` directly in the caller's thread (or its instance thread): the same order.
    inputs = [{"name": "k", "datatype": "FP32", "shape": [1], "data": [1.0]}]
    status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == ["k,a,b"]
