"""Classification answers compared side by side with tritonserver 2.51 (python-backend echo models, label files).

Triton orders a row with libstdc++'s std::sort and `a > b`, which is not stable: past 16 values, equal values
and NaN come in the order that algorithm leaves them, not by position. The expected answers below are what
tritonserver 2.51 answered to the same values.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.core.classification import TRITON_ORDER_MAX_VALUES, top_classes
from pytriton.core.request import OutputTensor
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import request

LABELS = "zero\none\ntwo\nthree\n"
# Windows line ends, an empty line, a label with a form feed in it (Python's splitlines() would split it there)
ODD_LABELS = "zero\r\n\r\ntwo\x0cthree\n\nfour"
DTYPES = {"INT32": np.int32, "FP32": np.float32}


def _echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"]} for request in requests]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Triton]:
    folder = tmp_path_factory.mktemp("labels")
    (folder / "labels.txt").write_text(LABELS)
    (folder / "odd.txt").write_bytes(ODD_LABELS.encode())

    def bind(triton: Triton) -> None:
        def echo(name: str, datatype: str, labels: Path, **config: Any) -> None:
            shape = (-1,)
            triton.bind(
                name,
                _echo,
                inputs=[Tensor(name="IN", dtype=DTYPES[datatype], shape=shape)],
                outputs=[Tensor(name="OUT", dtype=DTYPES[datatype], shape=shape, label_filename=str(labels))],
                config=ModelConfig(**config),
            )

        for datatype in DTYPES:
            echo(f"u_{datatype}", datatype, folder / "labels.txt", batching=False)
        echo("b_INT32", "INT32", folder / "labels.txt", max_batch_size=8)
        echo("odd", "FP32", folder / "odd.txt", batching=False)

    with running_triton(bind) as served:
        yield served


def _strings(raw: bytes) -> List[str]:
    texts = []
    while raw:
        (length,) = struct.unpack("<I", raw[:4])
        texts.append(raw[4 : 4 + length].decode())
        raw = raw[4 + length :]
    return texts


def _http_classes(triton: Triton, model: str, values: np.ndarray, parameters: Dict[str, Any]) -> Tuple[int, Any]:
    """Status and answer of an HTTP request for OUT with these parameters; the classes as strings when it is 200."""
    datatype = "INT32" if values.dtype == np.int32 else "FP32"
    raw = values.tobytes()
    tensor = {
        "name": "IN",
        "datatype": datatype,
        "shape": list(values.shape),
        "parameters": {"binary_data_size": len(raw)},
    }
    header = json.dumps({"inputs": [tensor], "outputs": [{"name": "OUT", "parameters": parameters}]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, answer_headers, body = request(triton.http_port, "POST", f"/v2/models/{model}/infer", header + raw, headers)
    if status != 200:
        return status, json.loads(body)
    length = int(answer_headers["inference-header-content-length"])
    output = json.loads(body[:length])["outputs"][0]
    return status, (output["datatype"], output["shape"], _strings(body[length:]))


def _grpc_classes(triton: Triton, model: str, values: np.ndarray, count: int) -> Tuple[str, List[int], List[str]]:
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        tensor = grpcclient.InferInput("IN", list(values.shape), "INT32" if values.dtype == np.int32 else "FP32")
        tensor.set_data_from_numpy(values)
        wanted = [grpcclient.InferRequestedOutput("OUT", class_count=count)]
        result = client.infer(model, [tensor], outputs=wanted)
    output = result.get_output("OUT")
    classes = result.as_numpy("OUT")
    return output.datatype, list(output.shape), [text.decode() for text in classes.reshape(-1)]


ZEROS_20 = ["0:10", "0:19", "0:18", "0:17", "0:16", "0:15", "0:14", "0:13", "0:12", "0:11", "0:0:zero"]
ZEROS_20 += ["0:9", "0:8", "0:7", "0:6", "0:5", "0:4", "0:3:three", "0:2:two", "0:1:one"]
TWOS_AND_ONES = ["2.000000:1:one", "2.000000:19", "2.000000:17", "2.000000:15", "2.000000:13", "2.000000:11"]
TWOS_AND_ONES += ["2.000000:9", "2.000000:7", "2.000000:5", "2.000000:3:three", "1.000000:8", "1.000000:6"]
TWOS_AND_ONES += ["1.000000:10", "1.000000:12", "1.000000:4", "1.000000:14", "1.000000:16", "1.000000:2:two"]
TWOS_AND_ONES += ["1.000000:18", "1.000000:0:zero"]
HALVES_AND_NAN = ["0.500000:10", "nan:19", "0.500000:18", "nan:17", "0.500000:16", "nan:15", "0.500000:14"]
HALVES_AND_NAN += ["nan:13", "0.500000:12", "nan:11", "0.500000:0:zero", "nan:9", "0.500000:8", "nan:7", "0.500000:6"]
HALVES_AND_NAN += ["nan:5", "0.500000:4", "nan:3:three", "0.500000:2:two", "nan:1:one"]


@pytest.mark.parametrize(
    ("model", "values", "expected"),
    [
        ("u_INT32", np.zeros(20, np.int32), ZEROS_20),
        ("u_FP32", np.array([1.0, 2.0] * 10, np.float32), TWOS_AND_ONES),
        ("u_FP32", np.array([0.5, np.nan] * 10, np.float32), HALVES_AND_NAN),
    ],
    ids=["equal-ints", "equal-floats", "nan"],
)
def test_a_row_of_more_than_16_values_is_ordered_as_tritons_std_sort_leaves_it(
    triton: Triton, model: str, values: np.ndarray, expected: List[str]
) -> None:
    assert _http_classes(triton, model, values, {"classification": 20, "binary_data": True}) == (
        200,
        ("BYTES", [20], expected),
    )
    assert _grpc_classes(triton, model, values, 20) == ("BYTES", [20], expected)


def test_each_batch_row_is_ordered_as_tritons_std_sort_leaves_it(triton: Triton) -> None:
    rows = np.array([[0] * 18, [1, 0] * 9], np.int32)
    expected = ["0:9", "0:17", "0:16", "0:15", "0:14", "1:2:two", "1:16", "1:4", "1:6", "1:14"]
    assert _grpc_classes(triton, "b_INT32", rows, 5) == ("BYTES", [2, 5], expected)


def test_a_nan_with_its_sign_bit_is_written_as_cpp_writes_it(triton: Triton) -> None:
    negative_nan = np.copysign(np.float32(np.nan), np.float32(-1))  # what x86 makes of inf - inf
    values = np.array([1.0, negative_nan, np.nan, -np.inf], np.float32)
    assert np.signbit(values[1]) and not np.signbit(values[2])
    expected = ["1.000000:0:zero", "-nan:1:one", "nan:2:two", "-inf:3:three"]
    assert _grpc_classes(triton, "u_FP32", values, 4) == ("BYTES", [4], expected)


def test_label_file_lines_end_at_newlines_and_an_empty_label_adds_none(triton: Triton) -> None:
    # tritonserver 2.51: "5.000000:0:zero\r", "4.000000:1:\r" (it keeps the carriage returns: not followed here),
    # "3.000000:2:two\x0cthree", "2.000000:3" (its label is empty), "1.000000:4:four", "0.000000:5" (no label)
    values = np.array([5, 4, 3, 2, 1, 0], np.float32)
    expected = ["5.000000:0:zero", "4.000000:1", "3.000000:2:two\x0cthree", "2.000000:3", "1.000000:4:four"]
    assert _grpc_classes(triton, "odd", values, 6) == ("BYTES", [6], [*expected, "0.000000:5"])


NOT_UNSIGNED = "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"


@pytest.mark.parametrize("count", [None, -1, "3", 3.0, True])
def test_an_http_class_count_not_unsigned_is_refused_in_tritons_words(triton: Triton, count: Any) -> None:
    # tritonserver 2.51 answers these 500 (null too: it reads the key as set); 400 here, the client sent them
    answer = _http_classes(triton, "u_FP32", np.ones(3, np.float32), {"classification": count})
    assert answer == (400, {"error": NOT_UNSIGNED})


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"classification": 0}, "Output can't set both 'shared_memory_region' and 'classification'"),
        ({"classification": -1}, "Output can't set both 'shared_memory_region' and 'classification'"),
        ({"binary_data": True}, "Output can't set both 'shared_memory_region' and 'binary_data'"),
        ({"binary_data": 1}, "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean"),
    ],
)
def test_an_http_output_in_shared_memory_asked_for_as_classes_or_binary_is_refused_first(
    triton: Triton, parameters: Dict[str, Any], message: str
) -> None:
    # before the region is looked up (it is registered nowhere here), as Triton's ValidateOutputParameter
    region = {"shared_memory_region": "nowhere", "shared_memory_byte_size": 64}
    assert _http_classes(triton, "u_FP32", np.ones(3, np.float32), {**region, **parameters}) == (
        400,
        {"error": message},
    )


def _grpc_refusal(triton: Triton, parameters: Dict[str, Any]) -> Tuple[Any, str]:
    request_message = service_pb2.ModelInferRequest(model_name="u_FP32")
    request_message.inputs.add(name="IN", datatype="FP32", shape=[3])
    request_message.raw_input_contents.append(np.ones(3, np.float32).tobytes())
    output = request_message.outputs.add(name="OUT")
    for key, value in parameters.items():
        if isinstance(value, str):
            output.parameters[key].string_param = value
        else:
            output.parameters[key].int64_param = value
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_message, timeout=30)
    return refused.value.code(), refused.value.details()


def test_a_grpc_output_in_shared_memory_asked_for_as_classes_is_refused_before_the_region_is_looked_up(
    triton: Triton,
) -> None:
    region = {"shared_memory_region": "nowhere", "shared_memory_byte_size": 64}
    assert _grpc_refusal(triton, {**region, "classification": 2}) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "output can't set both 'shared_memory_region' and 'classification'",
    )
    # the count is checked before that, and the region's parameters before the count, as in Triton
    assert _grpc_refusal(triton, {**region, "classification": 0}) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value for 'classification' parameter, expected >= 0",
    )
    assert _grpc_refusal(triton, {"shared_memory_byte_size": 64, "classification": 0}) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'OUT'",
    )


def test_an_answer_whose_binary_outputs_are_all_empty_goes_as_json(triton: Triton) -> None:
    # tritonserver 2.51 adds Inference-Header-Content-Length only when a binary output has bytes (its HTTP
    # classification of 0 elements crashes it: the plain output is compared here)
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [0], "data": []}],
        "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
    }
    status, headers, answer = request(triton.http_port, "POST", "/v2/models/u_FP32/infer", json.dumps(body))
    assert (status, headers["content-type"], "inference-header-content-length" in headers) == (
        200,
        "application/json",
        False,
    )
    output = {"name": "OUT", "datatype": "FP32", "shape": [0], "parameters": {"binary_data_size": 0}}
    assert json.loads(answer)["outputs"] == [output]


def test_a_row_longer_than_the_std_sort_replay_has_its_equal_values_by_position(triton: Triton) -> None:
    """std::sort's order was replayed in Python for every row with equal values, on the event loop: an output of a
    million zeros held every client for 4 s, of 64 MiB for minutes. Past TRITON_ORDER_MAX_VALUES values, equal
    values come by position (Triton's order differs there: a documented difference)."""
    values = np.zeros(TRITON_ORDER_MAX_VALUES + 1, np.int32)
    values[-1] = 1
    expected = ["1:16384", "0:0:zero", "0:1:one"]
    assert _grpc_classes(triton, "u_INT32", values, 3) == ("BYTES", [3], expected)


def test_the_top_classes_of_a_long_row_are_found_without_sorting_the_row() -> None:
    """A long row's order was an argsort of all of it (seconds of the event loop for 64 MiB, and 8 bytes of
    positions a value); a partition finds the top classes in linear time, in a copy of the row."""
    values = np.arange(1 << 22, dtype=np.uint8)  # 4 MiB of values, 16,384 of each, the top ones at the end
    values[100] = 255  # an equal value earlier: equal values come by position
    output = OutputTensor("OUT", "UINT8", values)
    tracemalloc.start()
    try:
        classes = top_classes(output, 2, batched=False, model="m")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert classes.array.tolist() == [b"255:100", b"255:255"]
    assert peak < 2 * values.nbytes  # an argsort's positions alone take 8 bytes a value
