"""Process instances: callables in processes of their own, served as thread instances are, and their faults."""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import queue
import signal
import sys
import threading
import time
import types
from typing import Any, AsyncIterator, Dict, Iterator, List

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.core.tensors.raw_tensors import PIECE_ELEMENTS
from pytriton.decorators import batch, fill_optionals, first_value, get_model_config, group_by_values
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonUnrecoverableError
from pytriton.instances import DEFAULT_SHM_BUDGET_BYTES, ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.proxy.types import Response
from pytriton.triton import Triton, TritonConfig
from tests.conftest import HTTP_AUTH, grpc_url, http_url, memfds_held, running_triton
from tests.fleet import wait_until
from tests.test_metrics import labels, sample, scrape

FP32_IO = {
    "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
    "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
}
PID_IO = {
    "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
    "outputs": [Tensor(name="pid", dtype=np.int64, shape=(1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))],
}


@batch
def double(x: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x * 2}


@batch
def with_pid(x: np.ndarray) -> Dict[str, np.ndarray]:
    return {"pid": np.full((len(x), 1), os.getpid(), dtype=np.int64), "y": x}


@batch
def slow_with_pid(x: np.ndarray) -> Dict[str, np.ndarray]:
    time.sleep(float(x.flat[0]))
    return {"pid": np.full((len(x), 1), os.getpid(), dtype=np.int64), "y": x}


def meet(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Leave this process's pid in $MEET_DIR, then run Python until another process has left its own (30 s at
    most); answer how many pids it saw."""
    folder = pathlib.Path(os.environ["MEET_DIR"])
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + 30
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        pass
    seen = np.array([len(os.listdir(folder))], dtype=np.int64)
    return [{"seen": seen, "pid": np.array([os.getpid()], dtype=np.int64)} for _ in requests]


def crash_on_negative(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    for request in requests:
        if (request["x"] < 0).any():
            os.kill(os.getpid(), signal.SIGKILL)
        if (request["x"] > 1000).any():
            os._exit(3)
    return [{"pid": np.array([os.getpid()], dtype=np.int64), "y": request["x"]} for request in requests]


def raises(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise ValueError("the model refused this batch")


def unrecoverable(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise PyTritonUnrecoverableError("the GPU is gone")


def echo_parameters(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    out = []
    for request in requests:
        described = sorted(f"{key}={value}" for key, value in (request.parameters or {}).items())
        out.append({"params": np.array([";".join(described).encode()], dtype=np.object_), "y": request["x"]})
    return out


def echo_bytes(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"out": np.array([item[::-1] for item in request["text"].flat], dtype=np.object_)} for request in requests]


def negate(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": -request["x"]} for request in requests]


async def async_double(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    await asyncio.sleep(0.001)
    return [{"y": request["x"] * 2} for request in requests]


def countdown(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(3):
        yield [{"y": request["x"] + step} for request in requests]


async def async_countdown(requests: List[Any]) -> AsyncIterator[List[Dict[str, np.ndarray]]]:
    for step in range(3):
        await asyncio.sleep(0)
        yield [{"y": request["x"] + step} for request in requests]


def environment(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    text = f"{os.environ.get('PYTRITON_INSTANCE_INDEX')}:{os.environ.get('DEVICE')}:{os.getpid()}"
    return [{"env": np.array([text.encode()], dtype=np.object_)} for _ in requests]


class Scaler:
    """A class holding a 'model' (its weight), bound by method."""

    def __init__(self, weight: float) -> None:
        self.weight = np.float32(weight)

    @batch
    def infer(self, x: np.ndarray) -> Dict[str, np.ndarray]:
        return {"y": x * self.weight}

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return [{"y": request["x"] * self.weight} for request in requests]


def make_environment_model() -> Any:
    """A factory: runs in the instance process, as a model that loads its weights there would."""
    loaded_in = os.getpid()

    def infer(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        text = f"{os.environ['PYTRITON_INSTANCE_INDEX']}:{os.environ.get('DEVICE')}:{loaded_in}"
        return [{"env": np.array([text.encode()], dtype=np.object_)} for _ in requests]

    return infer


def failing_factory() -> Any:
    raise RuntimeError("weights not found at /models/missing.pt")


@batch
@group_by_values("mode")
@first_value("mode")
def grouped(x: np.ndarray, mode: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x * (2 if mode == b"double" else 1)}


@fill_optionals(offset=np.array([100.0], dtype=np.float32))
@batch
def optional_offset(x: np.ndarray, offset: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x + offset}


@batch
def reports_config(x: np.ndarray) -> Dict[str, np.ndarray]:
    config = get_model_config(reports_config, None)
    return {"y": np.full_like(x, config.max_batch_size)}


def _infer(triton: Triton, model: str, inputs: Dict[str, np.ndarray], **kwargs: Any) -> Dict[str, np.ndarray]:
    with httpclient.InferenceServerClient(http_url(triton)) as client:
        tensors = []
        for name, value in inputs.items():
            datatype = "BYTES" if value.dtype == np.object_ else httpclient.np_to_triton_dtype(value.dtype)
            datatype = "BF16" if value.dtype == ml_dtypes.bfloat16 else datatype
            tensor = httpclient.InferInput(name, list(value.shape), datatype)
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        result = client.infer(model, tensors, **kwargs)
        response = result.get_response()
        return {output["name"]: result.as_numpy(output["name"]) for output in response["outputs"]}


def _bind_basic(triton: Triton) -> None:
    batching = ModelConfig(max_batch_size=8)
    triton.bind("double", ProcessInstances(double, count=2), **FP32_IO, config=batching)
    triton.bind("scaler_method", ProcessInstances(Scaler(3.0).infer), **FP32_IO, config=batching)
    triton.bind("scaler_object", ProcessInstances(Scaler(5.0)), **FP32_IO, config=ModelConfig(batching=False))
    weight = np.float32(7)

    def closure(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return [{"y": request["x"] * weight} for request in requests]

    triton.bind("closure", ProcessInstances(closure), **FP32_IO, config=ModelConfig(batching=False))
    triton.bind("async_double", ProcessInstances(async_double), **FP32_IO, config=ModelConfig(batching=False))
    triton.bind(
        "grouped",
        ProcessInstances(grouped),
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,)), Tensor(name="mode", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=batching,
    )
    triton.bind(
        "optional_offset",
        ProcessInstances(optional_offset),
        inputs=[
            Tensor(name="x", dtype=np.float32, shape=(-1,)),
            Tensor(name="offset", dtype=np.float32, shape=(1,), optional=True),
        ],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=batching,
    )
    triton.bind("reports_config", ProcessInstances(reports_config), **FP32_IO, config=ModelConfig(max_batch_size=5))
    triton.bind(
        "parameters",
        ProcessInstances(echo_parameters),
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="params", dtype=bytes, shape=(1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "bytes",
        ProcessInstances(echo_bytes),
        inputs=[Tensor(name="text", dtype=bytes, shape=(-1,))],
        outputs=[Tensor(name="out", dtype=bytes, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind("raises", ProcessInstances(raises), **FP32_IO, config=ModelConfig(batching=False))
    bf16 = [Tensor(name="x", dtype=ml_dtypes.bfloat16, shape=(-1,))], [Tensor(name="y", dtype="bfloat16", shape=(-1,))]
    triton.bind("bf16", ProcessInstances(negate), inputs=bf16[0], outputs=bf16[1], config=ModelConfig(batching=False))
    decoupled = ModelConfig(batching=False, decoupled=True)
    triton.bind("countdown", ProcessInstances(countdown), **FP32_IO, config=decoupled)
    triton.bind("async_countdown", ProcessInstances(async_countdown), **FP32_IO, config=decoupled)


@pytest.fixture(scope="module")
def basic() -> Iterator[Triton]:
    with running_triton(_bind_basic, http_header_forward_pattern="x-forward-.*") as triton:
        yield triton


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("double", [2.0, 4.0]),
        ("scaler_method", [3.0, 6.0]),
        ("scaler_object", [5.0, 10.0]),
        ("closure", [7.0, 14.0]),
        ("async_double", [2.0, 4.0]),
        ("reports_config", [5.0, 5.0]),
    ],
)
def test_each_kind_of_callable_is_served(basic: Triton, model: str, expected: List[float]) -> None:
    shape = (1, 2) if model in ("double", "scaler_method", "reports_config") else (2,)
    outputs = _infer(basic, model, {"x": np.array([1.0, 2.0], dtype=np.float32).reshape(shape)})
    assert outputs["y"].reshape(-1).tolist() == expected


def test_grpc_and_http_reach_the_same_process_instances(basic: Triton) -> None:
    with grpcclient.InferenceServerClient(grpc_url(basic)) as client:
        tensor = grpcclient.InferInput("x", [3, 2], "FP32")
        tensor.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2))
        result = client.infer("double", [tensor])
    assert result.as_numpy("y").tolist() == [[0, 2], [4, 6], [8, 10]]


def test_decorators_that_read_the_model_config_work_in_the_process(basic: Triton) -> None:
    x = np.ones((1, 2), dtype=np.float32)
    doubled = _infer(basic, "grouped", {"x": x, "mode": np.array([[b"double"]], dtype=np.object_)})
    assert doubled["y"].tolist() == [[2.0, 2.0]]
    assert _infer(basic, "optional_offset", {"x": x})["y"].tolist() == [[101.0, 101.0]]


def test_parameters_and_forwarded_headers_reach_the_process(basic: Triton) -> None:
    outputs = _infer(
        basic,
        "parameters",
        {"x": np.ones(2, dtype=np.float32)},
        parameters={"temperature": 0.5, "mode": "fast"},
        headers={"x-forward-tenant": "acme"},
    )
    assert outputs["params"].tolist() == [b"mode=fast;temperature=0.5;x-forward-tenant=acme"]


def test_bytes_tensors_travel_both_ways(basic: Triton) -> None:
    text = np.array([b"abc", b"", b"\x00\xffz"], dtype=np.object_)
    assert _infer(basic, "bytes", {"text": text})["out"].tolist() == [b"cba", b"", b"z\xff\x00"]


def test_bf16_tensors_keep_their_dtype_in_the_process(basic: Triton) -> None:
    """ml_dtypes' bfloat16 is a registered dtype (isbuiltin 2): it once crossed as raw bytes ('<V2') and was refused."""
    x = np.array([1.0, -2.5, 3.140625], dtype=ml_dtypes.bfloat16)
    assert _infer(basic, "bf16", {"x": x})["y"].astype(np.float32).tolist() == [-1.0, 2.5, -3.140625]


def test_large_tensors_go_through_shared_memory_intact(basic: Triton) -> None:
    x = np.random.default_rng(0).random((1, 1 << 20), dtype=np.float32)  # 4 MiB
    assert np.array_equal(_infer(basic, "double", {"x": x})["y"], x * 2)


def test_an_exception_in_the_process_fails_the_request_with_its_type_and_message(basic: Triton) -> None:
    with pytest.raises(httpclient.InferenceServerException) as raised:
        _infer(basic, "raises", {"x": np.ones(1, dtype=np.float32)})
    assert "the model refused this batch" in str(raised.value)
    assert _infer(basic, "double", {"x": np.ones((1, 1), dtype=np.float32)})["y"].tolist() == [[2.0]]


@pytest.mark.parametrize("model", ["countdown", "async_countdown"])
def test_generators_stream_from_the_process(basic: Triton, model: str) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url(basic)) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        tensor = grpcclient.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([10.0], dtype=np.float32))
        client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
        values = []
        while True:
            result, error = responses.get(timeout=30)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            values.append(result.as_numpy("y").tolist())
        client.stop_stream()
    assert values == [[10.0], [11.0], [12.0]]


def test_two_process_instances_run_python_at_the_same_time(tmp_path: pathlib.Path) -> None:
    # Each call runs Python until the other has begun: two calls that could not run at once (one process, one
    # GIL, or one call at a time) would each see only itself. Overlapping 0.4 s calls needed both requests sent
    # within 0.4 s, and a loaded machine did not always send them so.
    def bind(triton: Triton) -> None:
        triton.bind(
            "meet",
            ProcessInstances(meet, count=2, env={"MEET_DIR": str(tmp_path)}),
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="seen", dtype=np.int64, shape=(1,)), Tensor(name="pid", dtype=np.int64, shape=(1,))],
            config=ModelConfig(batching=False),
        )

    with running_triton(bind) as triton:
        results: List[Dict[str, np.ndarray]] = []
        threads = [
            threading.Thread(target=lambda: results.append(_infer(triton, "meet", {"x": np.array([0.0], np.float32)})))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    pids = {int(result["pid"][0]) for result in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert [int(result["seen"][0]) for result in results] == [2, 2], "the two calls did not run at the same time"


def test_each_instance_gets_its_environment_and_a_factory_runs_in_the_process() -> None:
    def bind(triton: Triton) -> None:
        env_io = {"inputs": [Tensor(name="x", dtype=np.float32, shape=(1,))]}
        env_io["outputs"] = [Tensor(name="env", dtype=bytes, shape=(1,))]
        plain = ModelConfig(batching=False)
        devices = ProcessInstances(environment, count=2, env=lambda index: {"DEVICE": f"cuda:{index}"})
        triton.bind("by_function", devices, **env_io, config=plain)
        factory = ProcessInstances(factory=make_environment_model, count=2, env=[{"DEVICE": "a"}, {"DEVICE": "b"}])
        triton.bind("by_factory", factory, **env_io, config=plain)

    with running_triton(bind) as triton:
        seen: Dict[str, set] = {"by_function": set(), "by_factory": set()}  # type: ignore[type-arg]
        for model in seen:
            deadline = time.monotonic() + 30
            while len(seen[model]) < 2 and time.monotonic() < deadline:
                threads = [
                    threading.Thread(
                        target=lambda model=model: seen[model].add(
                            _infer(triton, model, {"x": np.zeros(1, np.float32)})["env"][0].decode()
                        )
                    )
                    for _ in range(4)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
    index_device = {model: {value.rsplit(":", 1)[0] for value in values} for model, values in seen.items()}
    assert index_device == {"by_function": {"0:cuda:0", "1:cuda:1"}, "by_factory": {"0:a", "1:b"}}
    assert all(int(value.rsplit(":", 1)[1]) != os.getpid() for value in seen["by_factory"])


# A server started by `with Triton(...)`, as users write it, but on ports it picks (8000-8002 may be taken).
FREE_PORTS = TritonConfig(http_port=0, grpc_port=0, metrics_port=0)


def test_a_callable_that_cannot_travel_is_refused_at_bind_with_what_to_do() -> None:
    lock = threading.Lock()

    def holds_a_lock(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        with lock:
            return [{"y": request["x"]} for request in requests]

    with Triton(config=FREE_PORTS) as triton, pytest.raises(PyTritonBadParameterError, match="factory"):
        triton.bind("lock", ProcessInstances(holds_a_lock), **FP32_IO)


def test_a_callable_bound_as_threads_can_be_bound_again_in_processes() -> None:
    """Binding attaches the server's context to the callable; the context must not stop it from travelling."""

    def double(requests: List[Any]) -> List[Dict[str, np.ndarray]]:  # local: pickled by value, with its __dict__
        return [{"y": request["x"] * 2} for request in requests]

    with Triton(config=FREE_PORTS) as triton:
        triton.bind("threads", double, **FP32_IO)
        triton.bind("processes", ProcessInstances(double), **FP32_IO)
        triton.run()
        client = httpclient.InferenceServerClient(http_url(triton))
        infer_input = httpclient.InferInput("x", [1, 2], "FP32")
        infer_input.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
        for model in ("threads", "processes"):
            assert client.infer(model, [infer_input]).as_numpy("y").tolist() == [[2.0, 4.0]], model
        client.close()


def test_a_factory_that_raises_fails_the_bind_with_its_traceback() -> None:
    with Triton(config=FREE_PORTS) as triton, pytest.raises(PyTritonRuntimeError) as raised:
        triton.bind("broken", ProcessInstances(factory=failing_factory, count=2), **FP32_IO)
    message = str(raised.value)
    assert "model 'broken' did not start" in message
    assert "weights not found at /models/missing.pt" in message
    assert "failing_factory" in message  # the traceback from the instance process


def test_bad_process_instances_arguments_are_refused() -> None:
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances()
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances(double, factory=make_environment_model)
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances(double, count=0)
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances([double, double], count=3)
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances(double, count=2, env=[{"A": "1"}])
    with pytest.raises(PyTritonBadParameterError):
        ProcessInstances(double, env={"A": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "options",
    [
        {"count": True},
        {"shm_budget_bytes": "1"},
        {"shm_budget_bytes": 1.5},
        {"start_timeout_s": float("nan")},
        {"start_timeout_s": "5"},
        {"env": {"A": "x\0y"}},
        {"env": {"A=B": "x"}},
        {"env": {"": "x"}},
    ],
)
def test_options_the_processes_could_not_start_with_are_refused_when_given(options: Dict[str, Any]) -> None:
    """They were taken, then failed the server's start ("embedded null byte") or raised a bare TypeError."""
    with pytest.raises(PyTritonBadParameterError, match="ProcessInstances"):
        ProcessInstances(double, **options)


def forever(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    while True:
        yield [{"y": request["x"]} for request in requests]
        time.sleep(0.01)


def test_a_cancelled_stream_stops_the_generator_in_the_process() -> None:
    def bind(triton: Triton) -> None:
        decoupled = ModelConfig(batching=False, decoupled=True)
        triton.bind("forever", ProcessInstances(forever), **FP32_IO, config=decoupled)
        triton.bind("countdown", ProcessInstances(countdown), **FP32_IO, config=decoupled)

    with running_triton(bind) as triton:
        for _ in range(2):  # the second stream is served only if the first one's generator stopped
            responses: queue.Queue[Any] = queue.Queue()
            with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
                client.start_stream(callback=lambda result, error, into=responses: into.put((result, error)))
                tensor = grpcclient.InferInput("x", [1], "FP32")
                tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
                client.async_stream_infer("forever", [tensor])
                for _ in range(3):
                    result, error = responses.get(timeout=30)
                    assert error is None and result.as_numpy("y").tolist() == [1.0]
                client.stop_stream(cancel_requests=True)


def test_statistics_count_process_instance_calls(basic: Triton) -> None:
    with httpclient.InferenceServerClient(http_url(basic)) as client:
        before = client.get_inference_statistics("async_double", headers=HTTP_AUTH)["model_stats"][0]
        for _ in range(3):
            _infer(basic, "async_double", {"x": np.ones(2, dtype=np.float32)})
        after = client.get_inference_statistics("async_double", headers=HTTP_AUTH)["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert int(after["inference_stats"]["compute_infer"]["ns"]) > int(before["inference_stats"]["compute_infer"]["ns"])


def odd_arrays(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Outputs of kinds a model may return: an ndarray subclass, Fortran order, a strided view of a larger array."""
    kind = int(requests[0]["x"].flat[0])
    x = requests[0]["x"]
    if kind == 0:
        y = np.ma.masked_array(x * 2, mask=np.zeros(x.shape, dtype=bool))
    elif kind == 1:
        y = np.asfortranarray(np.stack([x * 2, x * 3], axis=1))[:, 0]
    else:
        y = np.repeat(x * 2, 3)[::3]
    return [{"y": y}]


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_outputs_of_odd_array_kinds_reach_the_client(kind: int) -> None:
    """A masked array (an ndarray subclass) failed the request: "'numpy.ndarray' object has no attribute 'cast'"."""

    def bind(triton: Triton) -> None:
        triton.bind("odd", ProcessInstances(odd_arrays), **FP32_IO, config=ModelConfig(batching=False))

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        x = np.array([kind, 5, 7], dtype=np.float32)
        assert _infer(triton, "odd", {"x": x})["y"].tolist() == (x * 2).tolist()


def numpy_bytes(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """BYTES outputs whose elements are numpy's bytes_ with trailing NULs: alone, first of two, first of a long one."""
    ends = np.bytes_(b"a\x00\x00")
    long = np.full(PIECE_ELEMENTS, b"z", dtype=object)
    long[0] = ends
    shapes = {0: np.array([ends], dtype=object), 1: np.array([ends, b"b"], dtype=object), 2: long}
    return [{"y": shapes[int(request["x"].flat[0])]} for request in requests]


def test_numpy_bytes_with_trailing_nuls_reach_the_client_as_from_a_thread_instance() -> None:
    """The first element of a BYTES output stays as it is for the server's checks, and numpy's bytes_ pickles
    without its trailing NULs: np.bytes_(b"a\\x00\\x00") arrived as b"a" from a process instance, whole from a
    thread instance."""
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="y", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("threads", numpy_bytes, **io, config=ModelConfig(batching=False))
        triton.bind("processes", ProcessInstances(numpy_bytes), **io, config=ModelConfig(batching=False))

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        for shape in (0, 1, 2):
            x = {"x": np.array([shape], dtype=np.float32)}
            expected = _infer(triton, "threads", x)["y"].tolist()
            assert expected[0] == b"a\x00\x00"
            assert _infer(triton, "processes", x)["y"].tolist() == expected


def responses_of_other_kinds(requests: List[Any]) -> List[Any]:
    """Responses that are no plain dict: the requests themselves, Response objects, an OrderedDict, a mappingproxy."""
    kind = int(requests[0]["x"].flat[0])
    y = np.array([np.bytes_(b"a\x00"), b"b"], dtype=object)
    if kind == 0:
        for request in requests:
            request.data["y"] = y
        return requests
    if kind == 1:
        return [Response(data={"y": y}) for _ in requests]
    if kind == 2:
        return [collections.OrderedDict(y=y) for _ in requests]
    return [types.MappingProxyType({"y": y}) for _ in requests]


def test_responses_that_are_no_plain_dict_are_answered_as_a_thread_instance_answers_them() -> None:
    """The server reads a Request or Response returned as a response by its data: from a process instance, a
    Request failed ('cannot pickle 'socket' object': it holds the process's channel), the BYTES of a Response or an
    OrderedDict lost what travelling in a plain dict keeps (numpy's bytes_ pickles without its trailing NULs), and a
    mappingproxy failed with pickle's words, not as no dict."""
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="y", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("threads", responses_of_other_kinds, **io, config=ModelConfig(batching=False))
        triton.bind("processes", ProcessInstances(responses_of_other_kinds), **io, config=ModelConfig(batching=False))

    def answer(triton: Triton, model: str, kind: int) -> Any:
        try:
            return _infer(triton, model, {"x": np.array([kind], dtype=np.float32)})["y"].tolist()
        except httpclient.InferenceServerException as error:
            return error.status(), error.message().replace(f"`{model}`", "`m`")

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        for kind in (0, 1, 2):
            assert answer(triton, "threads", kind) == [b"a\x00", b"b"]
            assert answer(triton, "processes", kind) == [b"a\x00", b"b"], kind
        refused = answer(triton, "threads", 3)
        assert refused[0] == "500" and "must be list of response dicts" in refused[1]
        assert answer(triton, "processes", 3) == refused


def doubled_unless_negative(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    if any((request["x"] < 0).any() for request in requests):
        raise ValueError("negative input")
    return [{"y": request["x"] * 2} for request in requests]


def test_metrics_count_process_instances_as_threads() -> None:
    """The same requests to a model on threads and on processes give the same counters (nv_inference_count...)."""

    def bind(triton: Triton) -> None:
        batching = ModelConfig(max_batch_size=8)
        triton.bind("on_threads", doubled_unless_negative, **FP32_IO, config=batching)
        triton.bind("on_processes", ProcessInstances(doubled_unless_negative, count=2), **FP32_IO, config=batching)

    with running_triton(bind) as triton:
        for model in ("on_threads", "on_processes"):
            for rows in (1, 2, 3):  # one at a time: three executions of 6 inferences, then one that fails
                _infer(triton, model, {"x": np.ones((rows, 2), dtype=np.float32)})
            with pytest.raises(httpclient.InferenceServerException, match="negative input"):
                _infer(triton, model, {"x": -np.ones((1, 2), dtype=np.float32)})
        families = scrape(triton)
    for model in ("on_threads", "on_processes"):
        assert sample(families, "nv_inference_count", **labels(model)) == 6
        assert sample(families, "nv_inference_exec_count", **labels(model)) == 4  # the failed one ran too
        assert sample(families, "nv_inference_request_success", **labels(model)) == 3
        assert sample(families, "nv_inference_request_failure", **labels(model), reason="BACKEND") == 1
        assert sample(families, "nv_inference_compute_infer_duration_us", **labels(model)) > 0
    per_model = [
        {
            (series.name, tuple(sorted((k, v) for k, v in series.labels.items() if k != "model")), series.value)
            for family in families.values()
            for series in family.samples
            if series.labels.get("model") == model and "duration" not in series.name and "summary" not in series.name
        }
        for model in ("on_threads", "on_processes")
    ]
    assert per_model[0] == per_model[1]  # the same series, counting the same, for both


@pytest.mark.parametrize(("count", "processes"), [(1, "1 instance process"), (2, "2 instance processes")])
def test_starting_instances_is_logged(caplog: pytest.LogCaptureFixture, count: int, processes: str) -> None:
    def bind(triton: Triton) -> None:
        triton.bind("logged", ProcessInstances(double, count=count), **FP32_IO, config=ModelConfig(max_batch_size=2))

    with caplog.at_level("INFO", logger="pytriton"), running_triton(bind):
        pass
    messages = [record.getMessage() for record in caplog.records]
    assert f"model 'logged': starting {processes}" in messages
    assert (
        sum(message.startswith("model 'logged': instance ") and " is up (pid " in message for message in messages)
        == count
    )
    assert any(message.startswith(f"model 'logged': {processes} ready in ") for message in messages)


def generator_on_a_plain_model(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"y": request["x"]} for request in requests]


def test_a_result_that_cannot_leave_the_process_fails_its_request_at_once() -> None:
    def bind(triton: Triton) -> None:
        triton.bind("gen", ProcessInstances(generator_on_a_plain_model), **FP32_IO, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        started = time.monotonic()
        with pytest.raises(httpclient.InferenceServerException, match="generator"):
            _infer(triton, "gen", {"x": np.ones(1, dtype=np.float32)})
        assert time.monotonic() - started < 10


def test_results_the_server_keeps_are_never_overwritten_by_later_ones() -> None:
    """The response cache holds results: their regions of the process's arena stay leased, whatever follows."""

    def bind(triton: Triton) -> None:
        cached = ModelConfig(max_batch_size=4, response_cache=True)
        triton.bind("cached", ProcessInstances(double, shm_budget_bytes=8 << 20), **FP32_IO, config=cached)

    held_before = memfds_held()  # the module's server has its own
    with running_triton(bind, cache_config=["local,size=67108864"]) as triton:
        inputs = [np.full((1, 1 << 18), float(index), dtype=np.float32) for index in range(24)]  # 1 MiB each
        for x in inputs:
            assert np.array_equal(_infer(triton, "cached", {"x": x})["y"], x * 2)
        for x in inputs:  # cache hits, served from the results first received
            assert np.array_equal(_infer(triton, "cached", {"x": x})["y"], x * 2)
    assert memfds_held() <= held_before  # the stop let the cached results go, and the process's arena with them


_KEPT: List[np.ndarray] = []


def keeps_its_inputs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Keeps every input it is given (a global of the process); answers with the first element of each, oldest first."""
    _KEPT.extend(request["x"] for request in requests)
    seen = np.array([kept.flat[0] for kept in _KEPT], dtype=np.float32)
    return [{"y": seen} for _ in requests]


def test_inputs_a_model_keeps_never_change_under_it() -> None:
    """Later batches never go where a model's kept inputs lie (the arena was reused for every batch: they changed)."""

    def bind(triton: Triton) -> None:
        triton.bind("keeper", ProcessInstances(keeps_its_inputs), **FP32_IO, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        for value in range(1, 9):
            size = 16 if value % 2 else 1 << 18  # small inputs (copied out) and 1 MiB ones (viewed in the arena)
            seen = _infer(triton, "keeper", {"x": np.full(size, float(value), dtype=np.float32)})["y"]
            assert seen.tolist() == list(range(1, value + 1))


def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"]} for request in requests]


def all_but_first(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"][..., 1:]} for request in requests]


def test_outputs_that_are_the_inputs_come_back_intact_under_load() -> None:
    """An identity's outputs (and slices of the inputs) are not copied in the process: the server's arena holds them
    until their responses are out, while the batches of other clients come and go."""

    def bind(triton: Triton) -> None:
        batching = ModelConfig(max_batch_size=8)
        triton.bind("identity", ProcessInstances(identity), **FP32_IO, config=batching)
        triton.bind("all_but_first", ProcessInstances(all_but_first), **FP32_IO, config=batching)

    def client(triton: Triton, index: int, problems: queue.Queue[str]) -> None:
        rng = np.random.default_rng(index)
        use_grpc = index % 2 == 1
        http = httpclient.InferenceServerClient(http_url(triton))
        grpc = grpcclient.InferenceServerClient(grpc_url(triton))
        try:
            for request in range(10):
                model = "identity" if request % 2 else "all_but_first"
                x = rng.random((1, 1 << 18), dtype=np.float32)  # 1 MiB
                if use_grpc:
                    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    y = grpc.infer(model, [tensor]).as_numpy("y")
                else:
                    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    y = http.infer(model, [tensor]).as_numpy("y")
                expected = x if model == "identity" else x[..., 1:]
                if not np.array_equal(y, expected):
                    problems.put(f"client {index} request {request} ({model}): the output differs")
        except Exception as error:  # noqa: BLE001 - reported by the test
            problems.put(f"client {index}: {error!r}")
        finally:
            http.close()
            grpc.close()

    with running_triton(bind) as triton:
        problems: queue.Queue[str] = queue.Queue()
        threads = [threading.Thread(target=client, args=(triton, index, problems)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert problems.empty(), problems.get()


def pid_and_size(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [
        {"pid": np.array([os.getpid()], np.int64), "size": np.array([request["x"].size], np.int64)}
        for request in requests
    ]


def _anonymous_memory(pid: int) -> int:
    """The process's private memory in bytes (RssAnon)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def test_inputs_past_the_shared_memory_budget_are_let_go_when_the_call_ends() -> None:
    """Inputs over the instance's shared memory budget travel in its message's body, which the process's serving
    loop held until the next message came: an idle instance kept the last such request (1 GiB of it) for good."""

    def bind(triton: Triton) -> None:
        triton.bind(
            "sizes",
            ProcessInstances(pid_and_size, shm_budget_bytes=1 << 20),
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="pid", dtype=np.int64, shape=(1,)), Tensor(name="size", dtype=np.int64, shape=(1,))],
            config=ModelConfig(batching=False),
        )

    large = 48 << 20  # over glibc's largest mmap threshold (32 MiB): freed, its pages go back at once
    with running_triton(bind) as triton:
        pid = int(_infer(triton, "sizes", {"x": np.ones(4, dtype=np.float32)})["pid"][0])
        before = _anonymous_memory(pid)
        answer = _infer(triton, "sizes", {"x": np.ones(large // 4, dtype=np.float32)})
        assert answer["size"].tolist() == [large // 4]
        # Let go of as the call ends, after the answer was sent: under load the process may not have run on yet.
        wait_until(lambda: _anonymous_memory(pid) - before < large // 2, 30.0, "the instance to let go of the inputs")


def locks_for_negatives(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A BYTES output each; a request whose x is -1 gets a lock past its first element, -2 a lock first."""
    answers = []
    for request in requests:
        value = float(request["x"].flat[0])
        elements: List[Any] = [b"first", b"plain"]
        if value == -1:
            elements[1] = threading.Lock()
        elif value == -2:
            elements[0] = threading.Lock()
        answers.append({"y": np.array([elements], dtype=object)})
    return answers


@pytest.mark.parametrize("odd", [-1.0, -2.0])
def test_an_output_that_does_not_pickle_fails_its_request_alone_naming_it(odd: float) -> None:
    """The batch's whole result stood in for by its repr, and every request of the batch failed with 'must be list
    of response dicts with numpy arrays', which it was. Now elements past an object output's first go as a thread
    instance's would (the str of one not bytes); a first element that does not pickle fails only its request, saying
    which output could not leave the process and pickle's reason."""
    config = ModelConfig(max_batch_size=2, batcher=DynamicBatcher(max_queue_delay_microseconds=30_000_000))
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="y", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("locks", ProcessInstances(locks_for_negatives), **io, config=config)

    with running_triton(bind) as triton:
        answers: Dict[float, Any] = {}

        def infer(value: float) -> None:
            try:
                answers[value] = _infer(triton, "locks", {"x": np.array([[value]], dtype=np.float32)})["y"]
            except httpclient.InferenceServerException as error:
                answers[value] = error

        threads = [threading.Thread(target=infer, args=(value,)) for value in (odd, 1.0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers[1.0].tolist() == [[b"first", b"plain"]]
        if odd == -1.0:
            first, second = answers[odd].tolist()[0]
            assert first == b"first" and second.startswith(b"<unlocked _thread.lock object"), answers[odd]
        else:
            assert isinstance(answers[odd], httpclient.InferenceServerException)
            assert "output 'y' could not be sent from the instance process" in str(answers[odd])
            assert "cannot pickle '_thread.lock' object" in str(answers[odd])


def child_only_objects_factory() -> Any:
    """In the instance process: a model that returns objects of a module the server cannot import.

    x 1: a BYTES output with one past its first element; 2: one as an output's value; 3: one as the whole result.
    """
    import types

    module = types.ModuleType("a_module_only_the_instance_has")
    thing = type("Thing", (), {"__module__": module.__name__, "__str__": lambda self: "a thing"})
    module.Thing = thing  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module

    def infer(requests: List[Any]) -> Any:
        kind = float(requests[0]["x"].flat[0])
        if kind == 3:
            return thing()
        pid = np.array([[os.getpid()]])
        y = np.array([[b"first", thing()]], dtype=object) if kind == 1 else thing()
        return [{"y": y, "pid": pid} for _ in requests]

    return infer


def test_objects_the_server_cannot_import_are_answered_as_a_thread_instance_s_without_a_restart() -> None:
    """An object of a class only the instance process could import made its result unreadable in the server, which
    closed the channel: the request failed with 'InstanceDied ... exited with status 0' and the process was started
    again. An element past an object output's first now goes as its str; elsewhere it reaches the server's checks
    as a stand-in named like its class, which refuse it in a thread instance's words."""
    io = {
        "inputs": FP32_IO["inputs"],
        "outputs": [Tensor(name="y", dtype=bytes, shape=(-1,)), Tensor(name="pid", dtype=np.int64, shape=(1,))],
    }

    def bind(triton: Triton) -> None:
        model = ProcessInstances(factory=child_only_objects_factory)
        triton.bind("child_only", model, **io, config=ModelConfig(max_batch_size=2))

    def infer(triton: Triton, kind: float) -> Dict[str, np.ndarray]:
        return _infer(triton, "child_only", {"x": np.full((1, 1), kind, dtype=np.float32)})

    with running_triton(bind) as triton:
        first = infer(triton, 1)
        assert first["y"].tolist() == [[b"first", b"a thing"]]
        with pytest.raises(httpclient.InferenceServerException, match="output `y` is a a_module_only_the_instance_has"):
            infer(triton, 2)
        with pytest.raises(httpclient.InferenceServerException, match="must be list of response dicts"):
            infer(triton, 3)
        assert infer(triton, 1)["pid"].tolist() == first["pid"].tolist()


def answers_a_lock_unless_positive(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A BYTES output; past its first element a lock, unless x is positive."""
    answers = []
    for request in requests:
        second: Any = b"plain" if float(request["x"].flat[0]) > 0 else threading.Lock()
        answers.append({"y": np.array([[b"first", second]], dtype=object)})
    return answers


def calls_the_lock_model(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    from pytriton.compose import call_model

    answer = call_model("lock_answers", {"x": requests[0]["x"]})
    return [{"y": answer["y"]} for _ in requests]


def test_a_model_call_whose_answer_cannot_reach_the_process_fails_and_the_instance_serves_on() -> None:
    """The answer's message failed to pickle on the server's loop and was never sent: the callable waited for it for
    ever, and its instance with it (every later request queued behind). The call fails now (ModelCallError, which
    fails the request), naming the output and pickle's reason."""
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="y", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("lock_answers", answers_a_lock_unless_positive, **io, config=ModelConfig(max_batch_size=2))
        triton.bind("caller", ProcessInstances(calls_the_lock_model), **io, config=ModelConfig(max_batch_size=2))

    with running_triton(bind) as triton:
        with pytest.raises(httpclient.InferenceServerException, match="cannot reach the instance process") as failed:
            _infer(triton, "caller", {"x": np.full((1, 1), -1.0, dtype=np.float32)})
        assert "output 'y' (TypeError: cannot pickle '_thread.lock' object)" in str(failed.value)
        answer = _infer(triton, "caller", {"x": np.full((1, 1), 1.0, dtype=np.float32)})
        assert answer["y"].tolist() == [[b"first", b"plain"]]


# Model "long_strings": LONG strings, the first of which records in this process (the server's) which thread rebuilt
# it, and waits there until the test says a small request was answered meanwhile.
LONG = 3 * 16384 + 5
REBUILT_ON: List[str] = []
REBUILDING = threading.Event()
SMALL_ANSWERED = threading.Event()


class RebuiltWhere(bytes):
    """A string that, unpickled, says on which thread (rebuilt_here)."""

    def __reduce__(self) -> Any:
        return rebuilt_here, (bytes(self),)


def rebuilt_here(data: bytes) -> bytes:
    """Note this thread's name; off the server's loop, wait until the test answered a small request meanwhile."""
    name = threading.current_thread().name
    REBUILT_ON.append(name)
    REBUILDING.set()
    if name != "pytriton-loop":  # on the loop it would wait for ever: nothing else is served meanwhile
        SMALL_ANSWERED.wait(60)
    return data


def long_strings(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    strings = np.array([RebuiltWhere(b"first"), *(b"s%d" % index for index in range(1, LONG))], dtype=object)
    return [{"out": strings} for _ in requests]


def test_a_long_bytes_output_is_taken_in_off_the_loop_while_other_clients_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process instance's long BYTES output was unpickled (the message's head) and counted on the event loop:
    every other client waited for it (a million strings: 100-500 ms). Now it is rebuilt and counted in a thread,
    and a small request to another model is answered while it is."""
    from pytriton.core.tensors import counted_strings

    counted_on: List[str] = []
    count = counted_strings.bytes_of_object_array

    def noted(array: np.ndarray) -> int:
        if array.size >= counted_strings.COUNTED_ELEMENTS:
            counted_on.append(threading.current_thread().name)
        return count(array)

    monkeypatch.setattr(counted_strings, "bytes_of_object_array", noted)
    REBUILT_ON.clear()
    REBUILDING.clear()
    SMALL_ANSWERED.clear()
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="out", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("long_strings", ProcessInstances(long_strings), **io, config=ModelConfig(batching=False))
        triton.bind("double", ProcessInstances(double), **FP32_IO, config=ModelConfig(max_batch_size=4))

    with running_triton(bind) as triton:
        answers: queue.Queue[Any] = queue.Queue()
        x = np.ones((1,), dtype=np.float32)
        thread = threading.Thread(target=lambda: answers.put(_infer(triton, "long_strings", {"x": x})["out"]))
        thread.start()
        try:
            assert REBUILDING.wait(60), "the long output was never taken in"
            small = _infer(triton, "double", {"x": np.ones((1, 2), dtype=np.float32)})["y"]
            assert small.tolist() == [[2.0, 2.0]]
            assert thread.is_alive()  # its answer waits for the rebuild, which waits for this
        finally:
            SMALL_ANSWERED.set()
            thread.join(60)
        out = answers.get(timeout=0)
    assert REBUILT_ON == ["pytriton-long-objects"]
    assert counted_on == ["pytriton-long-objects"]
    assert out.tolist() == [b"first", *(b"s%d" % index for index in range(1, LONG))]


def long_and_short_steps(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Steps of LONG strings (rebuilt in a thread of the server) and of one, in turn."""
    for step in range(4):
        count = LONG if step % 2 == 0 else 1
        yield [{"out": np.array([b"%d-%d" % (step, index) for index in range(count)], dtype=object)}]


def test_a_stream_s_long_steps_keep_their_place_among_short_ones() -> None:
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="out", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        config = ModelConfig(batching=False, decoupled=True)
        triton.bind("steps", ProcessInstances(long_and_short_steps), **io, config=config)

    with running_triton(bind) as triton:
        responses: queue.Queue[Any] = queue.Queue()
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            tensor = grpcclient.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
            client.async_stream_infer("steps", [tensor], enable_empty_final_response=True)
            steps = []
            while True:
                result, error = responses.get(timeout=60)
                assert error is None
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
                steps.append(result.as_numpy("out").tolist())
            client.stop_stream()
    assert [len(step) for step in steps] == [LONG, 1, LONG, 1]
    for number, step in enumerate(steps):
        assert step == [b"%d-%d" % (number, index) for index in range(len(step))]


def long_unpicklable_first(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Request x 1: LONG strings after a lock, which cannot leave the process; else LONG plain ones."""
    answers = []
    for request in requests:
        strings = np.array([b"s%d" % index for index in range(LONG)], dtype=object)
        if float(request["x"].flat[0]) == 1:
            strings[0] = threading.Lock()
        answers.append({"out": strings.reshape(1, LONG)})
    return answers


def test_a_long_output_whose_first_element_does_not_pickle_fails_its_request_alone() -> None:
    config = ModelConfig(max_batch_size=2, batcher=DynamicBatcher(max_queue_delay_microseconds=30_000_000))
    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="out", dtype=bytes, shape=(-1,))]}

    def bind(triton: Triton) -> None:
        triton.bind("long_locks", ProcessInstances(long_unpicklable_first), **io, config=config)

    with running_triton(bind) as triton:
        answers: Dict[float, Any] = {}

        def infer(value: float) -> None:
            try:
                answers[value] = _infer(triton, "long_locks", {"x": np.array([[value]], dtype=np.float32)})["out"]
            except httpclient.InferenceServerException as error:
                answers[value] = error

        threads = [threading.Thread(target=infer, args=(value,)) for value in (1.0, 2.0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert answers[2.0].tolist() == [[b"s%d" % index for index in range(LONG)]]
    assert isinstance(answers[1.0], httpclient.InferenceServerException)
    assert "output 'out' could not be sent from the instance process" in str(answers[1.0])


def long_answer_once_watched(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """LONG strings, once the file $WATCHED_FILE exists (the server watches the request's client by then)."""
    watched = pathlib.Path(os.environ["WATCHED_FILE"])
    deadline = time.monotonic() + 30
    while not watched.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    strings = np.array([b"s%d" % index for index in range(LONG)], dtype=object)
    return [{"out": strings} for _ in requests]


def names_and_strings(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's input names, in order, and its strings back."""
    return [
        {"names": np.array([[",".join(request.keys()).encode()]], dtype=object), "out": request["s"]}
        for request in requests
    ]


@pytest.mark.parametrize("budget", [DEFAULT_SHM_BUDGET_BYTES, 0])
def test_a_long_bytes_input_is_pickled_off_the_loop(budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's long BYTES input was pickled in its JOB message's head on the event loop (a million strings:
    230-510 ms of every other client's time). Now its pieces are pickled in a thread and follow the JOB's body (with
    no shared memory budget, after the other inputs there); the loop pickles no long object array, and the process
    gets each input whole, in its request and place."""
    from pytriton.core.process_instances import long_outputs
    from pytriton.core.process_instances.protocol import JOB
    from pytriton.core.tensors.raw_tensors import PIECE_ELEMENTS
    from pytriton.ipc import channel

    pickled_on: List[Any] = []
    pickled_pieces = long_outputs.pickled_pieces

    def pickled_noted(array: np.ndarray) -> List[bytes]:
        pickled_on.append((threading.current_thread().name, array.size))
        return pickled_pieces(array)

    in_heads: List[int] = []
    encode = channel.encode

    def encode_noted(head: Any, *args: Any, **kwargs: Any) -> Any:
        if head[0] == JOB:
            for packed, *_ in head[3]:
                if len(packed) == 3:  # refs, others, order: object arrays are others
                    in_heads.extend(value.size for value in packed[1].values() if isinstance(value, np.ndarray))
        return encode(head, *args, **kwargs)

    monkeypatch.setattr(long_outputs, "pickled_pieces", pickled_noted)
    monkeypatch.setattr(channel, "encode", encode_noted)
    io = {
        "inputs": [
            Tensor(name="s", dtype=bytes, shape=(-1,)),
            Tensor(name="t", dtype=bytes, shape=(-1,)),
            Tensor(name="x", dtype=np.float32, shape=(-1,)),
        ],
        "outputs": [Tensor(name="names", dtype=bytes, shape=(1,)), Tensor(name="out", dtype=bytes, shape=(-1,))],
    }
    config = ModelConfig(max_batch_size=2, batcher=DynamicBatcher(max_queue_delay_microseconds=30_000_000))

    def bind(triton: Triton) -> None:
        instances = ProcessInstances(names_and_strings, shm_budget_bytes=budget)
        triton.bind("names_and_strings", instances, **io, config=config)

    with running_triton(bind) as triton:
        answers: Dict[int, Any] = {}

        def infer(number: int) -> None:
            strings = np.array([[b"%d-%d" % (number, index) for index in range(LONG)]], dtype=object)
            inputs = {"s": strings, "t": np.array([[b"short"]], dtype=object), "x": np.ones((1, 1), np.float32)}
            answers[number] = _infer(triton, "names_and_strings", inputs)

        threads = [threading.Thread(target=infer, args=(number,)) for number in range(2)]
        for thread in threads:  # one batch of both (the batcher waits for the second)
            thread.start()
        for thread in threads:
            thread.join()
    for number in range(2):
        assert answers[number]["names"].tolist() == [[b"s,t,x"]]
        assert answers[number]["out"].tolist() == [[b"%d-%d" % (number, index) for index in range(LONG)]]
    assert in_heads == [1, 1]  # the short ones; without the long ones
    assert pickled_on == [("pytriton-long-objects", LONG)] * 2
    assert LONG >= PIECE_ELEMENTS


def string_count(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"n": np.array([request["s"].size], dtype=np.int64)} for request in requests]


def test_a_long_input_whose_pieces_do_not_pickle_fails_its_batch_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pickling a long input's pieces raises in the thread (here by a patch: a wire's strings always pickle): its
    batch fails with what was raised, its place in the channel goes, and the instance serves the next one."""
    from pytriton.core.process_instances import long_outputs

    pickled_pieces = long_outputs.pickled_pieces

    def pickled_or_fail(array: np.ndarray) -> List[bytes]:
        if array.flat[0] == b"fail":
            raise MemoryError("no memory for these strings")
        return pickled_pieces(array)

    monkeypatch.setattr(long_outputs, "pickled_pieces", pickled_or_fail)
    io = {
        "inputs": [Tensor(name="s", dtype=bytes, shape=(-1,))],
        "outputs": [Tensor(name="n", dtype=np.int64, shape=(1,))],
    }

    def bind(triton: Triton) -> None:
        triton.bind("string_count", ProcessInstances(string_count), **io, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        for first in (b"fail", b"ok"):
            strings = np.array([first, *(b"s%d" % index for index in range(1, LONG))], dtype=object)
            if first == b"fail":
                with pytest.raises(httpclient.InferenceServerException) as failed:
                    _infer(triton, "string_count", {"s": strings})
                assert "instance 0 could not take the batch: no memory for these strings" in str(failed.value)
            else:
                assert _infer(triton, "string_count", {"s": strings})["n"].tolist() == [LONG]


CANCELS_SEEN: List[bool] = []


def until_cancelled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A long input: waits for its request's cancel (30 s at most) and notes whether it came; a short one: the notes."""
    answers = []
    for request in requests:
        if request["s"].size >= LONG:
            deadline = time.monotonic() + 30
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            CANCELS_SEEN.append(request.is_cancelled())
        answers.append({"seen": np.array([str(CANCELS_SEEN).encode()], dtype=object)})
    return answers


def test_a_cancel_sent_while_a_long_input_is_pickled_reaches_the_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The JOB of a long input goes once its pieces are pickled (in a thread): a CANCEL of its request sent meanwhile
    follows it, and the callable sees it; sent before the JOB, the process would drop it as a cancel of no job."""
    from pytriton.core.process_instances import long_outputs
    from pytriton.core.process_instances.instance import ProcessInstance

    started, release, cancelled = threading.Event(), threading.Event(), threading.Event()
    pickled_pieces = long_outputs.pickled_pieces

    def held(array: np.ndarray) -> List[bytes]:
        started.set()
        release.wait(60)
        return pickled_pieces(array)

    cancel = ProcessInstance.cancel

    def cancel_noted(self: ProcessInstance, request: Any) -> None:
        cancel(self, request)
        cancelled.set()

    monkeypatch.setattr(long_outputs, "pickled_pieces", held)
    monkeypatch.setattr(ProcessInstance, "cancel", cancel_noted)
    io = {
        "inputs": [Tensor(name="s", dtype=bytes, shape=(-1,))],
        "outputs": [Tensor(name="seen", dtype=bytes, shape=(1,))],
    }

    def bind(triton: Triton) -> None:
        triton.bind("until_cancelled", ProcessInstances(until_cancelled), **io, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        try:
            with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
                tensor = grpcclient.InferInput("s", [LONG], "BYTES")
                tensor.set_data_from_numpy(np.array([b"s%d" % index for index in range(LONG)], dtype=object))
                context = client.async_infer("until_cancelled", [tensor], callback=lambda result, error: None)
                assert started.wait(60), "the long input was never pickled off the loop"
                context.cancel()
                assert cancelled.wait(60), "the server was never told of the cancel"
        finally:
            release.set()
        seen = _infer(triton, "until_cancelled", {"s": np.array([b"short"], dtype=object)})["seen"]
    assert seen.tolist() == [b"[True]"]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_the_long_answer_of_a_request_whose_client_was_watched_is_freed_off_the_loop(
    kind: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that waited 0.1 s has its client watched (core/watch.py), and the watch held the request, its
    response with it, until the answer was written: its million strings were freed then, on the loop (10-20 ms),
    after the transport had handed them to a codec thread to free. The watch holds it weakly now."""
    import weakref

    from pytriton.core import watch
    from pytriton.core.process_instances import long_outputs
    from pytriton.transport import codec_threads

    watched = tmp_path / "watched"
    monkeypatch.setenv("WATCHED_FILE", str(watched))
    sweep = watch.QueueWatch._sweep

    def sweep_noted(self: Any) -> None:
        sweep(self)
        entries = [*self._queues, *self._running()]
        if any(entry.watcher is not None for entry in entries):
            watched.touch()

    monkeypatch.setattr(watch.QueueWatch, "_sweep", sweep_noted)
    let_go = codec_threads.let_go
    handed: List[int] = []

    def let_go_noted(arrays: List[np.ndarray]) -> None:
        """As the transport hands them over (on the loop). Whether anything else still holds them then is no test:
        under load the instance thread may not have dropped its reference yet (it is then freed where it drops it)."""
        handed.append(len(arrays))
        let_go(arrays)

    monkeypatch.setattr(codec_threads, "let_go", let_go_noted)
    freed_on: List[str] = []

    def note_free(array: np.ndarray) -> None:
        weakref.finalize(array, lambda: freed_on.append(threading.current_thread().name))

    if kind == "process":  # the array the server rebuilt: noted as it is put back
        put_back = long_outputs.put_back

        def put_back_noted(value: Any, longs: Any, body: memoryview) -> Any:
            value = put_back(value, longs, body)
            note_free(value[0]["out"])
            return value

        monkeypatch.setattr(long_outputs, "put_back", put_back_noted)
        callable_ = ProcessInstances(long_answer_once_watched)
    else:

        def callable_(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
            answers = long_answer_once_watched(requests)
            note_free(answers[0]["out"])
            return answers

    io = {"inputs": FP32_IO["inputs"], "outputs": [Tensor(name="out", dtype=bytes, shape=(-1,))]}
    with running_triton(
        lambda triton: triton.bind("long", callable_, **io, config=ModelConfig(batching=False))
    ) as triton:
        out = _infer(triton, "long", {"x": np.ones((1,), dtype=np.float32)})["out"]
        assert watched.exists()  # the client was watched
        assert out.tolist() == [b"s%d" % index for index in range(LONG)]
    assert handed == [1]
    assert len(freed_on) == 1 and freed_on[0] != "pytriton-loop", freed_on
