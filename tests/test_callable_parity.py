"""What a misbehaving inference callable gets on the wire, compared with nvidia-pytriton 0.7.0.

Each expectation was measured against 0.7.0 (its tritonserver 2.51) serving the same callables; the comments
quote its answers. Where 0.7 answered with a traceback, the expectation is its last line.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import post_json


class _NoStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be told")


_CONTROL_FLOW = {"stop": StopIteration(5), "generator_exit": GeneratorExit(), "cancelled": asyncio.CancelledError()}


async def _raises_async(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return _raises(requests)


def _raises(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    case = requests[0].parameters["case"]
    if case == "surrogate":
        raise ValueError("bad \udcff byte")
    if case == "no_str":
        raise _NoStr()
    if case == "interrupt":
        raise KeyboardInterrupt()
    if case == "exit":
        raise SystemExit(3)
    if case in _CONTROL_FLOW:
        raise _CONTROL_FLOW[case]
    return [{"y": request["x"]} for request in requests]


_STRINGS = {
    "str": np.array(["1.5", "-2"]),
    "bytes": np.array([b"1.5", b"-2"], dtype=object),
    "fixed": np.array([b"1.5", b"-2"], dtype="S3"),
    "letters": np.array(["a", "b"]),
}


def _strings(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": _STRINGS[request.parameters["case"]]} for request in requests]


def _returns_an_array(requests: List[Any]) -> Any:
    return np.zeros(3, dtype=np.float32)


def _bind(triton: Triton) -> None:
    x = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    y = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
    triton.bind("raises", _raises, inputs=x, outputs=y, config=ModelConfig(batching=False))
    triton.bind("raises_async", _raises_async, inputs=x, outputs=y, config=ModelConfig(batching=False))
    triton.bind("strings", _strings, inputs=x, outputs=y, config=ModelConfig(batching=False))
    triton.bind("array", _returns_an_array, inputs=x, outputs=y, config=ModelConfig(batching=False))


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind) as server:
        yield server


def _http(triton: Triton, model: str, case: str) -> Any:
    body = {"parameters": {"case": case}, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
    return post_json(triton.http_port, f"/v2/models/{model}/infer", body)


def _grpc(triton: Triton, model: str, case: str) -> Any:
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        infer_input = grpcclient.InferInput("x", [1], "FP32")
        infer_input.set_data_from_numpy(np.ones(1, np.float32))
        return client.infer(model, [infer_input], parameters={"case": case}, client_timeout=10)
    finally:
        client.close()


def test_an_error_message_that_is_no_utf8_is_answered_over_both_protocols(triton: Triton) -> None:
    # 0.7.0 answered 500 / INTERNAL (its own encoding of the traceback failed: "UnicodeEncodeError: 'utf-8' codec
    # can't encode character '\udcff' ..."). This server answered HTTP 500 "str is not valid UTF-8" and never
    # answered the gRPC call (DEADLINE_EXCEEDED): the lone surrogate goes as its escape now.
    status, answer = _http(triton, "raises", "surrogate")
    assert (status, answer) == (500, {"error": "ValueError: bad \\udcff byte"})
    with pytest.raises(InferenceServerException) as failed:
        _grpc(triton, "raises", "surrogate")
    assert (failed.value.status(), failed.value.message()) == ("StatusCode.INTERNAL", "ValueError: bad \\udcff byte")
    assert _http(triton, "raises", "fine")[0] == 200


def test_an_exception_whose_str_raises_is_named_in_pythons_words(triton: Triton) -> None:
    # 0.7.0: "...BadStr: <exception str() failed>" (the last line of its traceback); this server answered
    # "internal server error: this exception cannot be told".
    status, answer = _http(triton, "raises", "no_str")
    assert (status, answer) == (500, {"error": "_NoStr: <exception str() failed>"})


@pytest.mark.parametrize("model", ["raises", "raises_async"])
def test_control_flow_exceptions_a_callable_raises_fail_its_request_and_the_model_goes_on(
    triton: Triton, model: str
) -> None:
    # 0.7.0 answered StopIteration with its traceback ("RuntimeError: async generator raised StopIteration"), and
    # GeneratorExit or CancelledError never: the request hung, and every later one to the model with it. Here a
    # sync callable's StopIteration and GeneratorExit were never answered either (asyncio refuses StopIteration
    # on a future; GeneratorExit ended the coroutine that awaited it), its instance never freed; a CancelledError
    # was answered "the server stopped before the response was complete".
    expected = {"stop": "StopIteration: 5", "generator_exit": "GeneratorExit", "cancelled": "CancelledError"}
    if model == "raises_async":  # PEP 479: a StopIteration raised in a coroutine comes out as a RuntimeError
        expected["stop"] = "RuntimeError: coroutine raised StopIteration"
        if sys.version_info < (3, 11):  # no Task.cancelling() to tell the callable's from a cancel of the task
            del expected["cancelled"]
    for case, words in expected.items():
        assert _http(triton, model, case) == (500, {"error": words})
        with pytest.raises(InferenceServerException) as failed:
            _grpc(triton, model, case)
        assert (failed.value.status(), failed.value.message()) == ("StatusCode.INTERNAL", words)
    assert _http(triton, model, "fine")[0] == 200


@pytest.mark.parametrize("case", ["str", "bytes", "fixed"])
def test_strings_returned_for_a_number_output_go_out_as_the_numbers_they_spell(triton: Triton, case: str) -> None:
    # 0.7.0 (not strict) casts them `astype` the declared dtype:
    # {"name":"OUT","datatype":"FP32","shape":[2,3],"data":[1.5,1.5,...]} for "1.5" and b"1.5"; this server sent
    # them as BYTES.
    status, answer = _http(triton, "strings", case)
    assert status == 200, answer
    assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]}]
    result = _grpc(triton, "strings", case)
    assert result.as_numpy("y").tolist() == [1.5, -2.0]
    assert result.get_output("y").datatype == "FP32"


def test_strings_that_spell_no_number_fail_in_numpys_words(triton: Triton) -> None:
    # 0.7.0's proxy raised "ValueError: could not convert string to float: 'a'" outside the request's error path:
    # the request was never answered and the model answered nothing more. A 500 in numpy's words here.
    status, answer = _http(triton, "strings", "letters")
    assert status == 500
    # NumPy 2 names the value np.str_('a'), NumPy 1 'a'
    assert re.fullmatch(r"ValueError: could not convert string to float: (np\.str_\()?'a'\)?", answer["error"]), answer


@pytest.mark.parametrize(("case", "error"), [("interrupt", "KeyboardInterrupt"), ("exit", "SystemExit: 3")])
def test_a_keyboard_interrupt_or_system_exit_in_the_callable_fails_its_request_only(
    triton: Triton, case: str, error: str
) -> None:
    # It reached the server's event loop and ended it: the request got no answer and the server none either.
    # 0.7.0 lost its server too (SystemExit: the request unanswered, then the server gone).
    assert _http(triton, "raises", case) == (500, {"error": error})
    assert _http(triton, "raises", "fine")[0] == 200
    assert _grpc(triton, "raises", "fine").as_numpy("y").tolist() == [1.0]


def test_what_a_callable_returned_instead_of_a_list_is_written_as_nvidia_writes_it(triton: Triton) -> None:
    # 0.7.0's traceback ends "ValueError: Outputs returned by `array` model callable must be list of response dicts
    # with numpy arrays. Got outputs=[0. 0. 0.] instead." (its str); this server wrote array([0., 0., 0.], ...).
    status, answer = _http(triton, "array", "any")
    assert (status, answer) == (
        500,
        {
            "error": "Outputs returned by `array` model callable must be list of response dicts with numpy arrays. "
            "Got outputs=[0. 0. 0.] instead."
        },
    )
