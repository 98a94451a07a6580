"""Callables returning torch tensors and other DLPack arrays: served as numpy arrays, with the same output checks."""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.core.tensors.datatypes import BF16_DTYPE
from pytriton.core.tensors.host_arrays import host_array, host_arrays
from pytriton.decorators import batch, group_by_values
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url

try:
    import torch
except ImportError:  # a test-time optional, installed by .ci/run: never skipped silently
    pytest.fail(
        "tests/test_framework_outputs.py needs torch (a test extra, installed by .ci/run): pip install -e '.[torch]'",
        pytrace=False,
    )


class DLPackOnly:
    """An array of a framework this project knows nothing about: it offers DLPack and nothing else."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


class DeviceArray:
    """An array that says it lives on a CUDA device: only its own `__array__` may copy it to the host."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.copies = 0

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("device memory cannot be exported to the host")

    def __dlpack_device__(self) -> Any:
        return (2, 0)  # kDLCUDA, device 0

    def __reduce__(self) -> Any:
        raise TypeError("device memory does not travel between processes")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.copies += 1
        COPIED_IN.append(threading.current_thread().name)
        return self._array.copy()


COPIED_IN: List[str] = []


def test_a_cpu_tensor_is_shared_not_copied() -> None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    array = host_array(tensor)
    assert type(array) is np.ndarray and array.dtype == np.float32
    assert np.shares_memory(array, tensor.numpy())


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float16, np.float16),
        (torch.float32, np.float32),
        (torch.float64, np.float64),
        (torch.int8, np.int8),
        (torch.int32, np.int32),
        (torch.int64, np.int64),
        (torch.uint8, np.uint8),
        (torch.bool, np.bool_),
        (torch.bfloat16, BF16_DTYPE),
    ],
)
def test_tensor_dtypes_map_to_numpy(dtype: Any, expected: Any) -> None:
    tensor = torch.ones((2, 2), dtype=dtype)
    array = host_array(tensor)
    assert array.dtype == np.dtype(expected)
    assert array.astype(np.float32).tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_tensors_that_need_grad_or_are_views_convert() -> None:
    weight = torch.ones(3, requires_grad=True)
    assert host_array(weight * 2).tolist() == [2.0, 2.0, 2.0]
    assert host_array(torch.arange(6).reshape(2, 3).t()).tolist() == [[0, 3], [1, 4], [2, 5]]


def test_other_dlpack_arrays_convert_and_device_arrays_copy_once() -> None:
    source = np.arange(4, dtype=np.int32)
    shared = host_array(DLPackOnly(source))
    assert np.shares_memory(shared, source)
    on_device = DeviceArray(np.arange(3, dtype=np.float32))
    assert host_array(on_device).tolist() == [0.0, 1.0, 2.0]
    assert on_device.copies == 1


def test_everything_else_is_left_for_the_checks() -> None:
    for value in ([1, 2], np.float32(1.0), "text", None):
        assert host_array(value) is value
    plain = {"a": np.zeros(1)}
    assert host_arrays(plain) is plain
    mixed = {"a": np.zeros(1), "b": torch.zeros(1)}
    converted = host_arrays(mixed)
    assert converted is not mixed and isinstance(mixed["b"], torch.Tensor)  # the callable's dict is not changed
    assert isinstance(converted["b"], np.ndarray) and converted["a"] is mixed["a"]


@batch
def _scale(x: np.ndarray) -> Dict[str, Any]:
    tensor = torch.tensor(x)
    return {"y": tensor * 2, "half": (tensor / 2).to(torch.bfloat16), "count": torch.full((len(x), 1), len(x))}


def _raw(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, Any]]:
    return [{"y": torch.tensor(request["x"]) * 2} for request in requests]


def _stream(requests: List[Dict[str, np.ndarray]]) -> Iterator[List[Dict[str, Any]]]:
    for step in range(3):
        yield [{"y": torch.tensor(request["x"]) + step} for request in requests]


@batch
@group_by_values("x")
def _grouped(x: np.ndarray) -> Dict[str, Any]:
    return {"y": torch.tensor(x) * 2}


def _on_device(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, Any]]:
    return [{"y": DeviceArray(request["x"] * 3)} for request in requests]


def _wrong_dtype(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, Any]]:
    return [{"y": torch.tensor(request["x"]).to(torch.int32)} for request in requests]


def _not_an_array(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, Any]]:
    return [{"y": request["x"].tolist()} for request in requests]


X = Tensor(name="x", dtype=np.float32, shape=(-1,))
Y = Tensor(name="y", dtype=np.float32, shape=(-1,))


def _bind(triton: Triton) -> None:
    batching = ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000))
    outputs = [Y, Tensor(name="half", dtype="bfloat16", shape=(-1,)), Tensor(name="count", dtype=np.int64, shape=(1,))]
    triton.bind("scale", _scale, [X], outputs, config=batching, strict=True)
    triton.bind("raw", _raw, [X], [Y], config=ModelConfig(max_batch_size=16))
    triton.bind("in_process", ProcessInstances(_raw), [X], [Y], config=ModelConfig(max_batch_size=16))
    triton.bind("on_device_process", ProcessInstances(_on_device), [X], [Y], config=ModelConfig(max_batch_size=16))
    triton.bind("stream", _stream, [X], [Y], config=ModelConfig(batching=False, decoupled=True))
    triton.bind("grouped", _grouped, [X], [Y], config=ModelConfig(max_batch_size=16))
    triton.bind("on_device", _on_device, [X], [Y], config=ModelConfig(max_batch_size=16))
    triton.bind("wrong_dtype", _wrong_dtype, [X], [Y], config=ModelConfig(max_batch_size=16), strict=True)
    triton.bind("not_an_array", _not_an_array, [X], [Y], config=ModelConfig(max_batch_size=16))


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    from tests.conftest import running_triton

    with running_triton(_bind) as triton:
        yield triton


def _http_infer(server: Triton, model: str, x: np.ndarray) -> httpclient.InferResult:
    with httpclient.InferenceServerClient(http_url(server)) as client:
        request = httpclient.InferInput("x", list(x.shape), "FP32")
        request.set_data_from_numpy(x, binary_data=True)
        return client.infer(model, [request])


def test_batched_tensors_are_served_over_http(server: Triton) -> None:
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    result = _http_infer(server, "scale", x)
    assert result.as_numpy("y").tolist() == [[2.0, 4.0, 6.0]]
    assert result.get_output("half")["datatype"] == "BF16"
    assert result.as_numpy("count").tolist() == [[1]]


def test_concurrent_requests_batched_together_each_get_their_rows(server: Triton) -> None:
    answers: Dict[int, Any] = {}

    def ask(index: int) -> None:
        result = _http_infer(server, "scale", np.full((1, 2), index, dtype=np.float32))
        answers[index] = (result.as_numpy("y").tolist(), int(result.as_numpy("count")[0, 0]))

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {index: rows for index, (rows, _) in answers.items()} == {i: [[2.0 * i, 2.0 * i]] for i in range(6)}
    assert all(1 <= count <= 6 for _, count in answers.values())


def test_tensors_are_served_over_grpc_without_decorators(server: Triton) -> None:
    x = np.array([[0.5, 1.5]], dtype=np.float32)
    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        request = grpcclient.InferInput("x", [1, 2], "FP32")
        request.set_data_from_numpy(x)
        assert client.infer("raw", [request]).as_numpy("y").tolist() == [[1.0, 3.0]]
        assert client.infer("grouped", [request]).as_numpy("y").tolist() == [[1.0, 3.0]]
        assert client.infer("in_process", [request]).as_numpy("y").tolist() == [[1.0, 3.0]]  # numpy across


def test_streamed_tensors_are_served(server: Triton) -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)
    received: List[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        received.append(error if error is not None else result.as_numpy("y").tolist())
        if len(received) == 3 or error is not None:
            done.set()

    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        client.start_stream(callback=callback)
        request = grpcclient.InferInput("x", [2], "FP32")
        request.set_data_from_numpy(x)
        client.async_stream_infer("stream", [request])
        assert done.wait(30)
        client.stop_stream()
    assert received == [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0]]


def test_device_outputs_are_copied_in_the_instance_thread_not_on_the_loop(server: Triton) -> None:
    COPIED_IN.clear()
    result = _http_infer(server, "on_device", np.ones((1, 2), dtype=np.float32))
    assert result.as_numpy("y").tolist() == [[3.0, 3.0]]
    assert COPIED_IN == ["pytriton-on_device-1-0"]


def test_process_instances_copy_device_outputs_in_their_own_process(server: Triton) -> None:
    result = _http_infer(server, "on_device_process", np.ones((1, 2), dtype=np.float32))
    assert result.as_numpy("y").tolist() == [[3.0, 3.0]]  # the array itself cannot be pickled


def test_strict_checks_judge_the_converted_tensor(server: Triton) -> None:
    with pytest.raises(InferenceServerException, match=r"Returned output `y` for model `wrong_dtype` has invalid type"):
        _http_infer(server, "wrong_dtype", np.ones((1, 2), dtype=np.float32))


def test_values_that_are_not_arrays_are_still_refused(server: Triton) -> None:
    with pytest.raises(InferenceServerException, match="Not all values returned by `not_an_array` model callable"):
        _http_infer(server, "not_an_array", np.ones((1, 2), dtype=np.float32))
