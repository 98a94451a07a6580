"""`http_header_forward_pattern` / `grpc_header_forward_pattern` as tritonserver 2.51 (nvidia-pytriton 0.7) reads them.

Measured on 0.7 with a callable that answers its `request.parameters`: the pattern matches anywhere in a header's
name, case-insensitively unless it starts with RE2's `(?-i)`; HTTP headers reach the callable named as the client
wrote them (`X-Fwd-A`, beside a JSON parameter `x-fwd-a`), gRPC metadata lower-case as HTTP/2 carries it.
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Dict, Iterator, List, Optional, Tuple

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.header_forwarding import forward_pattern
from pytriton.triton import Triton, TritonConfig
from tests.conftest import grpc_url, running_triton


def _parameters(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [
        {"p": np.array([json.dumps(request.parameters, sort_keys=True).encode()], dtype=object)} for request in requests
    ]


def _bind(triton: Triton) -> None:
    triton.bind(
        "params",
        _parameters,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="p", dtype=bytes, shape=(1,))],
        config=ModelConfig(batching=False),
    )


def _serve(pattern: str, frontends: Optional[int] = None) -> Any:
    return running_triton(
        _bind,
        allow_metrics=False,
        http_header_forward_pattern=pattern,
        grpc_header_forward_pattern=pattern,
        frontends=frontends,
    )


def _over_http(triton: Triton, headers: List[Tuple[str, str]]) -> Dict[str, Any]:
    """What the callable saw of a request with these headers (sent in this case, in this order)."""
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "parameters": {"x-fwd-a": "param"}}
    ).encode()
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/params/infer")
        for name, value in headers:
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, answer
    finally:
        connection.close()
    parameters: Dict[str, Any] = json.loads(json.loads(answer)["outputs"][0]["data"][0])
    return parameters


def _over_grpc(triton: Triton, metadata: Tuple[Tuple[str, str], ...]) -> Dict[str, Any]:
    request = service_pb2.ModelInferRequest(model_name="params")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata)
    parameters: Dict[str, Any] = json.loads(response.raw_output_contents[0][4:])
    return parameters


_HEADERS = [("X-Fwd-A", "1"), ("X-FWD-B", "2"), ("my-x-fwd-c", "3"), ("x-other", "4")]
_METADATA = (("x-fwd-a", "1"), ("my-x-fwd-c", "3"), ("x-other", "4"))


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends-3"])
def insensitive(request: pytest.FixtureRequest) -> Iterator[Triton]:
    with _serve("X-FWD-.*", request.param) as server:
        yield server


def test_the_pattern_matches_any_case_anywhere_and_headers_keep_the_case_they_were_sent_in(insensitive: Triton) -> None:
    assert _over_http(insensitive, _HEADERS) == {"X-FWD-B": "2", "X-Fwd-A": "1", "my-x-fwd-c": "3", "x-fwd-a": "param"}
    assert _over_grpc(insensitive, _METADATA) == {"my-x-fwd-c": "3", "x-fwd-a": "1"}


def test_a_header_sent_twice_forwards_its_last_value_over_a_parameter_of_its_name(insensitive: Triton) -> None:
    assert _over_http(insensitive, [("x-fwd-a", "1"), ("x-fwd-a", "2")]) == {"x-fwd-a": "2"}


def test_res2s_case_sensitive_flag_turns_the_case_back_on() -> None:
    with _serve("(?-i)X-FWD-.*") as server:
        assert _over_http(server, _HEADERS) == {"X-FWD-B": "2", "x-fwd-a": "param"}
        assert _over_grpc(server, _METADATA) == {}


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("a(?-i)B|c", ["AB", "aB", "xcx"], ["Ab", "ab", "C"]),
        ("(x(?-i)Y|q)z", ["XYZ", "xYz", "qZ"], ["xyz", "XyZ", "QZ"]),
        ("[(?-i)]", ["(", "I"], ["~"]),  # a class: its "(?-i)" is no flag group
        ("(?s)a.(?-i)B", ["a\nB", "A\nB"], ["a\nb"]),
    ],
)
def test_re2_flag_groups_apply_to_the_rest_of_their_group_and_its_alternatives(
    pattern: str, matches: List[str], misses: List[str]
) -> None:
    compiled = forward_pattern(pattern, "http_header_forward_pattern")
    assert [name for name in matches + misses if compiled.search(name)] == matches


@pytest.mark.parametrize("pattern", ["(", "(?U)a"])
def test_a_pattern_this_server_cannot_read_is_refused_before_it_starts(pattern: str) -> None:
    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0, grpc_header_forward_pattern=pattern)
    with pytest.raises(PyTritonValidationError, match=r"grpc_header_forward_pattern: .* is not a regular expression"):
        Triton(config=config)
