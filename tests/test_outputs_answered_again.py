"""A callable's answer that passed the output checks once is answered alike the next times (core/outputs.py).

The engine remembers which (output name, dtype) pairs passed the checks as they are and answers them unchecked
afterwards. Each case here asks the same model several times in a row, so that the later answers go that way,
and sees each answer as the first: datatypes on the wire, the outputs selected, the limits kept.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton
from tests.conftest import http_url, running_triton

TIMES = 3
RESPONSE_LIMIT = 4096  # bytes a response may carry (ServerLimits.max_response_bytes)
FP32_ANY = Tensor(name="x", dtype=np.float32, shape=(-1,))


def _rows(requests: List[Any], **outputs: Any) -> List[Dict[str, np.ndarray]]:
    return [{name: make(request["x"]) for name, make in outputs.items()} for request in requests]


def _two_outputs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return _rows(requests, a=lambda x: x + 1, b=lambda x: x * 2)


def _one_output(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return _rows(requests, a=lambda x: x + 1)


def _with_undeclared(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return _rows(requests, a=lambda x: x + 1, extra=lambda x: x)


def _as_dtype_asked(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """`a` as the dtype the request's `dtype` parameter names (FP32 by default)."""
    return [{"a": request["x"].astype(request.parameters.get("dtype", "float32"))} for request in requests]


def _bind(triton: Triton) -> None:
    batched = ModelConfig(max_batch_size=4)
    fp32 = [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))]
    triton.bind("two", _two_outputs, inputs=[FP32_ANY], outputs=fp32, config=batched)
    triton.bind("one_of_two", _one_output, inputs=[FP32_ANY], outputs=fp32, config=batched)
    triton.bind("undeclared", _with_undeclared, inputs=[FP32_ANY], outputs=fp32[:1], config=batched)
    bf16 = [Tensor(name="a", dtype="bfloat16", shape=(-1,))]
    triton.bind("bf16", _as_dtype_asked, inputs=[FP32_ANY], outputs=bf16, config=batched)
    triton.bind("cast", _as_dtype_asked, inputs=[FP32_ANY], outputs=fp32[:1], config=batched)
    triton.bind("forgets_b", _one_output, inputs=[FP32_ANY], outputs=fp32, config=batched)
    triton.bind("strict", _as_dtype_asked, inputs=[FP32_ANY], outputs=fp32[:1], config=batched, strict=True)
    pair = [Tensor(name="a", dtype=np.float32, shape=(2,))]
    triton.bind("strict_pair", _as_dtype_asked, inputs=[FP32_ANY], outputs=pair, config=batched, strict=True)


@pytest.fixture(scope="module")
def client() -> Iterator[httpclient.InferenceServerClient]:
    with running_triton(
        _bind, allow_grpc=False, allow_metrics=False, limits=ServerLimits(max_response_bytes=RESPONSE_LIMIT)
    ) as triton:
        client = httpclient.InferenceServerClient(http_url(triton))
        try:
            yield client
        finally:
            client.close()


def _infer(
    client: httpclient.InferenceServerClient,
    model: str,
    values: np.ndarray,
    outputs: Optional[List[str]] = None,
    parameters: Optional[Dict[str, Any]] = None,
) -> httpclient.InferResult:
    tensor = httpclient.InferInput("x", [1, len(values)], "FP32")
    tensor.set_data_from_numpy(values.reshape(1, -1).astype(np.float32), binary_data=True)
    requested = (
        None if outputs is None else [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    )
    return client.infer(model, [tensor], outputs=requested, parameters=parameters)


def _names(result: httpclient.InferResult) -> List[str]:
    return [output["name"] for output in result.get_response()["outputs"]]


def test_every_output_is_answered_in_the_callables_order_each_time(client: httpclient.InferenceServerClient) -> None:
    for time in range(TIMES):
        result = _infer(client, "two", np.array([time, 1.0]))
        assert _names(result) == ["a", "b"]
        assert result.as_numpy("a").tolist() == [[time + 1, 2.0]]
        assert result.as_numpy("b").tolist() == [[time * 2, 2.0]]


def test_the_outputs_asked_for_are_the_only_ones_answered_each_time(client: httpclient.InferenceServerClient) -> None:
    _infer(client, "two", np.array([1.0]))  # both outputs pass once
    for _ in range(TIMES):
        assert _names(_infer(client, "two", np.array([1.0]), outputs=["b"])) == ["b"]
        assert _names(_infer(client, "two", np.array([1.0]), outputs=["b", "a"])) == ["a", "b"]


def test_an_output_asked_for_and_not_returned_is_left_out_each_time(client: httpclient.InferenceServerClient) -> None:
    for _ in range(TIMES):
        result = _infer(client, "one_of_two", np.array([1.0]), outputs=["a", "b"])
        assert _names(result) == ["a"]


def test_an_output_asked_for_and_not_returned_is_warned_of_after_the_others_passed(
    client: httpclient.InferenceServerClient, pytriton_logger: logging.Logger
) -> None:
    records: List[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    pytriton_logger.addHandler(handler)
    try:
        for _ in range(TIMES):
            assert _names(_infer(client, "forgets_b", np.array([1.0]))) == ["a"]
        assert _names(_infer(client, "forgets_b", np.array([1.0]), outputs=["a", "b"])) == ["a"]
    finally:
        pytriton_logger.removeHandler(handler)
    warnings = [record.getMessage() for record in records if "asked for output 'b'" in record.getMessage()]
    assert len(warnings) == 1 and "model 'forgets_b' version 1" in warnings[0], [
        record.getMessage() for record in records
    ]


def test_an_undeclared_output_is_left_out_each_time(client: httpclient.InferenceServerClient) -> None:
    for _ in range(TIMES):
        assert _names(_infer(client, "undeclared", np.array([1.0]))) == ["a"]


def test_fp32_values_of_a_bf16_output_go_out_as_bf16_each_time(client: httpclient.InferenceServerClient) -> None:
    for _ in range(TIMES):
        result = _infer(client, "bf16", np.array([1.5, 2.0]))
        assert result.get_output("a")["datatype"] == "BF16"


def test_a_dtype_that_needs_a_cast_is_cast_after_the_declared_one_passed(
    client: httpclient.InferenceServerClient,
) -> None:
    for dtype in ("float32", "int64", "float32", "float64", "int64"):
        result = _infer(client, "cast", np.array([3.0, 4.0]), parameters={"dtype": dtype})
        assert result.get_output("a")["datatype"] == "FP32"
        assert result.as_numpy("a").tolist() == [[3.0, 4.0]]


def test_a_strict_model_refuses_a_wrong_dtype_after_answering_the_right_one(
    client: httpclient.InferenceServerClient,
) -> None:
    for _ in range(TIMES):
        assert _infer(client, "strict", np.array([1.0]), parameters={"dtype": "float32"}).as_numpy("a").tolist() == [
            [1.0]
        ]
        with pytest.raises(InferenceServerException, match="has invalid type"):
            _infer(client, "strict", np.array([1.0]), parameters={"dtype": "int64"})


def test_a_strict_model_refuses_a_wrong_shape_after_answering_the_right_one(
    client: httpclient.InferenceServerClient,
) -> None:
    for _ in range(TIMES):
        assert _infer(client, "strict_pair", np.array([1.0, 2.0])).as_numpy("a").tolist() == [[1.0, 2.0]]
        with pytest.raises(InferenceServerException, match="has invalid shapes"):
            _infer(client, "strict_pair", np.array([1.0, 2.0, 3.0]))


def test_outputs_over_the_response_limit_fail_after_small_ones_passed(client: httpclient.InferenceServerClient) -> None:
    over = RESPONSE_LIMIT // 4 // 2 + 1  # FP32 values of `a` and `b` together past the limit
    for _ in range(TIMES):
        assert _infer(client, "two", np.ones(4)).as_numpy("a").shape == (1, 4)
        with pytest.raises(InferenceServerException, match="more than the 4096 bytes a response may carry"):
            _infer(client, "two", np.ones(over))
        # Asked for one of them, the response fits.
        assert _infer(client, "two", np.ones(over), outputs=["a"]).as_numpy("a").shape == (1, over)
