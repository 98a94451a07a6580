"""Long infer decodes and encodes run in a worker thread (transport/codec_threads.py), not on the loop.

A large JSON request, a large binary BYTES input, a large output asked for as JSON or BYTES (HTTP), many strings
in a request or an answer (gRPC, unary and streamed): the codec's pool is
replaced by a gated one, so the request's decode (or its answer's encode) waits at the gate while another client's
health check is answered, which a decode on the loop (done before the gate could even be reached) would not allow.
No timing: the order of answers is what is asserted. The answers, refusals included, are those of the codec run on
the loop (its thresholds raised), byte for byte. That the worker leaves the GIL to the loop between its pieces is
tests/test_json_pieces.py's.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import queue
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.protocol import codec_place, http_codec
from pytriton.transport import codec_threads
from pytriton.triton import Triton
from tests.conftest import HTTP_AUTH, grpc_url, http_url, running_triton
from tests.gated_threads import GatedThreads, another_client_answered, gated_pool
from tests.test_system_shared_memory import Segment

# Values of a large JSON request (about 400 KB of JSON: over OFF_LOOP_JSON_BYTES) and of a large output.
LARGE = 65536
assert LARGE * 6 > codec_place.OFF_LOOP_JSON_BYTES and LARGE > codec_place.OFF_LOOP_VALUES


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": request["in"]} for request in requests]


# FP32 values of an output whose binary answer is joined off the loop (an output the callable made: copied).
JOINED = 2 * codec_threads.OFF_LOOP_JOIN_BYTES // 4


def _fill(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": np.arange(JOINED, dtype=np.float32) + request["in"][0]} for request in requests]


def _count(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": np.array([request["in"].size], np.int64)} for request in requests]


def _strings(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": np.array([b"s%07d" % index for index in range(LARGE)], np.object_)} for _ in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "strings",
        _strings,
        inputs=[Tensor(name="in", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="out", dtype=bytes, shape=(LARGE,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "count",
        _count,
        inputs=[Tensor(name="in", dtype=bytes, shape=(-1,))],
        outputs=[Tensor(name="out", dtype=np.int64, shape=(1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "fill",
        _fill,
        inputs=[Tensor(name="in", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="out", dtype=np.float32, shape=(JOINED,))],
        config=ModelConfig(batching=False),
    )
    for name, dtype in (("fp32", np.float32), ("bytes", bytes)):
        triton.bind(
            name,
            _identity,
            inputs=[Tensor(name="in", dtype=dtype, shape=(-1,))],
            outputs=[Tensor(name="out", dtype=dtype, shape=(-1,))],
            config=ModelConfig(batching=False),
        )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False) as server:
        yield server


@pytest.fixture
def coders(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedThreads]:
    yield from gated_pool(monkeypatch, codec_threads, "CODERS")


def _post(
    triton: Triton, model: str, body: bytes, header_length: Optional[int] = None
) -> Tuple[int, Dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=60)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _json_fp32(values: List[float], binary_out: bool = True) -> bytes:
    return json.dumps(
        {
            "inputs": [{"name": "in", "datatype": "FP32", "shape": [len(values)], "data": values}],
            "outputs": [{"name": "out", "parameters": {"binary_data": binary_out}}],
        }
    ).encode()


def _binary_bytes(strings: List[bytes], binary_out: bool = True) -> Tuple[bytes, int]:
    raw = b"".join(struct.pack("<I", len(item)) + item for item in strings)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "in",
                    "datatype": "BYTES",
                    "shape": [len(strings)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": binary_out}}],
        }
    ).encode()
    return head + raw, len(head)


def _binary_fp32(values: np.ndarray, binary_out: bool = False) -> Tuple[bytes, int]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "in",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": binary_out}}],
        }
    ).encode()
    return head + values.tobytes(), len(head)


def _answered_after_others(
    triton: Triton, coders: GatedThreads, model: str, body: bytes, header_length: Optional[int] = None
) -> Tuple[int, Dict[str, str], bytes]:
    """Post `body` while the coders' gate is shut: a health check answered first, then the gate opened."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        large = pool.submit(_post, triton, model, body, header_length)
        assert coders.submitted.wait(30), "the large message was not left to a worker thread"
        assert [another_client_answered(triton) for _ in range(3)] == [True, True, True]
        assert not large.done()  # its decode or encode waits at the gate: answered after the others
        coders.gate.set()
        return large.result(60)


def test_a_large_json_request_is_decoded_while_other_clients_are_answered(triton: Triton, coders: GatedThreads) -> None:
    values = [index * 0.25 for index in range(LARGE)]
    status, headers, body = _answered_after_others(triton, coders, "fp32", _json_fp32(values))
    assert status == 200
    header_length = int(headers["Inference-Header-Content-Length"])
    assert (np.frombuffer(body[header_length:], np.float32) == np.array(values, np.float32)).all()


def test_a_large_binary_bytes_input_is_decoded_while_other_clients_are_answered(
    triton: Triton, coders: GatedThreads
) -> None:
    strings = [b"s%07d" % index for index in range(LARGE)]
    body, header_length = _binary_bytes(strings)
    assert len(body) - header_length > codec_place.OFF_LOOP_STRING_BYTES
    status, headers, answer = _answered_after_others(triton, coders, "bytes", body, header_length)
    assert status == 200
    assert answer[int(headers["Inference-Header-Content-Length"]) :] == body[header_length:]


def test_a_large_binary_bytes_input_of_a_header_seen_before_is_decoded_off_the_loop(
    triton: Triton, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A header sent twice is kept (http_codec's plans): the third request's decode goes by the plan.
    # (A model that answers with a count: only the decode is long.)
    strings = [b"t%07d" % index for index in range(LARGE)]
    body, header_length = _binary_bytes(strings)
    assert [_post(triton, "count", body, header_length)[0] for _ in range(2)] == [200, 200]
    gated = GatedThreads()
    monkeypatch.setattr(codec_threads, "CODERS", gated)
    try:
        status, headers, answer = _answered_after_others(triton, gated, "count", body, header_length)
    finally:
        gated.gate.set()
    assert status == 200
    assert np.frombuffer(answer[int(headers["Inference-Header-Content-Length"]) :], np.int64).tolist() == [LARGE]


def test_a_large_json_answer_is_encoded_while_other_clients_are_answered(triton: Triton, coders: GatedThreads) -> None:
    values = np.arange(LARGE, dtype=np.float32) * 0.1
    body, header_length = _binary_fp32(values)
    status, _, answer = _answered_after_others(triton, coders, "fp32", body, header_length)
    assert status == 200
    assert json.loads(answer)["outputs"][0]["data"] == values.astype(np.float64).tolist()


def test_a_large_binary_answer_is_joined_while_other_clients_are_answered(triton: Triton, coders: GatedThreads) -> None:
    body, header_length = _binary_fp32(np.array([2.0], np.float32), binary_out=True)
    status, headers, answer = _answered_after_others(triton, coders, "fill", body, header_length)
    assert status == 200
    values = np.frombuffer(answer[int(headers["Inference-Header-Content-Length"]) :], np.float32)
    assert (values == np.arange(JOINED, dtype=np.float32) + 2).all()


def test_a_small_request_is_decoded_and_answered_on_the_loop(triton: Triton, coders: GatedThreads) -> None:
    # Under the thresholds: no thread's round trip (the gate, never opened, would hold it).
    status, _, answer = _post(triton, "fp32", _json_fp32([1.5, 2.5], binary_out=False))
    assert status == 200
    assert json.loads(answer)["outputs"][0]["data"] == [1.5, 2.5]
    body, header_length = _binary_bytes([b"a", b"bc"], binary_out=False)
    status, _, answer = _post(triton, "bytes", body, header_length)
    assert (status, json.loads(answer)["outputs"][0]["data"]) == (200, ["a", "bc"])
    assert not coders.submitted.is_set()


def _spaced_values() -> bytes:
    values = b", ".join(b"%d.5" % (index % 100) for index in range(LARGE))
    return b'{"inputs": [{"name": "in", "datatype": "FP32", "shape": [%d], "data": [%s]}]}' % (LARGE, values)


def _strings_json(strings: List[str], datatype: str = "BYTES") -> bytes:
    return json.dumps(
        {"inputs": [{"name": "in", "datatype": datatype, "shape": [len(strings)], "data": strings}]}
    ).encode()


_VALUES = [index * 0.5 for index in range(LARGE)]
# Large requests, each decoded off the loop and answered as the codec on the loop answers it.
LARGE_REQUESTS: Dict[str, Tuple[str, bytes]] = {
    "valid": ("fp32", _json_fp32(_VALUES, binary_out=False)),
    "spaced": ("fp32", _spaced_values()),
    "nested": (
        "fp32",
        _json_fp32(_VALUES)
        .replace(b'"shape": [%d]' % LARGE, b'"shape": [1, %d]' % LARGE)
        .replace(b'"data": [', b'"data": [[')
        .replace(b"]}], ", b"]]}], ", 1),
    ),
    "not JSON": ("fp32", _json_fp32(_VALUES)[:-5]),
    "trailing comma": ("fp32", _json_fp32(_VALUES).replace(b"]}]", b",]}]", 1)),
    "NaN": ("fp32", _json_fp32(_VALUES).replace(b"0.5,", b"NaN,", 1)),
    "a string value": ("fp32", _json_fp32(_VALUES).replace(b"0.5,", b'"0.5",', 1)),
    "a boolean value": ("fp32", _json_fp32(_VALUES).replace(b"0.5,", b"true,", 1)),
    "too large for FP32": ("fp32", _json_fp32(_VALUES).replace(b"0.5,", b"1e39,", 1)),
    "too many values": ("fp32", _json_fp32(_VALUES).replace(b'"shape": [%d]' % LARGE, b'"shape": [%d]' % (LARGE - 1))),
    "a byte order mark": ("fp32", b"\xef\xbb\xbf" + _json_fp32(_VALUES)),
    "strings": ("bytes", _strings_json([f's{index},"]' for index in range(LARGE)])),
    "a number among strings": ("bytes", _strings_json([f"s{index}" for index in range(LARGE)]).replace(b'"s7"', b"7")),
    "strings as FP32": ("fp32", _strings_json([f"s{index}" for index in range(LARGE)], "FP32")),
    "FP16 as JSON": ("fp32", _json_fp32(_VALUES).replace(b'"FP32"', b'"FP16"')),
}


@pytest.mark.parametrize("case", list(LARGE_REQUESTS))
def test_a_large_request_is_answered_as_on_the_loop(triton: Triton, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    model, body = LARGE_REQUESTS[case]
    assert len(body) >= codec_place.OFF_LOOP_JSON_BYTES
    submitted: List[int] = []
    submit = codec_threads.CODERS.submit
    monkeypatch.setattr(codec_threads.CODERS, "submit", lambda job: submitted.append(1) or submit(job))
    off_loop = _post(triton, model, body)
    assert submitted, "not decoded off the loop"
    monkeypatch.setattr(http_codec, "OFF_LOOP_JSON_BYTES", 1 << 40)
    monkeypatch.setattr(http_codec, "OFF_LOOP_VALUES", 1 << 40)
    on_loop = _post(triton, model, body)
    assert (off_loop[0], off_loop[2]) == (on_loop[0], on_loop[2])
    assert off_loop[1].get("Content-Type") == on_loop[1].get("Content-Type")


@pytest.fixture
def segment(triton: Triton) -> Iterator[Segment]:
    made = Segment(LARGE * 4)
    client = httpclient.InferenceServerClient(http_url(triton))
    client.register_system_shared_memory("out", made.key, LARGE * 4, headers=HTTP_AUTH)
    yield made
    client.unregister_system_shared_memory("out", headers=HTTP_AUTH)
    client.close()
    made.destroy()


def test_a_large_request_with_an_output_in_shared_memory_is_decoded_on_the_loop(
    triton: Triton, segment: Segment, coders: GatedThreads
) -> None:
    # The worker leaves the registry to the loop: it hands such a request back, and the loop decodes it.
    coders.gate.set()
    values = [index * 0.5 for index in range(LARGE)]
    document = json.loads(_json_fp32(values))
    document["outputs"] = [
        {"name": "out", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": LARGE * 4}}
    ]
    status, _, answer = _post(triton, "fp32", json.dumps(document).encode())
    assert status == 200, answer
    assert coders.submitted.is_set()
    assert (segment.read(np.float32, [LARGE]) == np.array(values, np.float32)).all()


def _grpc_infer(triton: Triton, model: str, array: np.ndarray, datatype: str, stream: bool) -> np.ndarray:
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    tensor = grpcclient.InferInput("in", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    try:
        if not stream:
            return client.infer(model, [tensor]).as_numpy("out")
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(lambda result, error: answers.put(error or result))
        try:
            client.async_stream_infer(model, [tensor])
            answer = answers.get(timeout=60)
        finally:
            client.stop_stream()
        assert not isinstance(answer, Exception), answer
        return answer.as_numpy("out")
    finally:
        client.close()


def _grpc_answered_after_others(
    triton: Triton, coders: GatedThreads, model: str, array: np.ndarray, datatype: str, stream: bool
) -> np.ndarray:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        large = pool.submit(_grpc_infer, triton, model, array, datatype, stream)
        assert coders.submitted.wait(30), "the message was not left to a worker thread"
        assert [another_client_answered(triton) for _ in range(3)] == [True, True, True]
        assert not large.done()
        coders.gate.set()
        return large.result(60)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_many_strings_over_grpc_are_decoded_while_other_clients_are_answered(
    triton: Triton, coders: GatedThreads, stream: bool
) -> None:
    strings = np.array([b"g%07d" % index for index in range(LARGE)], np.object_)
    assert _grpc_answered_after_others(triton, coders, "count", strings, "BYTES", stream).tolist() == [LARGE]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_many_strings_answered_over_grpc_are_encoded_while_other_clients_are_answered(
    triton: Triton, coders: GatedThreads, stream: bool
) -> None:
    answer = _grpc_answered_after_others(triton, coders, "strings", np.array([1.0], np.float32), "FP32", stream)
    assert answer.tolist() == [b"s%07d" % index for index in range(LARGE)]


def test_few_strings_over_grpc_are_decoded_and_encoded_on_the_loop(triton: Triton, coders: GatedThreads) -> None:
    strings = np.array([b"a", b"bc"], np.object_)
    assert _grpc_infer(triton, "bytes", strings, "BYTES", stream=False).tolist() == [b"a", b"bc"]
    assert not coders.submitted.is_set()
