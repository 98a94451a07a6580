"""Which refusal a request with several faults gets from a batching model of 3 or more inputs, as tritonserver 2.51's.

Triton's core visits a request's inputs in its `std::unordered_map`'s order (core/hash_map_order.py). For a batching
model it looks each input up and reads its batch dimension in one visit, and then checks each input's datatype,
shape and data (a BYTES input's count of strings too) in another. Each expected answer is nvidia-pytriton 0.7.0's
(tritonserver 2.51), word for word, over HTTP (JSON and binary) and gRPC (raw and typed contents).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

# name, datatype, shape (batch dimension first), values
Given = Tuple[str, str, List[int], List[Any]]


@batch
def _first(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    return {"o": next(iter(inputs.values())).astype(np.float32)}


def _bind(triton: Triton) -> None:
    output = [Tensor(name="o", dtype=np.float32, shape=(-1,))]
    kab = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in ("k", "a", "b")]
    triton.bind("b3", _first, inputs=kab, outputs=output, config=ModelConfig(max_batch_size=4))
    pqrs = [
        Tensor(name="p", dtype=np.float32, shape=(-1,)),
        Tensor(name="q", dtype=np.int32, shape=(2,)),
        Tensor(name="r", dtype=bytes, shape=(1,)),
        Tensor(name="s", dtype=np.float16, shape=(-1,)),
    ]
    triton.bind("b4", _first, inputs=pqrs, outputs=output, config=ModelConfig(max_batch_size=4))
    pqrs[3] = Tensor(name="s", dtype=np.float32, shape=(-1,))  # FP16 has no typed contents
    triton.bind("t4", _first, inputs=pqrs, outputs=output, config=ModelConfig(max_batch_size=4))
    xy = [Tensor(name="X", dtype=np.float16, shape=(2, -1)), Tensor(name="Y", dtype=np.uint8, shape=(3,))]
    triton.bind("h2", _first, inputs=xy, outputs=output, config=ModelConfig(max_batch_size=4))


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind) as server:
        yield server


def _raw(datatype: str, values: List[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(value)) + value.encode() for value in values)
    numpy_type = {"FP32": np.float32, "INT32": np.int32, "INT16": np.int16, "FP16": np.float16, "UINT8": np.uint8}[
        datatype
    ]
    return np.array(values, numpy_type).tobytes()


def _http_json(triton: Triton, model: str, given: List[Given]) -> Tuple[int, Any]:
    inputs = [{"name": name, "datatype": dt, "shape": shape, "data": values} for name, dt, shape, values in given]
    status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))
    return status, json.loads(raw)["error"]


def _http_binary(triton: Triton, model: str, given: List[Given]) -> Tuple[int, Any]:
    header = json.dumps(
        {
            "inputs": [
                {"name": name, "datatype": dt, "shape": shape, "parameters": {"binary_data_size": len(_raw(dt, data))}}
                for name, dt, shape, data in given
            ]
        }
    ).encode()
    body = header + b"".join(_raw(dt, data) for _, dt, _, data in given)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, _, raw = request(triton.http_port, "POST", f"/v2/models/{model}/infer", body, headers)
    return status, json.loads(raw)["error"]


_TYPED = {"FP32": "fp32_contents", "INT32": "int_contents", "INT16": "int_contents", "BYTES": "bytes_contents"}


def _grpc(triton: Triton, model: str, given: List[Given], typed: bool) -> Tuple[Any, Any]:
    message = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, values in given:
        tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
        if typed:
            contents = [value.encode() for value in values] if datatype == "BYTES" else values
            getattr(tensor.contents, _TYPED[datatype]).extend(contents)
        else:
            message.raw_input_contents.append(_raw(datatype, values))
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    return raised.value.code(), raised.value.details()


def test_a_batch_size_that_differs_is_named_before_an_unknown_input_visited_after_it(triton: Triton) -> None:
    # The core's hash map visits k, b, zz in this order: k sets the batch size (3), b's (2) differs, and zz, which
    # the model does not have, is not reached. This server looked every name up first and named zz.
    given: List[Given] = [
        ("zz", "FP32", [2, 1], [1, 1]),
        ("b", "FP32", [2, 2], [1, 1, 1, 1]),
        ("k", "FP32", [3, 2], [1] * 6),
    ]
    refusal = "[request id: <id_unknown>] input 'b' batch size does not match other inputs for 'b3'"
    assert _http_json(triton, "b3", given) == (400, refusal)
    assert _grpc(triton, "b3", given, typed=False) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


@pytest.mark.parametrize(
    "other",
    [("p", "INT16", [2, 2], [1] * 4), ("p", "FP32", [2, 2], [1] * 5), ("q", "INT32", [2, 3], [1] * 6)],
    ids=["a datatype", "a byte size", "a shape"],
)
@pytest.mark.parametrize("wire", ["http-binary", "grpc-raw", "grpc-typed"])
def test_too_many_strings_are_named_before_another_fault_of_an_input_visited_after(
    triton: Triton, other: Given, wire: str
) -> None:
    # The core visits p, q, r, s as s, r, q, p, and checks r's count of strings in the visit in which it checks
    # each input's datatype, shape and byte size. This server read a BYTES input's strings after the others' checks
    # and named p's (or q's) fault.
    inputs: Dict[str, Given] = {
        "p": ("p", "FP32", [2, 2], [1] * 4),
        "q": ("q", "INT32", [2, 2], [1] * 4),
        "r": ("r", "BYTES", [2, 1], ["ab", "ab", "ab"]),
        "s": ("s", "FP16", [2, 2], [1] * 4),
    }
    inputs[other[0]] = other
    model = "b4"
    if wire == "grpc-typed":
        inputs["s"], model = ("s", "FP32", [2, 2], [1] * 4), "t4"
    given = list(inputs.values())
    refusal = (
        f"[request id: <id_unknown>] unexpected number of string elements 3 for inference input 'r' for model "
        f"'{model}', expecting 2"
    )
    if wire == "http-binary":
        assert _http_binary(triton, model, given) == (400, refusal)
    else:
        assert _grpc(triton, model, given, typed=wire == "grpc-typed") == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


def _mismatch(rows_bytes: int, got: int) -> str:
    return (
        f"[request id: <id_unknown>] input byte size mismatch for input 'Y' for model 'h2'. Expected {rows_bytes}, "
        f"got {got}"
    )


@pytest.mark.parametrize("x_datatype", ["FP16", "INT16"], ids=["X fine", "X refused too"])
@pytest.mark.parametrize("wire", ["http-binary", "grpc-raw"])
def test_an_input_of_batch_size_0_is_expected_to_hold_the_rows_of_the_requests_batch_size(
    triton: Triton, x_datatype: str, wire: str
) -> None:
    # The core visits X, Y as Y, X: Y's batch dimension of 0 sets no batch size, X's 3 does, and Y is then expected
    # to hold 3 rows (9 bytes). This server expected one row (`Expected 3`).
    given: List[Given] = [("X", x_datatype, [3, 2, 1], [1] * 6), ("Y", "UINT8", [0, 3], [1, 2, 3])]
    if wire == "http-binary":
        assert _http_binary(triton, "h2", given) == (400, _mismatch(9, 3))
    else:
        assert _grpc(triton, "h2", given, typed=False) == (grpc.StatusCode.INVALID_ARGUMENT, _mismatch(9, 3))


def test_json_data_of_an_input_of_batch_size_0_is_none_of_the_requests_rows(triton: Triton) -> None:
    # The frontend reads no JSON data of a shape of no elements: Y holds 0 bytes of the 4 rows X makes.
    header = json.dumps(
        {
            "inputs": [
                {"name": "X", "shape": [4, 2, 3], "datatype": "FP16", "parameters": {"binary_data_size": 48}},
                {"name": "Y", "shape": [0, 3], "datatype": "UINT8", "data": list(range(12))},
            ]
        }
    ).encode()
    body = header + bytes(48)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, _, raw = request(triton.http_port, "POST", "/v2/models/h2/infer", body, headers)
    assert (status, json.loads(raw)["error"]) == (400, _mismatch(12, 0))
