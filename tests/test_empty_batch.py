"""A request of batch size 0 to a batching model: refused in Triton's words, or served as Triton serves it.

tritonserver 2.51 (asked through nvidia-pytriton 0.7) takes a request's batch size from the first input its hash map
visits whose batch dimension is not 0, and reads an input of batch size 0 as that many rows, or, where every input's
is 0, as the input without its batch dimension: FP32 [0, 2] expects 8 bytes, so no data is "input byte size mismatch
for input 'INPUT_1' for model 'identity'. Expected 8, got 0" (400 / INVALID_ARGUMENT), and 8 bytes (HTTP binary, gRPC
raw or typed contents) run the model on an input of shape [2], counted as one inference and one execution. Rows of no
elements ([0, 0]) pass its check, and 0.7 never answers them: refused here, saying why.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Iterator, List, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.decorators import batch
from pytriton.model_config import EnsembleStep, ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.http_helpers import get_json, post_json, request

# What each callable was called with: per request, each input's shape.
CALLS: List[List[Dict[str, Tuple[int, ...]]]] = []


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    CALLS.append([{name: request[name].shape for name in request} for request in requests])
    return [{name.replace("INPUT", "OUTPUT"): request[name] for name in request} for request in requests]


@batch
def _batched(INPUT_1: np.ndarray) -> Dict[str, np.ndarray]:
    CALLS.append([{"INPUT_1": INPUT_1.shape}])
    return {"OUTPUT_1": INPUT_1}


def _bind(triton: Triton) -> None:
    for name, dtype in (("identity", np.float32), ("identity_bytes", bytes)):
        triton.bind(
            name,
            _identity,
            inputs=[Tensor(name="INPUT_1", dtype=dtype, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT_1", dtype=dtype, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )
    triton.bind(
        "batched_int32",
        _batched,
        inputs=[Tensor(name="INPUT_1", dtype=np.int32, shape=(3,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.int32, shape=(3,))],
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind(
        "pair",
        _identity,
        inputs=[
            Tensor(name="INPUT_X", dtype=np.float32, shape=(-1,)),
            Tensor(name="INPUT_Y", dtype=np.int32, shape=(2,)),
        ],
        outputs=[
            Tensor(name="OUTPUT_X", dtype=np.float32, shape=(-1,)),
            Tensor(name="OUTPUT_Y", dtype=np.int32, shape=(2,)),
        ],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind_ensemble(
        "ensemble_int32",
        steps=[EnsembleStep("batched_int32", input_map={"INPUT_1": "INPUT_1"}, output_map={"OUTPUT_1": "OUTPUT_1"})],
        inputs=[Tensor(name="INPUT_1", dtype=np.int32, shape=(3,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.int32, shape=(3,))],
        config=ModelConfig(max_batch_size=4),
    )
    triton.bind(
        "mix",
        _identity,
        inputs=[
            Tensor(name="INPUT_X", dtype=np.float32, shape=(-1,)),
            Tensor(name="INPUT_Y", dtype=bytes, shape=(-1,)),
        ],
        outputs=[
            Tensor(name="OUTPUT_X", dtype=np.float32, shape=(-1,)),
            Tensor(name="OUTPUT_Y", dtype=bytes, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module", params=[None, 2], ids=["frontends=1", "frontends=2"])
def triton(request: Any) -> Iterator[Triton]:
    with running_triton(_bind, frontends=request.param) as server:
        yield server


def _json(datatype: str, shape: List[int]) -> Dict[str, Any]:
    return {"inputs": [{"name": "INPUT_1", "datatype": datatype, "shape": shape, "data": []}]}


@pytest.mark.parametrize(
    ("model", "datatype", "shape", "message"),
    [
        (
            "identity",
            "FP32",
            [0, 2],
            "input byte size mismatch for input 'INPUT_1' for model 'identity'. Expected 8, got 0",
        ),
        (
            "identity",
            "FP32",
            [0, 5],
            "input byte size mismatch for input 'INPUT_1' for model 'identity'. Expected 20, got 0",
        ),
        (
            "identity_bytes",
            "BYTES",
            [0, 3],
            "expected 3 string elements for inference input 'INPUT_1' for model 'identity_bytes', got 0",
        ),
        # Triton's check passes here, and nvidia-pytriton 0.7 never answers: this server says why it refuses.
        ("identity", "FP32", [0, 0], "input 'INPUT_1' for model 'identity' has a batch size of 0"),
    ],
)
def test_an_empty_batch_over_http_json_is_refused_in_tritons_words(triton, model, datatype, shape, message) -> None:
    calls = len(CALLS)
    status, document = post_json(triton.http_port, f"/v2/models/{model}/infer", _json(datatype, shape))
    assert status == 400
    assert document["error"].startswith("[request id: <id_unknown>] " + message)
    assert len(CALLS) == calls


def test_an_empty_batch_of_binary_data_is_refused_in_tritons_words(triton) -> None:
    header = json.dumps(
        {"inputs": [{"name": "INPUT_1", "datatype": "FP32", "shape": [0, 3], "parameters": {"binary_data_size": 0}}]}
    ).encode()
    status, _, answer = request(
        triton.http_port,
        "POST",
        "/v2/models/identity/infer",
        header,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert (status, json.loads(answer)["error"]) == (
        400,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT_1' for model 'identity'. "
        "Expected 12, got 0",
    )


def test_an_empty_batch_over_grpc_is_invalid_argument_in_tritons_words(triton) -> None:
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    tensor = grpcclient.InferInput("INPUT_1", [0, 2], "FP32")
    tensor.set_data_from_numpy(np.zeros((0, 2), np.float32))
    calls = len(CALLS)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("identity", [tensor], request_id="empty")
    assert raised.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert raised.value.message() == (
        "[request id: empty] input byte size mismatch for input 'INPUT_1' for model 'identity'. Expected 8, got 0"
    )
    assert len(CALLS) == calls
    # A batch of one row still runs.
    tensor = grpcclient.InferInput("INPUT_1", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    assert client.infer("identity", [tensor]).as_numpy("OUTPUT_1").tolist() == [[1.0, 1.0]]
    client.close()


def test_an_empty_batch_with_binary_data_names_the_datas_size_as_triton_does(triton) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0): 84 bytes for FP32 [0, 3] are "Expected 12, got 84", over HTTP and
    # gRPC; this server said "got 0". (Data of one row, 12 bytes, 2.51 serves as an input of shape [3]: refused here.)
    header = json.dumps(
        {"inputs": [{"name": "INPUT_1", "datatype": "FP32", "shape": [0, 3], "parameters": {"binary_data_size": 84}}]}
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, _, answer = request(triton.http_port, "POST", "/v2/models/identity/infer", header + bytes(84), headers)
    message = service_pb2.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT_1", datatype="FP32", shape=[0, 3])
    message.raw_input_contents.append(bytes(84))
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    refusal = (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT_1' for model 'identity'. "
        "Expected 12, got 84"
    )
    assert (status, json.loads(answer)["error"]) == (400, refusal)
    assert raised.value.details() == refusal


def _strings(count: int) -> bytes:
    return b"".join(struct.pack("<I", 2) + b"ab" for _ in range(count))


@pytest.mark.parametrize(
    ("count", "refusal"),
    [
        (0, "expected 3 string elements for inference input 'INPUT_1' for model 'identity_bytes', got 0"),
        (2, "expected 3 string elements for inference input 'INPUT_1' for model 'identity_bytes', got 2"),
        (
            5,
            "unexpected number of string elements 4 for inference input 'INPUT_1' for model 'identity_bytes', "
            "expecting 3",
        ),
    ],
)
@pytest.mark.parametrize("wire", ["http-binary", "grpc-raw", "grpc-typed"])
def test_an_empty_batch_of_strings_names_their_count_as_triton_does(
    triton, count: int, refusal: str, wire: str
) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0) counts the strings of BYTES [0, 3] against one row's 3: too few are
    # "got N", too many "unexpected number of string elements 4"; one row's it serves as an input of shape [3]
    # (test_one_rows_data_of_a_batch_of_0_runs_the_model_without_its_batch_dimension). This server said "got 0"
    # whatever the data held.
    data = _strings(count)
    if wire == "http-binary":
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT_1",
                        "datatype": "BYTES",
                        "shape": [0, 3],
                        "parameters": {"binary_data_size": len(data)},
                    }
                ]
            }
        ).encode()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        status, _, answer = request(triton.http_port, "POST", "/v2/models/identity_bytes/infer", header + data, headers)
        assert (status, json.loads(answer)["error"]) == (400, "[request id: <id_unknown>] " + refusal)
        return
    message = service_pb2.ModelInferRequest(model_name="identity_bytes")
    tensor = message.inputs.add(name="INPUT_1", datatype="BYTES", shape=[0, 3])
    if wire == "grpc-raw":
        message.raw_input_contents.append(data)
    else:
        tensor.contents.bytes_contents.extend([b"ab"] * count)
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    assert raised.value.details() == "[request id: <id_unknown>] " + refusal


def _counts(triton: Triton, model: str) -> Tuple[int, int, int]:
    """The model's inference count, execution count and successful requests, from its statistics."""
    stats = get_json(triton.http_port, f"/v2/models/{model}/stats", HTTP_AUTH)[1]["model_stats"][0]
    return stats["inference_count"], stats["execution_count"], stats["inference_stats"]["success"]["count"]


_TYPED = {"FP32": "fp32_contents", "INT32": "int_contents", "BYTES": "bytes_contents"}


def _send(triton: Triton, wire: str, model: str, inputs: List[Tuple[str, str, List[int], np.ndarray]]) -> Any:
    """Send `inputs` (name, datatype, shape, data: any number of values) over `wire`; return the outputs.

    Each output as (name, shape, values); a refusal as (status, message).
    """
    if wire == "http-binary":
        datas = [_raw(datatype, values) for _, datatype, _, values in inputs]
        header = json.dumps(
            {
                "inputs": [
                    {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(data)}}
                    for (name, datatype, shape, _), data in zip(inputs, datas)
                ],
                "outputs": [
                    {"name": name.replace("INPUT", "OUTPUT"), "parameters": {"binary_data": False}}
                    for name, _, _, _ in inputs
                ],
            }
        ).encode()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        status, _, answer = request(
            triton.http_port, "POST", f"/v2/models/{model}/infer", header + b"".join(datas), headers
        )
        document = json.loads(answer)
        if status != 200:
            return status, document["error"]
        return [(output["name"], output["shape"], output["data"]) for output in document["outputs"]]
    message = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, values in inputs:
        tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
        if wire == "grpc-raw":
            message.raw_input_contents.append(_raw(datatype, values))
        else:
            getattr(tensor.contents, _TYPED[datatype]).extend(values.tolist())
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        try:
            response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
        except grpc.RpcError as error:
            return error.code(), error.details()
    outputs = []
    for output, raw in zip(response.outputs, response.raw_output_contents):
        if output.datatype == "BYTES":
            values = []
            while raw:
                (length,) = struct.unpack_from("<I", raw)
                values.append(raw[4 : 4 + length].decode())
                raw = raw[4 + length :]
        else:
            values = np.frombuffer(raw, np.float32 if output.datatype == "FP32" else np.int32).tolist()
        outputs.append((output.name, list(output.shape), values))
    return outputs


def _raw(datatype: str, values: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(value)) + value for value in values)
    return values.tobytes()


WIRES = ["http-binary", "grpc-raw", "grpc-typed"]
ROW = {
    "identity": ("FP32", np.array([1.5, 2.5, 3.5], np.float32), [1.5, 2.5, 3.5]),
    "identity_bytes": ("BYTES", np.array([b"ab", b"c", b"def"], object), ["ab", "c", "def"]),
    "batched_int32": ("INT32", np.array([7, 8, 9], np.int32), [7, 8, 9]),
}


@pytest.mark.parametrize("model", list(ROW))
@pytest.mark.parametrize("wire", WIRES)
def test_one_rows_data_of_a_batch_of_0_runs_the_model_without_its_batch_dimension(
    triton: Triton, model: str, wire: str
) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0), for FP32 and BYTES with a plain callable and INT32 with @batch:
    # [0, 3] with one row's data (12 bytes, 3 strings; raw, typed or binary) runs the model on an input of shape
    # [3] and answers its output of shape [3]: 200 / OK, one inference, one execution, one success. This server
    # refused it (`has a batch size of 0`). The same header a third time is decoded by its kept plan.
    datatype, values, answered = ROW[model]
    for _ in range(3 if wire == "http-binary" else 1):
        before, calls = _counts(triton, model), len(CALLS)
        assert _send(triton, wire, model, [("INPUT_1", datatype, [0, 3], values)]) == [("OUTPUT_1", [3], answered)]
        assert CALLS[calls:] == [[{"INPUT_1": (3,)}]]
        after = _counts(triton, model)
        assert [b - a for a, b in zip(before, after)] == [1, 1, 1]


@pytest.mark.parametrize("wire", WIRES)
def test_a_batch_of_0_beside_a_batch_size_is_read_as_that_many_rows(triton: Triton, wire: str) -> None:
    # tritonserver 2.51 visits INPUT_X, INPUT_Y as INPUT_Y, INPUT_X: INPUT_Y's batch dimension of 0 sets no batch
    # size, INPUT_X's 2 does, and INPUT_Y's 2 rows of data are read as [2, 2] (two inferences, one execution).
    # Data of one row is the byte size mismatch of two; and INPUT_X of batch size 0 beside INPUT_Y of 2, visited
    # after it, is a batch size that differs. This server refused the first (`has a batch size of 0`).
    x = np.arange(6, dtype=np.float32)
    before, calls = _counts(triton, "pair"), len(CALLS)
    answer = _send(
        triton,
        wire,
        "pair",
        [("INPUT_X", "FP32", [2, 3], x), ("INPUT_Y", "INT32", [0, 2], np.arange(4, dtype=np.int32))],
    )
    assert answer == [("OUTPUT_X", [2, 3], x.tolist()), ("OUTPUT_Y", [2, 2], [0, 1, 2, 3])]
    assert CALLS[calls:] == [[{"INPUT_X": (2, 3), "INPUT_Y": (2, 2)}]]
    assert [b - a for a, b in zip(before, _counts(triton, "pair"))] == [2, 1, 1]
    refused = _send(
        triton,
        wire,
        "pair",
        [("INPUT_X", "FP32", [2, 3], x), ("INPUT_Y", "INT32", [0, 2], np.arange(2, dtype=np.int32))],
    )
    invalid = 400 if wire == "http-binary" else grpc.StatusCode.INVALID_ARGUMENT
    assert refused == (
        invalid,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT_Y' for model 'pair'. Expected 16, got 8",
    )
    refused = _send(
        triton,
        wire,
        "pair",
        [("INPUT_X", "FP32", [0, 3], x), ("INPUT_Y", "INT32", [2, 2], np.arange(4, dtype=np.int32))],
    )
    assert refused == (
        invalid,
        "[request id: <id_unknown>] input 'INPUT_X' batch size does not match other inputs for 'pair'",
    )
    assert len(CALLS) == calls + 1


@pytest.mark.parametrize("wire", WIRES)
def test_rows_of_no_elements_of_a_batch_of_0_are_refused_beside_one_rows_data(triton: Triton, wire: str) -> None:
    # tritonserver 2.51's check passes INPUT_X [0, 0] beside INPUT_Y [0, 2] of one row's data, and nvidia-pytriton
    # 0.7 never answers it (counting a success): refused here, saying why.
    inputs = [
        ("INPUT_X", "FP32", [0, 0], np.zeros(0, np.float32)),
        ("INPUT_Y", "INT32", [0, 2], np.arange(2, dtype=np.int32)),
    ]
    calls = len(CALLS)
    assert _send(triton, wire, "pair", inputs) == (
        400 if wire == "http-binary" else grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input 'INPUT_X' for model 'pair' has a batch size of 0: the model runs on one row "
        "or more",
    )
    assert len(CALLS) == calls


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_one_rows_data_of_a_batch_of_0_in_shared_memory_runs_the_model(triton: Triton, wire: str) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0): FP32 [0, 3] in 12 bytes of a system shared-memory region runs the
    # model on [3], over HTTP and gRPC; 20 bytes are `Expected 12, got 20`, as here. This server refused the 12
    # bytes (`has a batch size of 0`).
    key = f"/pytriton-empty-batch-{os.getpid()}-{wire}"
    handle = shm.create_shared_memory_region("rows", key, 64)
    http = httpclient.InferenceServerClient(http_url(triton))
    client: Any = http if wire == "http" else grpcclient.InferenceServerClient(grpc_url(triton))
    module: Any = httpclient if wire == "http" else grpcclient
    auth = HTTP_AUTH if wire == "http" else GRPC_AUTH
    try:
        shm.set_shared_memory_region(handle, [np.array([1.5, 2.5, 3.5], np.float32)])
        client.register_system_shared_memory("rows", key, 64, headers=auth)
        tensor = module.InferInput("INPUT_1", [0, 3], "FP32")
        tensor.set_shared_memory("rows", 12)
        calls = len(CALLS)
        result = client.infer("identity", [tensor])
        assert (result.as_numpy("OUTPUT_1").tolist(), CALLS[calls:]) == ([1.5, 2.5, 3.5], [[{"INPUT_1": (3,)}]])
        tensor.set_shared_memory("rows", 20)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("identity", [tensor])
        assert raised.value.message().endswith(
            "input byte size mismatch for input 'INPUT_1' for model 'identity'. Expected 12, got 20"
        )
    finally:
        client.unregister_system_shared_memory("rows", headers=auth)
        shm.destroy_shared_memory_region(handle)
        http.close()
        client.close()


STRINGS = np.array([b"s0", b"s1", b"s2"], object)
# Of a request that fails, the refusal tritonserver 2.51 (nvidia-pytriton 0.7.0) answers: it visits INPUT_Y first,
# whose batch of 0 with one row's strings (or, beside INPUT_X of 2 rows, three strings of the six) is no refusal
# then but the request's next input's, or its own. This server named INPUT_Y's batch of 0 in the first two (over
# HTTP binary: `expected 3 string elements ..., got 0`), and refused the batch of 0 it serves.
_MIX_REFUSALS = {
    "another datatype": (
        [("INPUT_X", "INT32", [0, 2], np.arange(2, dtype=np.int32)), ("INPUT_Y", "BYTES", [0, 3], STRINGS)],
        "inference input 'INPUT_X' data-type is 'INT32', but model 'mix' expects 'FP32'",
    ),
    "too many bytes": (
        [("INPUT_X", "FP32", [0, 2], np.arange(5, dtype=np.float32)), ("INPUT_Y", "BYTES", [0, 3], STRINGS)],
        "input byte size mismatch for input 'INPUT_X' for model 'mix'. Expected 8, got 20",
    ),
    "strings of one row of two": (
        [("INPUT_X", "FP32", [2, 2], np.arange(4, dtype=np.float32)), ("INPUT_Y", "BYTES", [0, 3], STRINGS)],
        "expected 6 string elements for inference input 'INPUT_Y' for model 'mix', got 3",
    ),
}


@pytest.mark.parametrize("case", list(_MIX_REFUSALS))
@pytest.mark.parametrize("wire", WIRES)
def test_a_batch_of_0_that_is_served_is_not_the_refusal_of_a_request_that_fails(
    triton: Triton, case: str, wire: str
) -> None:
    inputs, refusal = _MIX_REFUSALS[case]
    invalid = 400 if wire == "http-binary" else grpc.StatusCode.INVALID_ARGUMENT
    assert _send(triton, wire, "mix", inputs) == (invalid, "[request id: <id_unknown>] " + refusal)
    served = [("INPUT_X", "FP32", [0, 2], np.arange(2, dtype=np.float32)), ("INPUT_Y", "BYTES", [0, 3], STRINGS)]
    assert _send(triton, wire, "mix", served) == [("OUTPUT_X", [2], [0.0, 1.0]), ("OUTPUT_Y", [3], ["s0", "s1", "s2"])]


@pytest.mark.parametrize("wire", WIRES)
def test_an_ensemble_runs_a_batch_of_0_as_tritons_ensemble_scheduler_does(triton: Triton, wire: str) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7.0, an ensemble written into its model store over a bound model): INT32
    # [0, 3] of one row runs the batching step on [1, 3] (its tensors get a batch dimension of 1) and answers
    # [3] (the step's output loses it again); one inference, one execution. This server failed it: `in ensemble
    # 'ensemble_int32', ... unexpected shape for input 'INPUT_1' for model 'batched_int32'. Expected [-1,3], got [3]`.
    values = np.array([4, 5, 6], np.int32)
    before, calls = _counts(triton, "ensemble_int32"), len(CALLS)
    answer = _send(triton, wire, "ensemble_int32", [("INPUT_1", "INT32", [0, 3], values)])
    assert (answer, CALLS[calls:]) == ([("OUTPUT_1", [3], [4, 5, 6])], [[{"INPUT_1": (1, 3)}]])
    assert [b - a for a, b in zip(before, _counts(triton, "ensemble_int32"))] == [1, 1, 1]
    answer = _send(triton, wire, "ensemble_int32", [("INPUT_1", "INT32", [1, 3], values)])
    assert answer == [("OUTPUT_1", [1, 3], [4, 5, 6])]
