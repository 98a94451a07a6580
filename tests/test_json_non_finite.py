"""NaN and the infinities in JSON, both ways, as Triton reads and writes them (checked against nvidia-pytriton 0.7).

tritonclient's HTTP client writes a JSON tensor's non-finite values as `NaN`, `Infinity` and `-Infinity`;
Triton reads them (and `Inf`, `-Inf`, `-NaN`) and writes non-finite outputs the same way. Booleans are not
numbers: Triton refuses `true` among FP32 or INT32 data.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.protocol import json_text
from pytriton.triton import Triton, TritonConfig
from tests.http_helpers import request

DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT32": np.int32}


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": r["IN"]} for r in requests]


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False))
    try:
        for name, dtype in DTYPES.items():
            triton.bind(
                f"m_{name.lower()}",
                _identity,
                inputs=[Tensor(name="IN", dtype=dtype, shape=(-1,))],
                outputs=[Tensor(name="OUT", dtype=dtype, shape=(-1,))],
                config=ModelConfig(max_batch_size=8),
            )
        triton.run()
        yield triton
    finally:
        triton.stop()


def _post(server: Triton, model: str, body: bytes, headers: Optional[Dict[str, str]] = None) -> Any:
    status, _, answer = request(server.http_port, "POST", f"/v2/models/{model}/infer", body, headers or {})
    return status, answer


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize("binary_output", [False, True])
def test_tritonclient_json_tensors_with_nan_and_infinities_are_served(server, datatype, binary_output):
    values = np.array([[np.nan, np.inf, -np.inf, 1.5]], DTYPES[datatype])
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        tensor = httpclient.InferInput("IN", list(values.shape), datatype)
        tensor.set_data_from_numpy(values, binary_data=False)  # the request's JSON holds NaN and Infinity
        output = httpclient.InferRequestedOutput("OUT", binary_data=binary_output)
        result = client.infer(f"m_{datatype.lower()}", [tensor], outputs=[output]).as_numpy("OUT")
    finally:
        client.close()
    np.testing.assert_array_equal(result, values)  # NaN where NaN was (assert_array_equal matches NaNs)
    assert result.dtype == values.dtype


def test_every_token_triton_reads_is_taken_and_answered_spelled_out(server):
    body = b'{"inputs":[{"name":"IN","shape":[1,6],"datatype":"FP32","data":[NaN,Infinity,-Infinity,Inf,-Inf,-NaN]}]}'
    status, answer = _post(server, "m_fp32", body)
    assert status == 200, answer
    assert b'"data":[NaN,Infinity,-Infinity,Infinity,-Infinity,NaN]' in answer  # as Triton writes them


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])  # FP16 has no JSON form: test_wire_fidelity's refusal
def test_non_finite_binary_inputs_come_back_spelled_out_in_json(server, datatype):
    raw = np.array([np.nan, np.inf, -np.inf, 0.5], DTYPES[datatype]).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {"name": "IN", "shape": [1, 4], "datatype": datatype, "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    status, answer = _post(
        server, f"m_{datatype.lower()}", head + raw, {"Inference-Header-Content-Length": str(len(head))}
    )
    assert status == 200, answer
    assert b'"data":[NaN,Infinity,-Infinity,0.5]' in answer, answer  # orjson alone wrote null for all three


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_the_generate_extension_reads_and_writes_them_too(server, route):
    status, _, answer = request(server.http_port, "POST", f"/v2/models/m_fp32/{route}", b'{"IN": [NaN, -Infinity]}')
    assert status == 200 and b'"OUT":[NaN,-Infinity]' in answer, answer


def test_a_nan_parameter_is_taken(server):
    body = b'{"inputs":[{"name":"IN","shape":[1,1],"datatype":"FP32","data":[2]}],"parameters":{"x":NaN}}'
    status, answer = _post(server, "m_fp32", body)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0]


@pytest.mark.parametrize(
    "data",
    [b"[nan]", b"[NaN,]", b"[Infinityx]", b"[NaN", b'[1,"\\ud800"] NaN', b"[" * 1100 + b"NaN" + b"]" * 1100],
    ids=["lowercase", "trailing comma", "longer word", "unterminated", "lone surrogate", "nested too deep"],
)
def test_what_is_not_json_even_with_those_tokens_is_400_with_the_parsers_message(server, data):
    body = b'{"inputs":[{"name":"IN","shape":[1,1],"datatype":"FP32","data":' + data + b"}]}"
    status, answer = _post(server, "m_fp32", body)
    assert status == 400, answer
    assert json.loads(answer)["error"].startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize(
    ("model", "data"),
    [
        ("m_fp32", [1, True, 2.5]),
        ("m_fp32", [[1.0, 2.0], [False, 3.0]]),
        ("m_fp64", [1.0, False]),
        ("m_int32", [1, True]),
    ],
    ids=["fp32", "fp32 nested", "fp64", "int32"],
)
def test_booleans_among_numbers_are_refused(server, model, data):
    datatype = model[2:].upper()
    shape = [2, 2] if isinstance(data[0], list) else [1, len(data)]
    body = json.dumps({"inputs": [{"name": "IN", "shape": shape, "datatype": datatype, "data": data}]}).encode()
    status, answer = _post(server, model, body)
    assert status == 400, answer
    expected = "non-signed-integer as signed-integer" if datatype == "INT32" else "non-number as double"
    assert json.loads(answer)["error"] == f"Unable to parse 'data': attempt to access JSON {expected}"  # Triton's


def test_documents_with_only_finite_floats_are_written_by_orjson_unchanged():
    document = {"name": "null", "data": np.array([1.0, 2.5], np.float32), "text": ["null"]}
    assert json_text.dumps(document) == b'{"name":"null","data":[1.0,2.5],"text":["null"]}'


def test_non_finite_numpy_scalars_and_python_floats_are_spelled_out():
    document = {"a": np.float32("nan"), "b": [float("-inf")], "c": np.int64(3), "d": np.array([[np.inf]], np.float16)}
    assert json.loads(json_text.dumps(document), parse_constant=str) == {
        "a": "NaN",
        "b": ["-Infinity"],
        "c": 3,
        "d": [["Infinity"]],
    }


def test_finite_values_next_to_non_finite_ones_are_written_as_triton_writes_them(server):
    """A NaN in a tensor leaves its other values written as without one (tritonserver 2.51's answer, recorded).

    They were written by python-rapidjson (`5.56e-07`, `3.03e-05`) where Triton writes `5.56e-7` and
    `0.0000303`, as orjson does; perf_analyzer's random FP32 data has such values in most JSON tensors.
    """
    data = b"[5.561046805269143e-7,NaN,0.00003028276660188567,-Infinity]"
    body = b'{"inputs":[{"name":"IN","shape":[1,4],"datatype":"FP32","data":%s}]}' % data
    status, answer = _post(server, "m_fp32", body)
    assert status == 200, answer
    assert b'"data":%s' % data in answer  # the same text as Triton's answer


def test_arrays_with_non_finite_values_among_strings_like_the_mark_keep_their_places():
    """Each array's text goes where it was, whatever strings the document holds."""
    document = {
        "a": np.array([np.nan, 1.0]),
        "text": ["null", "-0"],
        "b": np.array([[2.0], [-np.inf]], np.float32),
        "c": [np.array([np.inf])],
    }
    assert json_text.dumps(document) == (
        b'{"a":[NaN,1.0],"text":["null","-0"],"b":[[2.0],[-Infinity]],"c":[[Infinity]]}'
    )
