"""Malformed requests get Triton's 4xx answers, model faults fail only their request, and the server keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import tracemalloc
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.transport import inflate
from pytriton.transport.http import app
from pytriton.triton import Triton
from tests.http_helpers import post_json, request
from tests.loop_turns import run_counting_turns

UNBOUNDED = inflate.InflationBudget(2**40)
GOOD = {"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}


def _identity(requests):
    return [{"OUTPUT_1": r["INPUT_1"]} for r in requests]


def _raises(requests):
    raise ValueError("the model broke")


def _bad_outputs(requests):
    kind = requests[0].parameters.get("kind")
    value = requests[0]["INPUT_1"]
    results = {
        "not-a-list": {"OUTPUT_1": value},
        "wrong-count": [],
        "not-a-dict": ["x"],
        "non-array": [{"OUTPUT_1": [1.0, 2.0]}],
        "str-object": [{"OUTPUT_1": np.array(["text"], dtype=object)}],
        "wrong-dtype": [{"OUTPUT_1": value.astype(np.int64)}],
        "wrong-shape": [{"OUTPUT_1": value.reshape(1, 2, 1)}],
        "unknown-name": [{"OUTPUT_1": value, "EXTRA": value}],
        "complex": [{"OUTPUT_1": value.astype(np.complex64)}],
    }
    return results[kind]


def _bind(triton: Triton) -> None:
    tensor = Tensor(dtype=np.float32, shape=(-1,))
    triton.bind("identity", _identity, inputs=[tensor], outputs=[tensor], config=ModelConfig(max_batch_size=2))
    triton.bind("raises", _raises, inputs=[tensor], outputs=[tensor])
    triton.bind("strict", _bad_outputs, inputs=[tensor], outputs=[tensor], strict=True)
    triton.bind("lenient", _bad_outputs, inputs=[tensor], outputs=[tensor], strict=False)


@pytest.fixture(scope="module")
def server():
    from tests.conftest import running_triton

    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


def _still_serving(server) -> None:
    status, document = post_json(server.http_port, "/v2/models/identity/infer", GOOD)
    assert status == 200 and document["outputs"][0]["data"] == [1, 2]


BAD_BODIES = {
    "not json": (b"{not json", 400, "failed to parse the request JSON"),
    "json array": (b"[1, 2]", 400, "must be an object"),
    "no inputs": (b"{}", 400, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    "inputs not list": (b'{"inputs": {}}', 400, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    "inputs null": (b'{"inputs": null}', 400, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    # A member that is null is there, as tritonserver 2.51 reads it (it answered these 500; served here before).
    "parameters null": (
        b'{"parameters": null, "inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
        400,
        "failed to get request params.: attempt to get members for non-object",
    ),
    "outputs null": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]}], "outputs": null}',
        400,
        "Unable to parse 'outputs': attempt to access JSON non-array as array",
    ),
    "input not object": (b'{"inputs": [1]}', 400, "JSON object"),
    "missing name": (b'{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}', 400, "'name'"),
    "unknown input": (
        b'{"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
        400,
        "unexpected inference input 'X' for model 'identity'",
    ),
    "an input too many": (  # the count is checked first, in Triton 2.51's words (its "]" included)
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]},'
        b' {"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
        400,
        "expected 1 inputs but got 2 inputs for model 'identity'. Got input(s) ['X','INPUT_1'], but missing "
        "required input(s) ]. Please provide all required input(s).",
    ),
    "wrong datatype": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}',
        400,
        "inference input 'INPUT_1' data-type is 'INT32', but model 'identity' expects 'FP32'",
    ),
    "unknown datatype": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP128", "data": [1]}]}',
        400,
        "invalid datatype for input INPUT_1",
    ),
    "wrong rank": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}',
        400,
        "unexpected shape for input 'INPUT_1' for model 'identity'. Expected [-1,-1], got [2]",
    ),
    "batch too large": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [3, 1], "datatype": "FP32", "data": [1, 2, 3]}]}',
        400,
        "inference request batch-size must be <= 2 for 'identity'",
    ),
    "negative dim": (  # tritonserver 2.51's words, as for the next ones (a 500 there)
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, -1], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    ),
    "shape not ints": (
        b'{"inputs": [{"name": "INPUT_1", "shape": ["1"], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    ),
    "shape of a float": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1.0], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    ),
    "shape not an array": (
        b'{"inputs": [{"name": "INPUT_1", "shape": 1, "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'shape': attempt to access JSON non-array as array",
    ),
    "no shape": (
        b'{"inputs": [{"name": "INPUT_1", "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'shape': attempt to access non-existing object member 'shape'",
    ),
    "no datatype": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "data": [1]}]}',
        400,
        "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'",
    ),
    "too few elements": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 3], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",  # Triton's words (a 500 there)
    ),
    "huge shape": (  # its data read first, as Triton's frontend reads it (tritonserver 2.51 ends in std::bad_alloc)
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 100000000000000], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    "huge shape of no elements": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [0, 100000000000000], "datatype": "FP32", "data": [1]}]}',
        400,
        "elements (or dimension) a tensor may have on this server",
    ),
    "ragged data": (  # read in order, as Triton reads it: 3 values for 2 (test_json_values: those that fit)
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [[1], [2, 3]]}]}',
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    "string data": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [{"a": 1}]}]}',
        400,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    # Triton refuses JSON values that are not numbers in numeric data (a 500, in these words); numpy would take null
    # as NaN, "2" as 2.0
    "null in numbers": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 3], "datatype": "FP32", "data": [1, null, 2]}]}',
        400,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    "string number": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [[1], ["2"]]}]}',
        400,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    "missing data": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32"}]}',
        400,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But no field is set",
    ),
    "missing input": (b'{"inputs": []}', 400, "expected 1 inputs but got 0 inputs for model 'identity'"),
    "duplicate input": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]},'
        b'{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
        400,
        "[request id: <id_unknown>] input 'INPUT_1' already exists in request",
    ),
    "request id named": (
        b'{"id": "abc-1", "inputs": [{"name": "INPUT_1", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}',
        400,
        "[request id: abc-1] unexpected shape for input 'INPUT_1' for model 'identity'. Expected [-1,-1], got [2]. "
        "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
        "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
        "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.",
    ),
    "data and binary data": (
        b'{"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1],'
        b' "parameters": {"binary_data_size": 4}}]}',
        400,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
    ),
    "id not string": (
        b'{"id": 5, "inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
        400,
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_json_bodies(server, case):
    body, status, message = BAD_BODIES[case]
    got_status, headers, raw = request(server.http_port, "POST", "/v2/models/identity/infer", body)
    assert got_status == status
    assert headers["content-type"] == "application/json"
    assert message in json.loads(raw)["error"]
    _still_serving(server)


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        ("abc", b"{}", "invalid Inference-Header-Content-Length"),
        ("-1", b"{}", "inference header size should be in range (0, 2), got: -1"),  # Triton's words
        ("1000", b"{}", "inference header size should be in range (0, 2), got: 1000"),
        ("2", b"{}\x00\x00\x00\x00", "'inputs'"),
    ],
)
def test_bad_inference_header_length(server, header, body, message):
    status, _, raw = request(
        server.http_port, "POST", "/v2/models/identity/infer", body, {"Inference-Header-Content-Length": header}
    )
    assert status == 400 and message in json.loads(raw)["error"]
    _still_serving(server)


def _binary_body(sizes, payload: bytes):
    document = {
        "inputs": [
            {"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": size}}
            for size in sizes
        ]
    }
    header = json.dumps(document).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize(
    ("sizes", "payload", "message"),
    [
        # nvidia-pytriton 0.7's words
        ([8], b"\x00" * 4, "unexpected size for input 'INPUT_1', expecting 4 additional bytes for model 'identity'"),
        ([8], b"\x00" * 12, "unexpected additional input data for model 'identity'"),
        ([4], b"\x00" * 4, "input byte size mismatch for input 'INPUT_1' for model 'identity'. Expected 8, got 4"),
        ([-1], b"", "non-negative"),
    ],
)
def test_bad_binary_sections(server, sizes, payload, message):
    body, headers = _binary_body(sizes, payload)
    status, _, raw = request(server.http_port, "POST", "/v2/models/identity/infer", body, headers)
    assert status == 400 and message in json.loads(raw)["error"]
    _still_serving(server)


@pytest.mark.parametrize("depth", [70, 1000])
def test_json_data_nested_deeper_than_any_tensor_is_read_in_order(server, depth):
    # The check for booleans among numbers once walked nested lists by recursion: 900 deep was a 500. Nesting says
    # nothing of the shape: tritonserver 2.51 reads the one value of 1000 lists deep too.
    data = "[" * depth + "1" + "]" * depth
    body = '{"inputs":[{"name":"INPUT_1","shape":[1,1],"datatype":"FP32","data":' + data + "}]}"
    status, _, answer = request(server.http_port, "POST", "/v2/models/identity/infer", body.encode())
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0]
    _still_serving(server)


@pytest.mark.parametrize("key", ["triton_x", "triton_enable_empty_final_response"])
def test_a_triton_parameter_key_is_refused_in_tritons_words(server, key):
    # tritonserver 2.51 takes triton_enable_empty_final_response over gRPC only (its streams' empty final response).
    body = {**GOOD, "parameters": {key: True}}
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    assert (status, document["error"]) == (
        400,
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
    )


def test_an_unknown_input_is_named_without_the_request_id_as_triton_does(server):
    body = {"id": "7", "inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    assert (status, document["error"]) == (400, "unexpected inference input 'X' for model 'identity'")


_INDICATOR = (
    "[request id: <id_unknown>] incomplete string length indicator for inference input 'INPUT_1' for model 'text', "
    "expecting 4 bytes but only {} bytes available. Please make sure the string length indicator is in one buffer."
)


@pytest.mark.parametrize(
    ("count", "payload", "message"),
    [
        (
            1,
            b"\xff\x00\x00\x00ab",
            "incomplete string data for inference input 'INPUT_1', expecting string of length 255 but only 2 bytes "
            "available",
        ),
        (1, b"\x0a\x00", _INDICATOR.format(2)),
        (1, b"\x01\x00\x00\x00a\x01", _INDICATOR.format(1)),
        (
            2,
            b"\x01\x00\x00\x00a",
            "[request id: <id_unknown>] expected 2 string elements for inference input 'INPUT_1' for model 'text', "
            "got 1",
        ),
        (
            1,
            b"\x01\x00\x00\x00a\x01\x00\x00\x00b",
            "[request id: <id_unknown>] unexpected number of string elements 2 for inference input 'INPUT_1' for model "
            "'text', expecting 1",
        ),
    ],
    ids=["string cut short", "length cut short", "length cut short after the last", "too few", "too many"],
)
def test_bad_bytes_encoding_in_binary_gets_tritons_messages(count, payload, message):
    def bind(triton: Triton) -> None:
        triton.bind(
            "text", _identity, inputs=[Tensor(dtype=bytes, shape=(-1,))], outputs=[Tensor(dtype=bytes, shape=(-1,))]
        )

    from tests.conftest import running_triton

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        tensor = {"name": "INPUT_1", "shape": [1, count], "datatype": "BYTES"}
        document = {"inputs": [{**tensor, "parameters": {"binary_data_size": len(payload)}}]}
        header = json.dumps(document).encode()
        status, _, raw = request(
            triton.http_port,
            "POST",
            "/v2/models/text/infer",
            header + payload,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert (status, json.loads(raw)["error"]) == (400, message)  # as nvidia-pytriton 0.7 answers


def test_model_exception_is_500_with_message(server):
    status, document = post_json(server.http_port, "/v2/models/raises/infer", GOOD)
    assert status == 500 and "the model broke" in document["error"]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inputs = [httpclient.InferInput("INPUT_1", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(httpclient.InferenceServerException, match="the model broke"):
        client.infer("raises", inputs)
    _still_serving(server)


FAULTS_BOTH_MODES = {
    "not-a-list": "must be list of response dicts",
    "wrong-count": "does not match number of requests (1)",
    "not-a-dict": "must be list of response dicts",
    # NVIDIA's words, then which output is wrong, what it is and the fix.
    "non-array": "are numpy arrays: output `OUTPUT_1` is a list ([1.0, 2.0]); return it as a numpy array",
    "str-object": "Use string/byte-string instead of object",
    "complex": "dtype.kind",
}
FAULTS_STRICT_ONLY = {
    "wrong-dtype": "has invalid type",
    "wrong-shape": "has invalid shapes",
    "unknown-name": "is not defined in model config",
}


def _infer_kind(server, model: str, kind: str):
    body = dict(GOOD, parameters={"kind": kind})
    return post_json(server.http_port, f"/v2/models/{model}/infer", body)


@pytest.mark.parametrize("kind", sorted(FAULTS_BOTH_MODES))
@pytest.mark.parametrize("model", ["strict", "lenient"])
def test_wrong_outputs_fail_in_both_modes(server, model, kind):
    status, document = _infer_kind(server, model, kind)
    assert status == 500 and FAULTS_BOTH_MODES[kind] in document["error"]
    _still_serving(server)


@pytest.mark.parametrize("kind", sorted(FAULTS_STRICT_ONLY))
def test_wrong_outputs_fail_only_in_strict_mode(server, kind):
    status, document = _infer_kind(server, "strict", kind)
    assert status == 500 and FAULTS_STRICT_ONLY[kind] in document["error"]
    status, document = _infer_kind(server, "lenient", kind)
    assert status == 200 and [o["name"] for o in document["outputs"]] == ["OUTPUT_1"]
    if kind == "wrong-dtype":  # cast to the declared datatype, as NVIDIA's proxy does (astype)
        assert document["outputs"][0]["datatype"] == "FP32" and document["outputs"][0]["data"] == [1.0, 2.0]


def test_an_undeclared_output_is_dropped_with_one_warning_per_model_and_name(start_triton, caplog):
    # Without strict the output is left out, as NVIDIA's PyTriton leaves it out; the operator hears of it once.
    caplog.set_level(logging.WARNING, logger="pytriton.model")

    def extras(requests):
        return [{"OUTPUT_1": r["INPUT_1"], "EXTRA": r["INPUT_1"], "OTHER": r["INPUT_1"]} for r in requests]

    def bind(triton: Triton) -> None:
        tensor = Tensor(dtype=np.float32, shape=(-1,))
        for name in ("first", "second"):
            triton.bind(name, extras, inputs=[tensor], outputs=[tensor], strict=False)

    triton = start_triton(bind, allow_grpc=False, allow_metrics=False)
    for model in ("first", "second", "first", "second", "first"):
        status, document = post_json(triton.http_port, f"/v2/models/{model}/infer", GOOD)
        assert status == 200 and [output["name"] for output in document["outputs"]] == ["OUTPUT_1"]
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warnings == [
        f"model '{model}' version 1: the inference callable returned output '{name}', which the model config does "
        "not declare; it is left out of the responses (declare it in `outputs`, or bind with strict=True to refuse "
        "it). Logged once for this output."
        for model in ("first", "second")
        for name in ("EXTRA", "OTHER")
    ]


def test_a_batch_callable_returning_a_list_gets_a_message_that_names_the_fix(start_triton):
    @batch
    def listy(INPUT_1):
        return {"OUTPUT_1": INPUT_1.tolist()}

    def bind(triton: Triton) -> None:
        tensor = Tensor(dtype=np.float32, shape=(-1,))
        triton.bind("listy", listy, inputs=[tensor], outputs=[tensor], config=ModelConfig(max_batch_size=2))

    triton = start_triton(bind, allow_grpc=False, allow_metrics=False)
    status, document = post_json(triton.http_port, "/v2/models/listy/infer", GOOD)
    # It was "AttributeError: 'list' object has no attribute 'shape'", raised inside @batch.
    assert (status, document["error"]) == (
        500,
        "PyTritonValidationError: Not all values returned by `listy` model callable are numpy arrays: output "
        "`OUTPUT_1` is a list ([[1.0, 2.0]]); return it as a numpy array (np.asarray(...))",
    )


@pytest.mark.parametrize(
    "path", ["/v2/", "/v2/models/identity/", "/v2/models/identity/versions/x", "/v2/models/identity/versions/1/"]
)
def test_paths_triton_does_not_route_are_404(server, path):
    # Triton's routes are regular expressions with no trailing slash and a version of digits.
    status, _, body = request(server.http_port, "GET", path)
    assert status == 404 and json.loads(body) == {"error": "Not Found"}
    assert request(server.http_port, "GET", path.rstrip("/").replace("versions/x", "versions/1"))[0] == 200


@pytest.mark.parametrize(
    "path, status",
    [
        ("/v2/models/identity%2Fready", 404),  # one segment: the metadata of a model "identity/ready"
        ("/v2%2Fhealth%2Fready", 404),
        ("/v2/health%2Fready", 404),
        ("/v2/models/identity%2F", 404),
        ("/v2/models/ident%69ty/ready", 200),  # tritonclient percent-encodes model names
        ("/v2/models/identity/versions/%31/ready", 200),
    ],
)
def test_an_encoded_slash_stays_inside_its_path_segment(server, path, status):
    # The ASGI path is decoded whole: routed on it, "identity%2Fready" was the ready endpoint of "identity".
    assert request(server.http_port, "GET", path)[0] == status


def test_an_encoded_slash_does_not_reach_another_route_with_a_body(server):
    document = {"inputs": [{"name": "INPUT_1", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    # The metadata route of a model "identity/infer", which takes GET only (Triton: 405 too).
    assert post_json(server.http_port, "/v2/models/identity%2Finfer", document)[0] == 405
    status, answer = request(server.http_port, "GET", "/v2/models/identity%2Finfer")[0::2]
    assert status == 404 and "identity/infer" in json.loads(answer)["error"]
    assert post_json(server.http_port, "/v2/models/ident%69ty/infer", document)[0] == 200


def test_a_name_encoding_bytes_that_are_no_utf8_is_named_as_sent(server):
    # tritonserver 2.51 quotes the name as sent ('ident%C3%28ty'); this server named 'ident\ufffd(ty'.
    status, _, answer = request(server.http_port, "GET", "/v2/models/ident%C3%28ty")
    assert (status, json.loads(answer)) == (404, {"error": "Request for unknown model: 'ident%C3%28ty' is not found"})


def test_an_output_requested_twice_comes_once_and_the_id_comes_first(server):
    body = dict(GOOD, id="req-7", outputs=[{"name": "OUTPUT_1"}, {"name": "OUTPUT_1"}])
    status, _, raw = request(server.http_port, "POST", "/v2/models/identity/infer", json.dumps(body))
    assert status == 200 and raw.startswith(b'{"id":"req-7","model_name":"identity","model_version":"1","outputs":[')
    assert [output["name"] for output in json.loads(raw)["outputs"]] == ["OUTPUT_1"]  # as Triton answers


def test_an_empty_binary_input_needs_no_binary_section(server):
    document = {
        "inputs": [{"name": "INPUT_1", "shape": [1, 0], "datatype": "FP32", "parameters": {"binary_data_size": 0}}]
    }
    body = json.dumps(document).encode()
    headers = {"Inference-Header-Content-Length": str(len(body))}
    status, _, raw = request(server.http_port, "POST", "/v2/models/identity/infer", body, headers)
    assert status == 200 and json.loads(raw)["outputs"][0]["shape"] == [1, 0]


def test_classification_over_http_as_nvidia_pytriton_answers_it(server):
    # Answered side by side by nvidia-pytriton 0.7: ["3.000000:1", "2.000000:2"], shape [1, 2].
    body = {
        "inputs": [{"name": "INPUT_1", "shape": [1, 3], "datatype": "FP32", "data": [1, 3, 2]}],
        "outputs": [{"name": "OUTPUT_1", "parameters": {"classification": 2}}],
    }
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    assert status == 200
    assert document["outputs"] == [
        {"name": "OUTPUT_1", "datatype": "BYTES", "shape": [1, 2], "data": ["3.000000:1", "2.000000:2"]}
    ]
    body["outputs"][0]["parameters"]["classification"] = 0  # none asked: the output as it is
    assert post_json(server.http_port, "/v2/models/identity/infer", body)[1]["outputs"][0]["data"] == [1.0, 3.0, 2.0]
    body["outputs"][0]["parameters"]["classification"] = "x"
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    message = "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"
    assert (status, document) == (400, {"error": message})  # Triton's words (a 500 there)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_an_outputs_binary_data_that_is_no_boolean_is_refused_in_tritons_words(server, value):
    # tritonserver 2.51: 500 {"error":"Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"}
    # for "true", 1 and null alike (400 here: the client sent it). It was read as false.
    body = dict(GOOD, outputs=[{"name": "OUTPUT_1", "parameters": {"binary_data": value}}])
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    assert status == 400
    assert document["error"] == "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("priority", -1, "unsigned-integer"),
        ("priority", "1", "unsigned-integer"),
        ("priority", 1.0, "unsigned-integer"),
        ("priority", True, "unsigned-integer"),
        ("priority", None, "unsigned-integer"),
        ("priority", {}, "unsigned-integer"),
        ("priority", 1 << 64, "unsigned-integer"),
        ("timeout", -1, "unsigned-integer"),
        ("timeout", "100", "unsigned-integer"),
        ("timeout", [1], "unsigned-integer"),
        ("binary_data_output", 1, "boolean"),
        ("binary_data_output", "x", "boolean"),
    ],
)
def test_a_reserved_parameter_of_the_wrong_type_is_refused_in_tritons_words(server, key, value, kind):
    # tritonserver 2.51 reads priority and timeout as unsigned 64-bit integers and binary_data_output as a boolean,
    # before any other check of a parameter's type: 500 {"error":"Unable to parse 'priority': attempt to access JSON
    # non-unsigned-integer as unsigned-integer"} for -1, "1", 1.0, true, null, {} and 2**64 alike (400 here: the
    # client sent it).
    status, document = post_json(server.http_port, "/v2/models/identity/infer", dict(GOOD, parameters={key: value}))
    assert status == 400
    noun = "non-unsigned-integer as unsigned-integer" if kind == "unsigned-integer" else "non-boolean as boolean"
    assert document["error"] == f"Unable to parse '{key}': attempt to access JSON {noun}"


@pytest.mark.parametrize("parameters", [{"priority": 0}, {"priority": (1 << 64) - 1}, {"timeout": (1 << 64) - 1}])
def test_reserved_integers_take_the_whole_unsigned_range(server, parameters):
    # tritonserver 2.51 serves these: priority 0 or past the levels is the default level; a timeout is a limit.
    status, _ = post_json(server.http_port, "/v2/models/identity/infer", dict(GOOD, parameters=parameters))
    assert status == 200


def test_sequence_parameters_are_taken_and_ignored_and_checked(server):
    body = dict(GOOD, parameters={"sequence_id": "s-1", "sequence_start": True, "sequence_end": False})
    assert post_json(server.http_port, "/v2/models/identity/infer", body)[0] == 200
    body["parameters"]["sequence_start"] = 1
    status, document = post_json(server.http_port, "/v2/models/identity/infer", body)
    # tritonserver 2.51: 500 {"error":"Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"}
    # (400 here: the client sent it).
    assert status == 400
    assert document["error"] == "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"


def test_a_compressed_body_is_inflated_a_step_at_a_time_letting_the_loop_serve_others():
    # One 33 KB request inflating to 64 MiB held every other connection for half a second.
    body = gzip.compress(bytes(3 * inflate.STEP_BYTES + 5))
    inflated, turns = run_counting_turns(lambda: app._decompress(body, "gzip", 2**30, UNBOUNDED))
    assert turns >= 3  # the loop ran between the steps
    assert inflated == bytes(3 * inflate.STEP_BYTES + 5)


_GOOD_BYTES = json.dumps(GOOD).encode()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (gzip.compress(_GOOD_BYTES, mtime=0)[:-8], 400, "the gzip stream is truncated"),  # no CRC and size
        (gzip.compress(_GOOD_BYTES, mtime=0) + b"junk", 400, "failed to decompress the request body"),
        (gzip.compress(_GOOD_BYTES[:20], mtime=0) + gzip.compress(_GOOD_BYTES[20:], mtime=0), 200, ""),
    ],
    ids=["truncated", "junk after", "two members"],
)
def test_a_gzip_body_is_checked_to_its_end_and_may_have_several_members(server, body, status, message):
    headers = {"Content-Encoding": "gzip"}
    got, _, raw = request(server.http_port, "POST", "/v2/models/identity/infer", body, headers)
    assert got == status and (not message or message in json.loads(raw)["error"])


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", zlib.compress(_GOOD_BYTES)),
        ("deflate", gzip.compress(_GOOD_BYTES)),
        ("x-gzip", zlib.compress(_GOOD_BYTES)),
    ],
    ids=["gzip-with-zlib-header", "deflate-with-gzip-header", "x-gzip-with-zlib-header"],
)
def test_either_coding_may_come_with_a_gzip_or_a_zlib_header(server, encoding, body):
    # tritonserver 2.51 inflates both codings with zlib's 15 | 32, which reads either header: each is a 200 there
    # (nvidia-pytriton 0.7, probed); this server refused them, `incorrect header check`.
    got, _, raw = request(server.http_port, "POST", "/v2/models/identity/infer", body, {"Content-Encoding": encoding})
    assert got == 200, raw


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_an_empty_compressed_body_is_nothing_to_be_decompressed(server, encoding):
    # tritonserver 2.51's words for it (nvidia-pytriton 0.7, probed); this server said the stream was truncated.
    got, headers, raw = request(
        server.http_port, "POST", "/v2/models/identity/infer", b"", {"Content-Encoding": encoding}
    )
    assert (got, headers["content-type"], json.loads(raw)) == (
        400,
        "text/plain",
        {"error": "nothing to be decompressed"},
    )


def test_a_compressed_body_with_bytes_after_its_end_is_refused_and_ends():
    # Past its first step, the rest of such a body came back as unconsumed input for ever: the request spun a
    # core and grew without end.
    for encoding, body in (
        ("deflate", zlib.compress(bytes(2 * inflate.STEP_BYTES)) + b"x"),
        ("gzip", gzip.compress(bytes(2 * inflate.STEP_BYTES)) + b"x"),  # read as a next member, cut short
    ):
        with pytest.raises(app.HttpError, match=r"bytes after the end of the deflate stream|stream is truncated"):
            asyncio.run(asyncio.wait_for(app._decompress(body, encoding, 2**30, UNBOUNDED), 10))


def test_a_gzip_body_of_more_members_than_max_members_is_refused_at_once():
    # Millions of empty members (20 bytes each) cost 18 us each, 60 s of CPU for one 60 MiB body.
    member = gzip.compress(b"", mtime=0)
    inflated = asyncio.run(app._decompress(member * inflate.MAX_MEMBERS, "gzip", 2**30, UNBOUNDED))
    assert inflated == b""
    with pytest.raises(app.HttpError, match=f"more than {inflate.MAX_MEMBERS} gzip members"):
        asyncio.run(app._decompress(member * (inflate.MAX_MEMBERS + 1), "gzip", 2**30, UNBOUNDED))


def test_an_inflation_that_fails_lets_go_of_what_it_inflated_while_its_error_lives():
    # The error's traceback holds the inflating frames; in a cancelled gRPC call it sat in a reference cycle,
    # and a bomb's gigabytes waited for the cycle collector.
    body = gzip.compress(bytes(64 * 2**20))
    tracemalloc.start()
    try:
        with pytest.raises(inflate.InflateError) as raised:
            asyncio.run(inflate.inflate(body, 31, 32 * 2**20))
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raised.value.failure is inflate.Failure.TOO_LARGE and raised.traceback
    assert current < 4 * 2**20, f"{current} bytes still held"
