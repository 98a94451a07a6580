"""How generate reads a request, as tritonserver 2.51 reads one (each answer measured against nvidia-pytriton 0.7).

Its keys in order, each an input or a parameter; a `parameters` object read the same way; a value's element count
spread over the input's shape, a batching model's rows included; the body's encoding identity only.
"""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.http_helpers import post_json, request


def _rows(requests):
    """Each request's INPUT0 doubled, and its shape once per element (so the answer shows the rows it got)."""
    return [
        {"OUTPUT0": r["INPUT0"] * 2, "shape": np.tile(np.array(r["INPUT0"].shape, np.int64), (len(r["INPUT0"]), 1))}
        for r in requests
    ]


def _pair(requests):
    return [{"sum": r["a"] + r["b"]} for r in requests]


def _grid(requests):
    return [{"shape": np.array(r["x"].shape, np.int64)} for r in requests]


def _echo(requests):
    """The text upper-cased, and the request's parameters as JSON (what the callable saw)."""
    return [
        {
            "text_output": np.char.upper(r["text_input"].astype(np.bytes_)).astype(object),
            "params": np.array([json.dumps(dict(sorted(r.parameters.items()))).encode()], dtype=object),
        }
        for r in requests
    ]


def _half(requests):
    return [{"h": np.array([1.5], np.float16)} for _ in requests]


def _bind(triton: Triton) -> None:
    rows_outputs = [
        Tensor(name="OUTPUT0", dtype=np.int32, shape=(2,)),
        Tensor(name="shape", dtype=np.int64, shape=(-1,)),
    ]
    triton.bind(
        "rows",
        _rows,
        inputs=[Tensor(name="INPUT0", dtype=np.int32, shape=(2,))],
        outputs=rows_outputs,
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind(
        "pair",
        _pair,
        inputs=[Tensor(name="a", dtype=np.int32, shape=(2,)), Tensor(name="b", dtype=np.int32, shape=(2,))],
        outputs=[Tensor(name="sum", dtype=np.int32, shape=(2,))],
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind(
        "grid",
        _grid,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1, -1))],
        outputs=[Tensor(name="shape", dtype=np.int64, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "echo",
        _echo,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,)), Tensor(name="params", dtype=bytes, shape=(1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "half",
        _half,
        inputs=[Tensor(name="n", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="h", dtype=np.float16, shape=(1,))],
        config=ModelConfig(batching=False),
    )


@pytest.fixture(scope="module")
def server():
    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as triton:
        yield triton


def _generate(server, model: str, body: bytes, headers=None):
    """POST a raw body to generate: status and JSON answer."""
    status, _, answer = request(server.http_port, "POST", f"/v2/models/{model}/generate", body, headers)
    return status, json.loads(answer)


def _error(server, model: str, document) -> str:
    """The 400 answer's message."""
    status, answer = post_json(server.http_port, f"/v2/models/{model}/generate", document)
    assert status == 400, answer
    return answer["error"]


def test_a_batching_model_gets_the_rows_the_values_fill(server):
    status, answer = post_json(server.http_port, "/v2/models/rows/generate", {"INPUT0": [1, 2, 3, 4]})
    assert status == 200
    assert answer == {"OUTPUT0": [2, 4, 6, 8], "model_name": "rows", "model_version": "1", "shape": [2, 2, 2, 2]}
    status, answer = post_json(server.http_port, "/v2/models/rows/generate", {"INPUT0": [5, 6]})
    assert (status, answer["OUTPUT0"], answer["shape"]) == (200, [10, 12], [1, 2])
    assert _error(server, "rows", {"INPUT0": list(range(10))}) == (
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'rows'"
    )
    assert _error(server, "rows", {"INPUT0": [1, 2, 3]}) == (
        "The schema can not convert input 'INPUT0' to tensor with proper shape"
    )
    assert _error(server, "pair", {"a": [1, 2, 3, 4], "b": [3, 4]}) == (
        "[request id: <id_unknown>] input 'a' batch size does not match other inputs for 'pair'"
    )


def test_the_innermost_variable_dim_takes_the_values(server):
    assert post_json(server.http_port, "/v2/models/grid/generate", {"x": [1, 2, 3, 4]})[1]["shape"] == [1, 4]
    assert post_json(server.http_port, "/v2/models/grid/generate", {"x": 5})[1]["shape"] == [1, 1]


def test_a_value_that_fits_no_shape(server):
    for value in (["a", "b"], []):
        assert _error(server, "echo", {"text_input": value}) == (
            "The schema can not convert input 'text_input' to tensor with proper shape"
        )
    # A nested list counts as many elements as it has items (Triton's reading): one row of [2] is no [[1, 2]].
    assert _error(server, "rows", {"INPUT0": [[1, 2]]}) == (
        "The schema can not convert input 'INPUT0' to tensor with proper shape"
    )
    assert post_json(server.http_port, "/v2/models/echo/generate", {"text_input": [["hi"]]})[1]["text_output"] == "HI"


def test_values_that_do_not_fit_are_refused_in_the_words_of_infer(server):
    # tritonserver 2.51 reads a generate value as /infer reads `data` (measured against nvidia-pytriton 0.7; a 500
    # there but for the string count): a count that the shape the value gave does not hold, values of the wrong type.
    assert _error(server, "grid", {"x": [[1, 2], [3]]}) == (
        "Unable to parse 'data': Shape does not match true shape of 'data' field"
    )
    assert _error(server, "grid", {"x": ["a"]}) == "Unable to parse 'data': attempt to access JSON non-number as double"
    assert _error(server, "echo", {"text_input": [[1]]}) == (
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
    )
    assert _error(server, "echo", {"id": "r", "text_input": [["a", "b"]]}) == (
        "[request id: r] unexpected number of string elements 2 for inference input 'text_input' for model 'echo', "
        "expecting 1"
    )
    # The string count is Triton's core's check: a later key's refusal comes first.
    assert _error(server, "echo", {"text_input": [["a", "b"]], "zz": [1]}).startswith("parameter 'zz' has invalid type")


def _seen(answer) -> dict:
    """The parameters the echo model's callable got."""
    return json.loads(answer["params"])


def test_the_parameters_object_holds_inputs_and_parameters(server):
    document = {"parameters": {"text_input": "hi", "p": 1}}
    status, answer = post_json(server.http_port, "/v2/models/echo/generate", document)
    assert (status, answer["text_output"], _seen(answer)) == (200, "HI", {"p": 1})
    # The id is a parameter too, as in Triton; a later key replaces an earlier one; an integer beyond INT64 a double.
    status, answer = post_json(
        server.http_port,
        "/v2/models/echo/generate",
        {"id": "7", "text_input": "x", "parameters": {"p": 2}, "p": 1, "big": 1 << 63},
    )
    assert status == 200 and answer["id"] == "7"
    assert _seen(answer) == {"big": 9.223372036854776e18, "id": "7", "p": 1}


def test_errors_in_the_parameters_object_name_it(server):
    assert _error(server, "echo", {"text_input": "a", "parameters": {"text_input": "b"}}) == (
        "Converting keyword: 'parameters': [request id: <id_unknown>] input 'text_input' already exists in request"
    )
    assert _error(server, "echo", {"text_input": "a", "parameters": {"p": {"a": 1}}}) == (
        "Converting keyword: 'parameters': parameter 'p' has invalid type. It should be either 'int', 'bool', or "
        "'string'."
    )
    # Triton answers these two with 500; here 400: the client sent them.
    for parameters in (3, None):
        assert _error(server, "echo", {"text_input": "a", "parameters": parameters}) == (
            "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"
        )
    assert _error(server, "echo", {"text_input": "a", "id": 7}) == (
        "Unable to parse 'id': attempt to access JSON non-string as string"
    )


def test_keys_are_read_in_order(server):
    # The parameter's type is checked as its key comes, before the inputs are counted.
    assert _error(server, "pair", {"extra": [1]}).startswith("parameter 'extra' has invalid type")
    assert _error(server, "pair", {"a": [1, 2, 3]}) == (
        "The schema can not convert input 'a' to tensor with proper shape"
    )


def test_an_input_given_twice_is_refused(server):
    status, answer = _generate(server, "echo", b'{"id": "r", "text_input": "a", "text_input": 5}')
    assert (status, answer) == (400, {"error": "[request id: r] input 'text_input' already exists in request"})
    status, answer = _generate(server, "echo", b'{"text_input": "a", "p": "\\"text_input\\""}')
    assert (status, _seen(answer)) == (200, {"p": '"text_input"'})


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_body_must_be_identity_encoded(server, route):
    path = f"/v2/models/echo/{route}"
    body = b'{"text_input": "a"}'
    refusal = {"error": "Unsupported content-encoding, only 'identity' is supported."}
    for encoding in ("gzip", "deflate", "br", "IDENTITY", ""):
        status, _, answer = request(server.http_port, "POST", path, body, {"Content-Encoding": encoding})
        assert (status, json.loads(answer)) == (400, refusal)
    status, _, _ = request(server.http_port, "POST", path, body, {"Content-Encoding": "identity"})
    assert status == 200
    status, _, answer = request(
        server.http_port, "POST", "/v2/models/nope/generate", b"{}", {"Content-Encoding": "gzip"}
    )
    assert status == 404  # the model is looked up first


def test_a_first_response_without_json_form_is_the_streams_one_event(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", "/v2/models/half/generate_stream", json.dumps({"n": 1}))
        response = connection.getresponse()
        assert (response.status, response.getheader("content-type")) == (400, "text/event-stream; charset=utf-8")
        assert response.read() == (
            b'data: {"error":"sending FP16 data via JSON is not supported. Please use the binary data format for '
            b'output"}\n\n'
        )
    finally:
        connection.close()
