"""Every code example of the user documents (the seeds), run against a real server of this project.

Each test keeps the example's code as written, defines what the example leaves abstract (`model(...)`,
`...`), binds it to a server on free ports (never 8000/8001), and checks the answers through
`tritonclient.http` and `tritonclient.http.aio` (decoupled models: through gRPC streams and SSE).
Where an example needs PyTorch or a CUDA device, a NumPy stand-in on "cpu" replaces it (said where).
Where an example is wrong as published (it fails on NVIDIA's PyTriton too), the test shows that and
runs the evident intent.

Seeds: 000 inference callable (site), 001 binding models, 002 inference callable (markdown),
003 API reference (docstring examples), 004 overview.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import threading
from typing import Any, AsyncIterator, Dict, Generator, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from pytriton.client import AsyncioModelClient, FuturesModelClient, ModelClient
from pytriton.client.exceptions import PyTritonClientValueError
from pytriton.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
)
from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig
from tests.conftest import grpc_url, http_url, running_triton

TIMEOUT_S = 30.0
Arrays = Dict[str, np.ndarray]
# aiohttp (under tritonclient.http.aio) warns about request bodies over 1 MiB, such as two 224x224x3 images
LARGE_BODIES = pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")


# --- checking answers with tritonclient.http (sync, JSON tensors) and tritonclient.http.aio (binary tensors)


def _infer_inputs(inputs: Arrays, binary: bool) -> List[httpclient.InferInput]:
    infer_inputs = []
    for name, array in inputs.items():
        infer_input = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        # BYTES go binary either way: JSON cannot carry arbitrary bytes
        infer_input.set_data_from_numpy(array, binary_data=binary or array.dtype.kind in "OS")
        infer_inputs.append(infer_input)
    return infer_inputs


def infer_http(
    triton: Triton, model: str, inputs: Arrays, outputs: List[str], binary_outputs: Sequence[str] = (), **kwargs: Any
) -> Arrays:
    """One inference with tritonclient.http, inputs and outputs as JSON (but BYTES, and `binary_outputs`)."""
    client = httpclient.InferenceServerClient(http_url(triton), network_timeout=TIMEOUT_S)
    try:
        requested = [httpclient.InferRequestedOutput(name, binary_data=name in binary_outputs) for name in outputs]
        result = client.infer(model, _infer_inputs(inputs, binary=False), outputs=requested, **kwargs)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


async def infer_http_aio(triton: Triton, model: str, inputs: Arrays, outputs: List[str], **kwargs: Any) -> Arrays:
    """One inference with tritonclient.http.aio, inputs and outputs binary."""
    client = httpaio.InferenceServerClient(http_url(triton), conn_timeout=TIMEOUT_S)
    try:
        requested = [httpaio.InferRequestedOutput(name, binary_data=True) for name in outputs]
        result = await client.infer(model, _infer_inputs(inputs, binary=True), outputs=requested, **kwargs)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        await client.close()


def assert_answers(triton: Triton, model: str, inputs: Arrays, expected: Arrays, **kwargs: Any) -> None:
    """The model answers `expected` to tritonclient.http and to tritonclient.http.aio."""
    names = list(expected)
    bytes_outputs = [name for name, array in expected.items() if array.dtype == object]
    answers = {
        "tritonclient.http": infer_http(triton, model, inputs, names, bytes_outputs, **kwargs),
        "tritonclient.http.aio": asyncio.run(infer_http_aio(triton, model, inputs, names, **kwargs)),
    }
    for client, got in answers.items():
        for name, want in expected.items():
            message = f"{model}.{name} via {client}"
            assert got[name].shape == want.shape, f"{message}: shape {got[name].shape} != {want.shape}"
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got[name], want, rtol=1e-6, err_msg=message)
            else:
                np.testing.assert_array_equal(got[name], want, err_msg=message)


def assert_fails(triton: Triton, model: str, inputs: Arrays, outputs: List[str], match: str) -> None:
    """Both tritonclient.http and tritonclient.http.aio get an error matching `match`."""
    with pytest.raises(InferenceServerException, match=match):
        infer_http(triton, model, inputs, outputs)
    with pytest.raises(InferenceServerException, match=match):
        asyncio.run(infer_http_aio(triton, model, inputs, outputs))


def metadata(triton: Triton, model: str) -> Dict[str, Any]:
    client = httpclient.InferenceServerClient(http_url(triton))
    try:
        return client.get_model_metadata(model)  # type: ignore[no-any-return]
    finally:
        client.close()


def model_config(triton: Triton, model: str) -> Dict[str, Any]:
    client = httpclient.InferenceServerClient(http_url(triton))
    try:
        return client.get_model_config(model)  # type: ignore[no-any-return]
    finally:
        client.close()


def _bytes(*rows: List[bytes]) -> np.ndarray:
    return np.array(rows, dtype=object)


# --- stand-ins for what the examples leave abstract


def model(input1: np.ndarray, input2: np.ndarray) -> np.ndarray:
    """Stand-in for the examples' `model(input1, input2)` on bytes: len(input1) + len(each input2 item)."""
    lengths1 = np.vectorize(len, otypes=[np.float32])(input1)  # (batch, 1)
    lengths2 = np.vectorize(len, otypes=[np.float32])(input2)  # (batch, n)
    return lengths1 + lengths2


BYTES_INPUT1 = _bytes([b"ab"], [b"xyz"])
BYTES_INPUT2 = _bytes([b"", b"c", b"de\x00"], [b"f", b"gh", b"ijk"])
BYTES_EXPECTED = np.array([[2, 3, 5], [4, 5, 6]], dtype=np.float32)


# --- 000 / 002: Inference Callable


def infer_fn(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """The abstract `infer_fn` of the inference callable page: doubles its input."""
    return [{"OUTPUT_1": request["INPUT_1"] * 2} for request in requests]


class InferCallable:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.offset = np.float32(100)  # model initialization

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        return [{"OUTPUT_1": request["INPUT_1"] + self.offset} for request in requests]

    def alternative_infer(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        return [{"OUTPUT_1": request.data["INPUT_1"] - self.offset} for request in requests]


async def infer_coro(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    await asyncio.sleep(0)
    return [{"OUTPUT_1": -request["INPUT_1"]} for request in requests]


def streaming_infer_fn(requests: List[Request]) -> Generator[List[Dict[str, np.ndarray]], None, None]:
    # The seed annotates the steps as Dict; each step is a list with one dict per request (as in PyTriton).
    for step in range(3):
        yield [{"OUTPUT_1": request["INPUT_1"] * 10 + step} for request in requests]


X = np.array([[1.0], [2.5]], dtype=np.float32)


def test_000_inference_callable_function_and_class(start_triton: Any) -> None:
    def bind(triton: Triton) -> None:
        # as in the seed (which binds inside `with Triton() as triton:`)
        triton.bind(
            model_name="MyInferenceFn",
            infer_func=infer_fn,
            inputs=[Tensor(shape=(1,), dtype=np.float32)],
            outputs=[Tensor(shape=(1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=8),
        )

        infer_callable = InferCallable()
        triton.bind(
            model_name="MyInferenceCallable",
            infer_func=infer_callable,
            inputs=[Tensor(shape=(1,), dtype=np.float32)],
            outputs=[Tensor(shape=(1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=8),
        )

    triton = start_triton(bind)
    assert_answers(triton, "MyInferenceFn", {"INPUT_1": X}, {"OUTPUT_1": X * 2})
    assert_answers(triton, "MyInferenceCallable", {"INPUT_1": X}, {"OUTPUT_1": X + 100})


def _bind_002(triton: Triton) -> None:
    infer_callable = InferCallable()

    triton.bind(
        model_name="MyInferenceFunction",
        infer_func=infer_fn,
        inputs=[Tensor(shape=(1,), dtype=np.float32)],
        outputs=[Tensor(shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        model_name="MyInferenceCallable",
        infer_func=infer_callable,
        inputs=[Tensor(shape=(1,), dtype=np.float32)],
        outputs=[Tensor(shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        model_name="AlternativeInferenceCallable",
        infer_func=infer_callable.alternative_infer,
        inputs=[Tensor(shape=(1,), dtype=np.float32)],
        outputs=[Tensor(shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        model_name="MyInferenceCoroutine",
        infer_func=infer_coro,
        inputs=[Tensor(shape=(1,), dtype=np.float32)],
        outputs=[Tensor(shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        model_name="StreamingInferenceCallable",
        infer_func=streaming_infer_fn,
        inputs=[Tensor(shape=(1,), dtype=np.float32)],
        outputs=[Tensor(shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8, decoupled=True),
    )


def test_002_function_method_coroutine(start_triton: Any) -> None:
    triton = start_triton(_bind_002)
    assert_answers(triton, "MyInferenceFunction", {"INPUT_1": X}, {"OUTPUT_1": X * 2})
    assert_answers(triton, "MyInferenceCallable", {"INPUT_1": X}, {"OUTPUT_1": X + 100})
    assert_answers(triton, "AlternativeInferenceCallable", {"INPUT_1": X}, {"OUTPUT_1": X - 100})
    assert_answers(triton, "MyInferenceCoroutine", {"INPUT_1": X}, {"OUTPUT_1": -X})


def _grpc_stream(triton: Triton, model: str, inputs: Arrays) -> List[np.ndarray]:
    """tritonclient.grpc: one streamed request; the OUTPUT_1 of each response until the empty final one."""
    results: queue.Queue[Tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        infer_inputs = []
        for name, array in inputs.items():
            infer_inputs.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            infer_inputs[-1].set_data_from_numpy(array)
        client.async_stream_infer(model, infer_inputs, enable_empty_final_response=True)
        outputs = []
        while True:
            result, error = results.get(timeout=TIMEOUT_S)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return outputs
            outputs.append(result.as_numpy("OUTPUT_1"))
    finally:
        client.stop_stream()
        client.close()


async def _grpc_aio_stream(triton: Triton, model: str, inputs: Arrays) -> List[np.ndarray]:
    """tritonclient.grpc.aio: the same, with stream_infer."""
    infer_inputs = []
    for name, array in inputs.items():
        infer_inputs.append(grpcaio.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        infer_inputs[-1].set_data_from_numpy(array)

    async def requests() -> AsyncIterator[Dict[str, Any]]:
        yield {"model_name": model, "inputs": infer_inputs, "enable_empty_final_response": True}

    client = grpcaio.InferenceServerClient(grpc_url(triton))
    outputs = []
    try:
        async for result, error in client.stream_infer(requests(), stream_timeout=TIMEOUT_S):
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            outputs.append(result.as_numpy("OUTPUT_1"))
    finally:
        await client.close()
    return outputs


def _sse_stream(triton: Triton, model: str, document: Dict[str, Any]) -> List[Dict[str, Any]]:
    """POST .../generate_stream and return the JSON of each server-sent event."""
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=TIMEOUT_S)
    try:
        connection.request("POST", f"/v2/models/{model}/generate_stream", body=json.dumps(document))
        response = connection.getresponse()
        assert response.status == 200, response.read()
        events = response.read().decode().split("\n\n")
    finally:
        connection.close()
    assert events[-1] == ""
    assert all(event.startswith("data: ") for event in events[:-1]), events
    return [json.loads(event[len("data: ") :]) for event in events[:-1]]


def test_002_streaming_callable(start_triton: Any) -> None:
    triton = start_triton(_bind_002)
    x = np.array([[1.5]], dtype=np.float32)
    # a decoupled model streams: /infer refuses it, over tritonclient.http and tritonclient.http.aio alike
    assert_fails(triton, "StreamingInferenceCallable", {"INPUT_1": x}, ["OUTPUT_1"], "decoupled")
    expected = [x * 10 + step for step in range(3)]
    for got in (
        _grpc_stream(triton, "StreamingInferenceCallable", {"INPUT_1": x}),
        asyncio.run(_grpc_aio_stream(triton, "StreamingInferenceCallable", {"INPUT_1": x})),
    ):
        assert len(got) == 3
        for want, output in zip(expected, got):
            np.testing.assert_allclose(output, want)
    events = _sse_stream(triton, "StreamingInferenceCallable", {"INPUT_1": 1.5})
    assert [event["OUTPUT_1"] for event in events] == [15.0, 16.0, 17.0]


# --- 001: Binding Models to Triton


@batch
def infer_fn_bytes(**inputs: np.ndarray):  # the seed's `infer_fn`, renamed to keep one infer_fn per module
    input1, input2 = inputs.values()
    outputs = model(input1, input2)
    return [outputs]


def test_001_bind_bytes_inputs_strict(start_triton: Any) -> None:
    def bind(triton: Triton) -> None:
        triton.bind(
            model_name="ModelName",
            infer_func=infer_fn_bytes,
            inputs=[
                Tensor(shape=(1,), dtype=np.bytes_),  # sample containing single bytes value
                Tensor(shape=(-1,), dtype=np.bytes_),  # sample containing vector of bytes
            ],
            outputs=[
                Tensor(shape=(-1,), dtype=np.float32),
            ],
            config=ModelConfig(max_batch_size=8),
            strict=True,
        )

    triton = start_triton(bind)
    meta = metadata(triton, "ModelName")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT_1", "BYTES", [-1, 1]),
        ("INPUT_2", "BYTES", [-1, -1]),
    ]
    inputs = {"INPUT_1": BYTES_INPUT1, "INPUT_2": BYTES_INPUT2}
    assert_answers(triton, "ModelName", inputs, {"OUTPUT_1": BYTES_EXPECTED})


def test_001_identity_lambda(start_triton: Any) -> None:
    """The seeds' `lambda requests: requests`: the Request objects it returns count as mappings of arrays.

    nvidia-pytriton 0.7 refuses them (500, "Outputs returned by `echo_requests` model callable must be list of
    response dicts with numpy arrays. Got response=Request(data=...) instead."); this server takes them, as the
    seed document promises ("passes input data on output").
    """
    x = np.array([[1.0], [2.0]], dtype=np.float32)

    def bind(triton: Triton) -> None:
        triton.bind(
            model_name="Identity",
            infer_func=lambda requests: requests,
            inputs=[Tensor(dtype=np.float32, shape=(1,))],
            outputs=[Tensor(dtype=np.float32, shape=(1,))],
            config=ModelConfig(max_batch_size=8),
        )
        # The same with an output named as the input: the data comes back under that name.
        triton.bind(
            model_name="IdentityNamed",
            infer_func=lambda requests: requests,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            config=ModelConfig(max_batch_size=8),
        )

    triton = start_triton(bind)
    # The example as written: its unnamed output is OUTPUT_1 and the request holds INPUT_1, so the answer
    # carries no output, but it is an answer, not an error.
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=TIMEOUT_S)
    body = {"inputs": [{"name": "INPUT_1", "shape": [2, 1], "datatype": "FP32", "data": [1, 2]}]}
    connection.request("POST", "/v2/models/Identity/infer", json.dumps(body))
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())["outputs"]) == (200, [])
    connection.close()
    assert_answers(triton, "IdentityNamed", {"x": x}, {"x": x})
    with ModelClient(http_url(triton), "IdentityNamed") as client:
        np.testing.assert_array_equal(client.infer_batch(x=x)["x"], x)


class _NumpyLinear:
    """Stand-in for torch.nn.Linear(in, out) (no torch here): y = x @ W.T + b, same weights on every device."""

    def __init__(self, in_features: int, out_features: int) -> None:
        rng = np.random.default_rng(0)
        self.weight = rng.standard_normal((out_features, in_features)).astype(np.float32)
        self.bias = rng.standard_normal(out_features).astype(np.float32)
        self.device = "cpu"

    def to(self, device: str) -> _NumpyLinear:
        self.device = device
        return self

    def eval(self) -> _NumpyLinear:
        return self

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight.T + self.bias


calls_per_device: Dict[str, int] = {}


class _InferFuncWrapper:
    def __init__(self, model: _NumpyLinear, device: str):
        self._model = model
        self._device = device

    @batch
    def __call__(self, **inputs):
        (input1_batch,) = inputs.values()
        # torch.from_numpy(input1_batch).to(self._device) / .cpu().detach().numpy() in the seed
        calls_per_device[self._device] = calls_per_device.get(self._device, 0) + 1
        output1_batch = self._model(input1_batch)
        return [output1_batch]


def _infer_function_factory(devices):
    infer_fns = []
    for device in devices:
        model = _NumpyLinear(20, 30).to(device).eval()
        infer_fns.append(_InferFuncWrapper(model=model, device=device))

    return infer_fns


def test_001_multi_instance(start_triton: Any) -> None:
    def bind(triton: Triton) -> None:
        triton.bind(
            model_name="Linear",
            # devices=["cuda", "cpu"] in the seed; no CUDA (nor torch) here, so two CPU instances
            infer_func=_infer_function_factory(devices=["cpu:0", "cpu:1"]),
            inputs=[
                Tensor(dtype=np.float32, shape=(-1,)),
            ],
            outputs=[
                Tensor(dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=16),
        )

    triton = start_triton(bind)
    assert model_config(triton, "Linear")["instance_group"][0]["count"] == 2
    x = np.random.default_rng(1).standard_normal((3, 20)).astype(np.float32)
    reference = _NumpyLinear(20, 30)
    assert_answers(triton, "Linear", {"INPUT_1": x}, {"OUTPUT_1": reference(x)})
    assert sum(calls_per_device.values()) >= 2
    assert set(calls_per_device) <= {"cpu:0", "cpu:1"}


def test_001_defining_inputs_and_outputs(start_triton: Any) -> None:
    inputs = [
        Tensor(dtype=np.float32, shape=(-1,)),
    ]
    output = [
        Tensor(dtype=np.float32, shape=(-1,)),
        Tensor(dtype=np.int32, shape=(-1,)),
    ]

    @batch
    def describe(INPUT_1):
        return {"OUTPUT_1": INPUT_1 * 2, "OUTPUT_2": np.full((len(INPUT_1), 1), INPUT_1.shape[1], dtype=np.int32)}

    triton = start_triton(lambda triton: triton.bind("Defaults", describe, inputs=inputs, outputs=output))
    meta = metadata(triton, "Defaults")
    # "The provided configuration creates ... INPUT_1 FLOAT32, OUTPUT_1 FLOAT32, OUTPUT_2 INT32"
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("INPUT_1", "FP32")]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [("OUTPUT_1", "FP32"), ("OUTPUT_2", "INT32")]
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    assert_answers(triton, "Defaults", {"INPUT_1": x}, {"OUTPUT_1": x * 2, "OUTPUT_2": np.array([[3], [3]], np.int32)})


@LARGE_BODIES
def test_001_named_inputs_with_exact_shapes(start_triton: Any) -> None:
    inputs = [
        Tensor(name="image", dtype=np.float32, shape=(224, 224, 3)),
    ]
    outputs = [
        Tensor(name="class", dtype=np.int32, shape=(1000,)),
    ]

    @batch
    def classify(image):
        """Stand-in classifier: a one-hot "class" vector at the image's mean brightness (0..999)."""
        scores = np.zeros((len(image), 1000), dtype=np.int32)
        scores[np.arange(len(image)), (image.mean(axis=(1, 2, 3)) * 999).astype(int)] = 1
        return {"class": scores}

    triton = start_triton(lambda triton: triton.bind("Classifier", classify, inputs=inputs, outputs=outputs))
    meta = metadata(triton, "Classifier")
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 224, 224, 3]}]
    assert meta["outputs"] == [{"name": "class", "datatype": "INT32", "shape": [-1, 1000]}]
    images = np.stack([np.full((224, 224, 3), 0.5, np.float32), np.zeros((224, 224, 3), np.float32)])
    expected = np.zeros((2, 1000), dtype=np.int32)
    expected[0, 499] = expected[1, 0] = 1
    assert_answers(triton, "Classifier", {"image": images}, {"class": expected})


def test_001_dtype_spellings(start_triton: Any) -> None:
    tensor1 = (Tensor(name="tensor1", shape=(-1,), dtype=np.float32),)
    tensor2 = (Tensor(name="tensor2", shape=(-1,), dtype=np.float32().dtype),)
    tensor3 = (Tensor(name="tensor3", shape=(-1,), dtype="float32"),)
    # the seed's trailing commas make each a 1-tuple; the three spellings give the same tensor type
    tensors = [*tensor1, *tensor2, *tensor3]

    @batch
    def add3(tensor1, tensor2, tensor3):
        return {"sum": tensor1 + tensor2 + tensor3}

    def bind(triton: Triton) -> None:
        triton.bind("ThreeDtypes", add3, inputs=tensors, outputs=[Tensor(name="sum", dtype=np.float32, shape=(-1,))])

    triton = start_triton(bind)
    assert [t["datatype"] for t in metadata(triton, "ThreeDtypes")["inputs"]] == ["FP32"] * 3
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    assert_answers(triton, "ThreeDtypes", {"tensor1": x, "tensor2": x, "tensor3": x}, {"sum": x * 3})


def test_001_bytes_keep_trailing_zeros_in_object_arrays(start_triton: Any) -> None:
    assert np.array([b"\xff\x00"]).dtype == np.dtype("S2")
    assert np.array([b"\xff\x00"])[0] == b"\xff"  # numpy drops trailing \x00 of bytes_
    assert np.array([b"\xff\x00"], dtype=object)[0] == b"\xff\x00"

    @batch
    def echo(data):
        return {"echo": data}

    def bind(triton: Triton) -> None:
        triton.bind(
            "Echo",
            echo,
            inputs=[Tensor(name="data", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="echo", dtype=bytes, shape=(1,))],
        )

    triton = start_triton(bind)
    data = np.array([[b"\xff\x00"], [b"\x00\x00"]], dtype=object)
    assert_answers(triton, "Echo", {"data": data}, {"echo": data})


def test_001_unrecoverable_error_stops_the_server(start_triton: Any) -> None:
    def model(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # stand-in for a broken model

    @batch
    def infer_fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        try:
            outputs = model(**inputs)
        except Exception as e:
            raise PyTritonUnrecoverableError(
                "Some unrecoverable error occurred, thus no further inferences are possible."
            ) from e

        return outputs

    def bind(triton: Triton) -> None:
        triton.bind(
            "Broken",
            infer_fn,
            inputs=[Tensor(dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(dtype=np.float32, shape=(-1,))],
        )

    x = np.ones((1, 2), dtype=np.float32)
    for infer in (infer_http, lambda *args: asyncio.run(infer_http_aio(*args))):
        triton = start_triton(bind)
        serving = threading.Thread(target=triton.serve)  # serve() returns when a model fails unrecoverably
        serving.start()
        with pytest.raises(InferenceServerException, match="no further inferences are possible"):
            infer(triton, "Broken", {"INPUT_1": x}, ["OUTPUT_1"])
        serving.join(TIMEOUT_S)
        assert not serving.is_alive(), "serve() did not return after PyTritonUnrecoverableError"
        assert not triton.is_alive()


# --- 004: overview (serving, blocking and background modes)


@batch
def infer_fn_overview(**inputs: np.ndarray):
    input1, input2 = inputs.values()
    outputs = model(input1, input2)
    return [outputs]


def _bind_my_model(triton: Triton) -> None:
    triton.bind(
        model_name="MyModel",
        infer_func=infer_fn_overview,
        inputs=[
            Tensor(dtype=bytes, shape=(1,)),  # sample containing single bytes value
            Tensor(dtype=bytes, shape=(-1,)),  # sample containing vector of bytes
        ],
        outputs=[
            Tensor(dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=16),
    )


def test_004_serve_blocks_until_stopped() -> None:
    # `with Triton() as triton: ... triton.serve()`, on free ports; serve() runs in a thread here so the
    # test can send requests, then stop() (what SIGINT does under serve()) makes it return
    with Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0)) as triton:
        _bind_my_model(triton)
        triton.run()  # serve() calls run() itself; called first here only to know the ports before sending
        serving = threading.Thread(target=triton.serve)
        serving.start()
        try:
            inputs = {"INPUT_1": BYTES_INPUT1, "INPUT_2": BYTES_INPUT2}
            assert_answers(triton, "MyModel", inputs, {"OUTPUT_1": BYTES_EXPECTED})
        finally:
            triton.stop()
            serving.join(TIMEOUT_S)
        assert not serving.is_alive()


def test_004_background_mode() -> None:
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0))  # Triton() in the seed

    @batch
    def infer_fn(**inputs: np.ndarray):
        input1, input2 = inputs.values()
        outputs = input1 + input2
        return [outputs]

    triton.bind(
        model_name="MyModel",
        infer_func=infer_fn,
        inputs=[
            Tensor(shape=(1,), dtype=np.float32),
            Tensor(shape=(-1,), dtype=np.float32),
        ],
        outputs=[Tensor(shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=16),
    )
    triton.run()
    try:
        assert triton.is_alive()
        input1 = np.array([[1.0], [10.0]], dtype=np.float32)
        input2 = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
        assert_answers(triton, "MyModel", {"INPUT_1": input1, "INPUT_2": input2}, {"OUTPUT_1": input1 + input2})
    finally:
        triton.stop()
    assert not triton.is_alive()


# --- 003: API reference (TritonConfig, decorators, clients)


def test_003_triton_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "45436")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_LOG_VERBOSE", "4")
    triton_config = TritonConfig.from_env()
    assert triton_config.grpc_port == 45436
    assert triton_config.log_verbose == 4


def test_003_config_precedence_explicit_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # "Order of precedence: config parameter, then environment variables, then defaults"
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", "0")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_PORT", "0")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "1")  # a privileged port: binding it would fail
    with Triton(config=TritonConfig(grpc_port=0)) as triton:
        _bind_my_model(triton)
        triton.run()
        assert triton.grpc_port not in (None, 1, 8001)
        assert triton.http_port not in (None, 8000)
        inputs = {"INPUT_1": BYTES_INPUT1, "INPUT_2": BYTES_INPUT2}
        assert_answers(triton, "MyModel", inputs, {"OUTPUT_1": BYTES_EXPECTED})


def test_003_fill_optionals_typical_use(start_triton: Any) -> None:
    # The docstring stacks `@group_by_keys()`; group_by_keys takes no arguments, and calling it fails at
    # import time (in NVIDIA's PyTriton too), so it is applied without parentheses.
    @fill_optionals()
    @group_by_keys
    @batch
    def infer_fun(**inputs):
        outputs = {"total": inputs["a"] + inputs.get("b", 0)}
        return outputs

    @fill_optionals(b=np.array([10.0], dtype=np.float32))
    @group_by_keys
    @batch
    def infer_fun_with_default(**inputs):
        return {"total": inputs["a"] + inputs["b"]}

    def bind(triton: Triton) -> None:
        for name, fn in (("Optional", infer_fun), ("OptionalDefault", infer_fun_with_default)):
            triton.bind(
                name,
                fn,
                inputs=[
                    Tensor(name="a", dtype=np.float32, shape=(1,)),
                    Tensor(name="b", dtype=np.float32, shape=(1,), optional=True),
                ],
                outputs=[Tensor(name="total", dtype=np.float32, shape=(1,))],
            )

    triton = start_triton(bind)
    a = np.array([[1.0], [2.0]], dtype=np.float32)
    b = np.array([[0.5], [0.25]], dtype=np.float32)
    assert_answers(triton, "Optional", {"a": a}, {"total": a})
    assert_answers(triton, "Optional", {"a": a, "b": b}, {"total": a + b})
    assert_answers(triton, "OptionalDefault", {"a": a}, {"total": a + 10})
    assert_answers(triton, "OptionalDefault", {"a": a, "b": b}, {"total": a + b})


def test_003_first_value_both_ways(start_triton: Any) -> None:
    seen: List[Any] = []

    @batch
    @first_value("temperature")
    def infer_fn(**inputs):
        seen.append(inputs["temperature"])
        result = {"scaled": inputs["logits"] / inputs["temperature"]}
        return result

    @first_value("temperature")
    def infer_fn_requests(requests):
        seen.extend(request["temperature"] for request in requests)
        results = [{"scaled": request["logits"] / request["temperature"]} for request in requests]
        return results

    def bind(triton: Triton) -> None:
        for name, fn in (("Batched", infer_fn), ("Requests", infer_fn_requests)):
            triton.bind(
                name,
                fn,
                inputs=[
                    Tensor(name="logits", dtype=np.float32, shape=(-1,)),
                    Tensor(name="temperature", dtype=np.float32, shape=(1,)),
                ],
                outputs=[Tensor(name="scaled", dtype=np.float32, shape=(-1,))],
            )

    triton = start_triton(bind)
    logits = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    temperature = np.full((2, 1), 2.0, dtype=np.float32)
    for name in ("Batched", "Requests"):
        assert_answers(triton, name, {"logits": logits, "temperature": temperature}, {"scaled": logits / 2})
    assert seen and all(np.ndim(value) == 0 and value == 2.0 for value in seen)  # squeezed to scalars
    # strict: different values in one request are an error
    unequal = {"logits": logits, "temperature": np.array([[1.0], [2.0]], dtype=np.float32)}
    assert_fails(triton, "Batched", unequal, ["scaled"], "are not equal")


def test_003_group_by_values(start_triton: Any) -> None:
    groups: List[List[bytes]] = []

    @batch
    @group_by_values("param1", "param2")
    def infer_fun(**inputs):
        groups.append([row[0] for row in inputs["sentences"]])
        tag = f"|p1={inputs['param1'][0, 0]},n={len(inputs['sentences'])}".encode()
        outputs = {"tagged": np.array([[sentence[0] + tag] for sentence in inputs["sentences"]], dtype=object)}
        return outputs

    def bind(triton: Triton) -> None:
        triton.bind(
            "Grouped",
            infer_fun,
            inputs=[
                Tensor(name="sentences", dtype=bytes, shape=(1,)),
                Tensor(name="param1", dtype=np.int32, shape=(1,)),
                Tensor(name="param2", dtype=np.int32, shape=(1,)),
            ],
            outputs=[Tensor(name="tagged", dtype=bytes, shape=(1,))],
        )

    triton = start_triton(bind)
    inputs = {  # the docstring's example batch
        "sentences": _bytes([b"Sentence1"], [b"Sentence2"], [b"Sentence3"]),
        "param1": np.array([[1], [1], [2]], dtype=np.int32),
        "param2": np.array([[1], [1], [1]], dtype=np.int32),
    }
    expected = _bytes([b"Sentence1|p1=1,n=2"], [b"Sentence2|p1=1,n=2"], [b"Sentence3|p1=2,n=1"])
    assert_answers(triton, "Grouped", inputs, {"tagged": expected})
    assert groups == [[b"Sentence1", b"Sentence2"], [b"Sentence3"]] * 2  # two sub-batches, once per client


def test_003_group_by_values_with_constant_padder(start_triton: Any) -> None:
    @batch
    @group_by_values("length", pad_fn=ConstantPadder(-1))
    def tokens(length):
        n = int(length[0, 0])
        return {"ids": np.tile(np.arange(n, dtype=np.int32), (len(length), 1))}  # groups differ in width

    def bind(triton: Triton) -> None:
        triton.bind(
            "Padded",
            tokens,
            inputs=[Tensor(name="length", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="ids", dtype=np.int32, shape=(-1,))],
        )

    triton = start_triton(bind)
    lengths = np.array([[1], [3], [2]], dtype=np.int32)
    expected = np.array([[0, -1, -1], [0, 1, 2], [0, 1, -1]], dtype=np.int32)
    assert_answers(triton, "Padded", {"length": lengths}, {"ids": expected})


# --- 003: client examples; "localhost" (port 8000) is replaced by the test server's HTTP address


@batch
def _two_inputs(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    first, second = inputs.values()
    return {"output_name": first + second}


def _bind_clients_models(triton: Triton) -> None:
    for name, input_names, shape in (
        ("MyModel", ("input_a", "input_b"), (-1,)),
        ("MyModelAB", ("a", "b"), (-1,)),
        ("BERT", ("input1", "input2"), (-1,)),
        ("MyModel224", ("input1", "input2"), (1, 3, 224, 224)),
    ):
        triton.bind(
            name,
            _two_inputs,
            inputs=[Tensor(name=input_name, dtype=np.float32, shape=shape) for input_name in input_names],
            outputs=[Tensor(name="output_name", dtype=np.float32, shape=shape)],
            config=ModelConfig(max_batch_size=8),
        )


@pytest.fixture(scope="module")
def clients_server() -> Any:
    with running_triton(_bind_clients_models) as triton:
        yield triton


def test_003_model_client_typical_usage(clients_server: Triton) -> None:
    url = f"localhost:{clients_server.http_port}"
    a, b = np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)
    input1, input2 = a, b
    with ModelClient(url, "MyModel") as client:
        result_dict = client.infer_sample(input_a=a, input_b=b)
        np.testing.assert_allclose(result_dict["output_name"], a + b)
        result_dict = client.infer_sample(input1, input2)
        np.testing.assert_allclose(result_dict["output_name"], a + b)
        result_dict = client.infer_batch(input1[None], input2[None])
        np.testing.assert_allclose(result_dict["output_name"], (a + b)[None])
        with pytest.raises(PyTritonClientValueError):  # "Mixing of argument passing conventions"
            client.infer_sample(input1, input_b=input2)
    with ModelClient(url, "MyModelAB") as client:
        result_dict = client.infer_sample(a=input1, b=input2)
        np.testing.assert_allclose(result_dict["output_name"], a + b)
        result_dict = client.infer_batch(a=input1[None], b=input2[None])
        np.testing.assert_allclose(result_dict["output_name"], (a + b)[None])
    with ModelClient(url, "BERT") as client:  # "Common usage"
        result_dict = client.infer_sample(a, b)
        np.testing.assert_allclose(result_dict["output_name"], a + b)
    # the same model, answered to tritonclient.http and tritonclient.http.aio
    assert_answers(clients_server, "MyModel", {"input_a": a[None], "input_b": b[None]}, {"output_name": (a + b)[None]})


@LARGE_BODIES
def test_003_asyncio_model_client_typical_usage(clients_server: Triton) -> None:
    url = f"localhost:{clients_server.http_port}"
    input1_sample = np.random.rand(1, 3, 224, 224).astype(np.float32)
    input2_sample = np.random.rand(1, 3, 224, 224).astype(np.float32)

    async def main() -> None:
        async with AsyncioModelClient(url, "MyModel224") as client:
            result_dict = await client.infer_sample(input1_sample, input2_sample)
            print(result_dict["output_name"].shape)
            np.testing.assert_allclose(result_dict["output_name"], input1_sample + input2_sample)
            result_dict = await client.infer_batch(input1_sample[None], input2_sample[None])
            np.testing.assert_allclose(result_dict["output_name"], (input1_sample + input2_sample)[None])
            result_dict = await client.infer_sample(input1=input1_sample, input2=input2_sample)
            np.testing.assert_allclose(result_dict["output_name"], input1_sample + input2_sample)
            # the docstring says PyTritonClientRuntimeError; NVIDIA's client raises PyTritonClientValueError
            with pytest.raises(PyTritonClientValueError):
                await client.infer_sample(input1_sample, input2=input2_sample)

    asyncio.run(main())


def test_003_futures_model_client_example_usage(clients_server: Triton) -> None:
    url = f"localhost:{clients_server.http_port}"
    input1_data = np.array([1.0, 2.0, 3.0], np.float32)
    input2_data = np.array([4.0, 5.0, 6.0], np.float32)
    with FuturesModelClient(url, "BERT") as client:
        future = client.wait_for_model(300.0)
        assert future.result() is None  # None once the model is ready
        result_future = client.infer_sample(input1=input1_data, input2=input2_data)
        # do something else
        np.testing.assert_allclose(result_future.result()["output_name"], input1_data + input2_data)
        future = client.infer_batch(input1_data[None], input2_data[None])
        np.testing.assert_allclose(future.result()["output_name"], (input1_data + input2_data)[None])
        with pytest.raises(PyTritonClientValueError):
            client.infer_sample(input1_data, input2=input2_data).result()


def test_003_clients_over_grpc(clients_server: Triton) -> None:
    # the url may name the protocol: 'grpc://localhost:8001'
    url = f"grpc://localhost:{clients_server.grpc_port}"
    a, b = np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)
    with ModelClient(url, "MyModel") as client:
        np.testing.assert_allclose(client.infer_sample(input_a=a, input_b=b)["output_name"], a + b)

    async def main() -> Optional[np.ndarray]:
        async with AsyncioModelClient(url, "MyModel") as client:
            return (await client.infer_sample(a, b))["output_name"]

    np.testing.assert_allclose(asyncio.run(main()), a + b)
