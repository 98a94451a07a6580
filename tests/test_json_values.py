"""JSON tensor values read and written as tritonserver 2.51 reads and writes them (probed side by side with it).

FP32 outputs go out as the doubles they are (`0.1f` as `0.10000000149011612`), an input's `data` must be a JSON
array, and the lists in it may nest in any way: only the count of their elements must fit the shape. An output
that cannot be written as asked (FP16 as JSON, the classes of BOOL values) is refused as tritonserver's response
callback refuses it: 400 with no content type set (text/plain).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.http_helpers import request

DTYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "FP16": np.float16,
    "INT32": np.int32,
    "BOOL": np.bool_,
    "BYTES": np.bytes_,
}

BATCHING_DTYPES = {
    "INT8": np.int8,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT64": np.uint64,
    **DTYPES,
}


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
                inputs=[Tensor(name="IN", dtype=dtype, shape=(2, 3))],
                outputs=[Tensor(name="OUT", dtype=dtype, shape=(2, 3))],
                config=ModelConfig(batching=False),
            )
        for name, dtype in BATCHING_DTYPES.items():
            triton.bind(
                f"v_{name.lower()}",
                _identity,
                inputs=[Tensor(name="IN", dtype=dtype, shape=(-1,))],
                outputs=[Tensor(name="OUT", dtype=dtype, shape=(-1,))],
                config=ModelConfig(max_batch_size=4),
            )
        triton.bind(
            "one",
            _identity,
            inputs=[Tensor(name="IN", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="OUT", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False),
        )
        triton.run()
        yield triton
    finally:
        triton.stop()


def _infer(server: Triton, model: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, Any]:
    status, _, answer = request(server.http_port, "POST", f"/v2/models/{model}/infer", body, headers)
    return status, json.loads(answer)


def _json_infer(server: Triton, model: str, datatype: str, shape: List[int], data: Any) -> Tuple[int, Any]:
    document = {"inputs": [{"name": "IN", "datatype": datatype, "shape": shape, "data": data}]}
    return _infer(server, model, json.dumps(document).encode(), {})


FLOAT32_VALUES = [0.1, 1 / 3, 3.4028235e38, 1e-45, 16777217.0, -0.0]


def test_fp32_outputs_go_out_as_the_doubles_they_are(server):
    values = np.array(FLOAT32_VALUES, np.float32)
    raw = values.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {"name": "IN", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": len(raw)}}
            ],
            "outputs": [{"name": "OUT"}],
        }
    ).encode()
    status, answer = _infer(server, "m_fp32", header + raw, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200, answer
    data = answer["outputs"][0]["data"]
    assert data == [float(value) for value in values]  # 0.10000000149011612, as tritonserver 2.51 writes it
    assert data[0] == 0.10000000149011612 and data[0] != 0.1


def test_fp32_json_inputs_come_back_as_the_doubles_of_their_floats(server):
    status, answer = _json_infer(server, "m_fp32", "FP32", [2, 3], [0.1, 0.2, 0.3, 1.5, -2.25, 7])
    assert status == 200, answer
    doubles = [0.10000000149011612, 0.20000000298023224, 0.30000001192092896, 1.5, -2.25, 7.0]
    assert answer["outputs"][0]["data"] == doubles


def test_fp64_outputs_keep_their_values(server):
    status, answer = _json_infer(server, "m_fp64", "FP64", [2, 3], [0.1, 0.30000000000000004, 5e-324, 1e300, -0.0, 2])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [0.1, 0.30000000000000004, 5e-324, 1e300, -0.0, 2.0]


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT32", [[1], [2, 3, 4, 5, 6]]),
        ("INT32", [[], [1, 2, 3, 4, 5, 6], []]),
        ("INT32", [[[1, 2]], [3], [[4], [5, 6]]]),
        ("FP32", [[1.5], [2, 3, 4, 5, 6]]),
        ("FP64", [[1.5, 2], [[3, 4], 5], 6]),
        ("BOOL", [[True], [False, True, False, True, False]]),
        ("BYTES", [["a"], ["b", "c", "d", "e", "f"]]),
    ],
)
def test_lists_nested_in_any_way_are_read_in_order(server, datatype, data):
    status, answer = _json_infer(server, f"m_{datatype.lower()}", datatype, [2, 3], data)
    assert status == 200, answer
    flat = answer["outputs"][0]["data"]
    assert len(flat) == 6 and answer["outputs"][0]["shape"] == [2, 3]
    assert flat[0] in (1, 1.5, True, "a") and flat[-1] in (6, 6.0, False, "f")


def test_unevenly_nested_lists_of_the_wrong_count_are_still_refused(server):
    status, answer = _json_infer(server, "m_int32", "INT32", [2, 3], [[1], [2, 3, 4, 5, 6, 7]])
    assert status == 400
    assert answer["error"] == "Unable to parse 'data': Shape does not match true shape of 'data' field"


@pytest.mark.parametrize("data", [5, {"a": 1}, "abc", None, True])
def test_data_that_is_no_array_is_refused_in_tritons_words(server, data):
    status, answer = _json_infer(server, "one", "INT32", [1], data)
    assert status == 400  # tritonserver 2.51: 500, for what the client sent
    assert answer == {"error": "Unable to parse 'data': attempt to access JSON non-array as array"}


def _binary_infer(server: Triton, datatype: str, values: np.ndarray, output: Dict[str, Any]) -> Tuple[int, str, Any]:
    raw = values.tobytes()
    tensor = {"name": "IN", "datatype": datatype, "shape": [2, 3], "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps({"inputs": [tensor], "outputs": [output]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    path = f"/v2/models/m_{datatype.lower()}/infer"
    status, answer_headers, answer = request(server.http_port, "POST", path, header + raw, headers)
    return status, answer_headers["content-type"], json.loads(answer)


@pytest.mark.parametrize("output", [{"name": "OUT"}, {"name": "OUT", "parameters": {"binary_data": False}}])
def test_an_fp16_output_asked_for_as_json_is_refused_as_tritons_response_callback_refuses_it(server, output):
    answer = _binary_infer(server, "FP16", np.arange(6, dtype=np.float16), output)
    message = "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    assert answer == (400, "text/plain", {"error": message})


def test_the_classes_of_a_bool_output_are_refused_in_tritons_words_as_its_response_callback_refuses_them(server):
    output = {"name": "OUT", "parameters": {"classification": 1}}
    answer = _binary_infer(server, "BOOL", np.array([True, False] * 3), output)
    message = "class result not available for output due to unsupported type 'BOOL'"
    assert answer == (400, "text/plain", {"error": message})


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (7, "unexpected number of string elements 7 for inference input 'IN' for model 'm_bytes', expecting 6"),
        (5, "expected 6 string elements for inference input 'IN' for model 'm_bytes', got 5"),
    ],
)
def test_strings_too_many_or_too_few_for_the_shape_are_refused_in_the_words_of_tritons_core(server, count, message):
    status, answer = _json_infer(server, "m_bytes", "BYTES", [2, 3], ["a"] * count)
    assert (status, answer) == (400, {"error": f"[request id: <id_unknown>] {message}"})


def test_nan_among_the_classes_stays_where_tritons_insertion_sort_leaves_it(server):
    # tritonserver 2.51 (std::sort with `a > b`, by insertion for up to 16 values): [0.5, 2.5, NaN, -1] -> 2.5, 0.5,
    # NaN; the top class of [0.1, 1e-45, 3.4e38, 16777216, -0.0, 1/3, 1e-7, 123456.79, NaN, inf] is inf
    output = {"name": "OUT", "parameters": {"classification": 4}}
    answer = _binary_infer(server, "FP32", np.array([0.5, 2.5, np.nan, -1, -2, -3], np.float32), output)
    assert answer[0] == 200, answer
    assert answer[2]["outputs"][0]["data"] == ["2.500000:1", "0.500000:0", "nan:2", "-1.000000:3"]
    output["parameters"]["classification"] = 1
    answer = _binary_infer(server, "FP32", np.array([0.1, 3.4e38, -0.0, 1e-7, np.nan, np.inf], np.float32), output)
    assert answer[2]["outputs"][0]["data"] == ["inf:5"]


@pytest.mark.parametrize("datatype", ["FP16", "BOOL"])
def test_classes_of_a_datatype_triton_does_not_rank_are_refused(server, datatype):
    output = {"name": "OUT", "parameters": {"classification": 1}}
    answer = _binary_infer(server, datatype, np.ones(6, DTYPES[datatype]), output)
    message = f"class result not available for output due to unsupported type '{datatype}'"
    assert answer == (400, "text/plain", {"error": message})


def test_a_binary_data_size_of_null_next_to_data_is_refused_as_two_sources(server):
    document = {
        "inputs": [
            {
                "name": "IN",
                "datatype": "INT32",
                "shape": [2, 3],
                "data": [1] * 6,
                "parameters": {"binary_data_size": None},
            }
        ]
    }
    status, answer = _infer(server, "m_int32", json.dumps(document).encode(), {})
    assert status == 400  # tritonserver 2.51 reads the key as set, whatever its value
    assert answer["error"].endswith("But set 'data' 'binary_data_size'")


def test_a_utf8_byte_order_mark_before_the_json_is_skipped_as_triton_skips_it(server):
    body = b'\xef\xbb\xbf{"inputs":[{"name":"IN","datatype":"INT32","shape":[2,3],"data":[1,2,3,4,5,6]}]}'
    status, answer = _infer(server, "m_int32", body, {})
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [1, 2, 3, 4, 5, 6]
    status, answer = _infer(server, "m_int32", b"\xef\xbb\xbf\xef\xbb\xbf{}", {})
    assert status == 400 and "failed to parse the request JSON buffer" in answer["error"]  # one mark, not two


def test_a_nul_byte_after_the_json_ends_it_as_triton_reads_it(server):
    document = b'{"inputs":[{"name":"IN","datatype":"INT32","shape":[2,3],"data":[1,2,3,4,5,6]}]}'
    status, answer = _infer(server, "m_int32", document + b" \x00\x01garbage", {})  # a C client's terminated text
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [1, 2, 3, 4, 5, 6]
    for refused in (document + b"x\x00", document[:-1] + b"\x00}", b"\x00" + document):  # not after the document
        status, answer = _infer(server, "m_int32", refused, {})
        assert status == 400 and "failed to parse the request JSON buffer" in answer["error"], refused


@pytest.mark.parametrize("into_tensors", [10, 24])
def test_a_header_length_that_runs_into_the_tensors_leaves_them_short_as_triton_finds_them(server, into_tensors):
    """tritonserver 2.51 reads the header up to its NUL-led tensor bytes, then finds the tensor short of them."""
    raw = np.arange(6, dtype=np.int32).tobytes()  # begins with a NUL byte
    header = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
    ).encode()
    status, answer = _infer(
        server, "m_int32", header + raw, {"Inference-Header-Content-Length": str(len(header) + into_tensors)}
    )
    assert status == 400
    assert answer["error"] == (
        f"unexpected size for input 'IN', expecting {into_tensors} additional bytes for model 'm_int32'"
    )


# What tritonserver 2.51 answered these values with (a 500 there), and what it wraps or makes infinite (kept here).
UNFIT = [
    ("INT8", [1.5], "non-signed-integer as signed-integer"),
    ("INT32", [2.0], "non-signed-integer as signed-integer"),
    ("INT32", [True], "non-signed-integer as signed-integer"),
    ("INT32", ["3"], "non-signed-integer as signed-integer"),
    ("INT32", [None], "non-signed-integer as signed-integer"),
    ("INT64", [2**63], "non-signed-integer as signed-integer"),
    ("UINT8", [-1], "non-unsigned-integer as unsigned-integer"),
    ("UINT64", [2**64], "non-unsigned-integer as unsigned-integer"),
    ("UINT64", [2**64 - 1, -1], "non-unsigned-integer as unsigned-integer"),
    ("FP32", ["1"], "non-number as double"),
    ("FP64", [None], "non-number as double"),
    ("BOOL", [1], "non-boolean as boolean"),
    ("BOOL", ["true"], "non-boolean as boolean"),
]


@pytest.mark.parametrize(("datatype", "data", "words"), UNFIT)
def test_values_json_cannot_give_the_datatype_are_refused_in_tritons_words(server, datatype, data, words):
    status, answer = _one_value_model(server, datatype, data)
    assert (status, answer) == (400, {"error": f"Unable to parse 'data': attempt to access JSON {words}"})


def test_numbers_for_bytes_are_refused_in_tritons_words(server):
    status, answer = _one_value_model(server, "BYTES", [1])
    assert (status, answer) == (
        400,
        {"error": "Unable to parse JSON bytes array: attempt to access JSON non-string as string"},
    )


@pytest.mark.parametrize(("datatype", "data"), [("INT8", [300]), ("UINT16", [70000]), ("FP32", [1e39])])
def test_values_triton_would_wrap_or_make_infinite_are_refused_in_this_servers_words(server, datatype, data):
    status, answer = _one_value_model(server, datatype, data)
    assert status == 400 and answer["error"].startswith(f"unable to parse 'data' of input 'IN' as {datatype}: ")
    assert "outside the range" in answer["error"]


def _one_value_model(server: Triton, datatype: str, data: List[Any]) -> Tuple[int, Any]:
    """Infer `data` on the batching identity model of `datatype`."""
    document = {"inputs": [{"name": "IN", "datatype": datatype, "shape": [1, len(data)], "data": data}]}
    return _infer(server, f"v_{datatype.lower()}", json.dumps(document).encode(), {})
