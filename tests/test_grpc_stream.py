"""gRPC ModelStreamInfer: decoupled partial responses, errors, concurrency and cancellation."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections import defaultdict
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, grpc_url, running_triton

TIMEOUT_S = 30.0
PARTIALS = 3
CONCURRENT = 50
batch_sizes: List[int] = []
forever_stopped = threading.Event()


def _partials(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    batch_sizes.append(len(requests))
    for step in range(PARTIALS):
        yield [{"OUT": request["IN"] + step} for request in requests]


async def _async_partials(requests: List[Any]) -> AsyncIterator[List[Dict[str, np.ndarray]]]:
    for step in range(PARTIALS):
        await asyncio.sleep(0)
        yield [{"OUT": request["IN"] + step} for request in requests]


def _mid_error(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [{"OUT": request["IN"]} for request in requests]
    raise ValueError("broke after the first response")


def _forever(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    try:
        while True:
            yield [{"OUT": request["IN"]} for request in requests]
            time.sleep(0.005)  # pace the model; the test waits on forever_stopped, not on time
    finally:
        forever_stopped.set()


def _plain(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"] * 2} for request in requests]


def _parameters(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    yield [
        {"OUT": np.array([json.dumps(request.parameters, sort_keys=True).encode()], dtype=np.object_)}
        for request in requests
    ]


def bind_models(triton: Triton) -> None:
    io = {
        "inputs": [Tensor(name="IN", dtype=np.float32, shape=(1,))],
        "outputs": [Tensor(name="OUT", dtype=np.float32, shape=(1,))],
    }
    unbatched_decoupled = ModelConfig(batching=False, decoupled=True)
    triton.bind("partials", _partials, **io, config=unbatched_decoupled)
    triton.bind("async_partials", _async_partials, **io, config=unbatched_decoupled)
    triton.bind("mid_error", _mid_error, **io, config=unbatched_decoupled)
    triton.bind("forever", _forever, **io, config=unbatched_decoupled)
    triton.bind(
        "plain",
        _plain,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "parameters",
        _parameters,
        inputs=io["inputs"],
        outputs=[Tensor(name="OUT", dtype=bytes, shape=(1,))],
        config=unbatched_decoupled,
    )
    # Runs a batch at once when all CONCURRENT requests are queued, else only after 20 s: a stream that
    # served its requests one after the other would time the test out.
    triton.bind(
        "batched_partials",
        _partials,
        **io,
        config=ModelConfig(
            max_batch_size=CONCURRENT,
            decoupled=True,
            batcher=DynamicBatcher(max_queue_delay_microseconds=20_000_000, preferred_batch_size=[CONCURRENT]),
        ),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(bind_models, grpc_header_forward_pattern="^x-fwd-") as server:
        yield server


Item = Tuple[Optional[Any], Optional[Exception]]


class StreamClient:
    """A sync tritonclient stream whose callbacks land in a queue."""

    def __init__(self, url: str, headers: Optional[Dict[str, str]] = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.items: queue.Queue[Item] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put((result, error)), headers=headers)

    def send(self, model: str, value: Any, request_id: str = "", batched: bool = False, **kwargs: Any) -> None:
        data = np.array([[value]] if batched else value if isinstance(value, np.ndarray) else [value], np.float32)
        infer_input = grpcclient.InferInput("IN", list(data.shape), "FP32")
        infer_input.set_data_from_numpy(data)
        self.client.async_stream_infer(model, [infer_input], request_id=request_id, **kwargs)

    def next(self) -> Item:
        return self.items.get(timeout=TIMEOUT_S)

    def close(self, cancel: bool = False) -> List[Item]:
        """Half-close (or cancel) the stream, wait until the server ended it, return what is left."""
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
        left = []
        while not self.items.empty():
            left.append(self.items.get_nowait())
        return left


@pytest.fixture
def stream(triton: Triton) -> Iterator[StreamClient]:
    client = StreamClient(grpc_url(triton))
    yield client
    client.close()


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _value(result: Any) -> float:
    return float(result.as_numpy("OUT").reshape(-1)[0])


@pytest.mark.parametrize("model", ["partials", "async_partials"])
def test_partial_responses_then_empty_final(stream: StreamClient, model: str) -> None:
    stream.send(model, 10.0, request_id="r1", enable_empty_final_response=True)
    results = [stream.next() for _ in range(PARTIALS + 1)]
    assert all(error is None for _, error in results)
    responses = [result for result, _ in results]
    assert [_value(result) for result in responses[:PARTIALS]] == [10.0, 11.0, 12.0]
    assert [_final(result) for result in responses] == [False] * PARTIALS + [True]
    final = responses[-1].get_response()
    assert (final.id, final.model_name, final.model_version) == ("r1", model, "")  # the version asked for: none
    assert len(final.outputs) == 0 and len(final.raw_output_contents) == 0
    assert all(result.get_response().id == "r1" for result in responses)


def test_empty_final_names_the_version_asked_for(stream: StreamClient) -> None:
    stream.send("partials", 1.0, request_id="v", model_version="1", enable_empty_final_response=True)
    results = [stream.next() for _ in range(PARTIALS + 1)]
    assert [result.get_response().model_version for result, _ in results] == ["1"] * (PARTIALS + 1)


def test_no_empty_final_unless_asked(stream: StreamClient) -> None:
    stream.send("partials", 1.0)
    results = [stream.next() for _ in range(PARTIALS)]
    assert [_value(result) for result, _ in results] == [1.0, 2.0, 3.0]
    assert stream.close() == []


def test_non_decoupled_model_over_a_stream(stream: StreamClient) -> None:
    stream.send("plain", 4.0, request_id="p", enable_empty_final_response=True)
    result, error = stream.next()
    assert error is None
    assert _value(result) == 8.0
    assert _final(result) is True
    assert stream.close() == []


def test_large_tensors_on_a_stream(stream: StreamClient) -> None:
    data = np.arange(2**20, dtype=np.float32)  # 4 MiB: large enough for the zero-copy request parser
    for request_id in ("big-1", "big-2"):
        stream.send("plain", data, request_id=request_id)
    results = [stream.next() for _ in range(2)]
    assert sorted(result.get_response().id for result, _ in results) == ["big-1", "big-2"]
    for result, error in results:
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)


def test_error_before_first_response_keeps_the_stream_open(stream: StreamClient) -> None:
    stream.send("no_such_model", 1.0)
    result, error = stream.next()
    assert result is None and error is not None
    assert "unknown model" in str(error)
    stream.send("plain", 2.0)
    result, error = stream.next()
    assert error is None and _value(result) == 4.0


def test_error_mid_stream_keeps_the_stream_open(stream: StreamClient) -> None:
    stream.send("mid_error", 5.0, enable_empty_final_response=True)
    result, error = stream.next()
    assert error is None and _value(result) == 5.0 and _final(result) is False
    result, error = stream.next()
    assert result is None and "broke after the first response" in str(error)
    stream.send("partials", 0.0, enable_empty_final_response=True)
    values = [stream.next()[0] for _ in range(PARTIALS + 1)]
    assert [_final(result) for result in values] == [False] * PARTIALS + [True]
    assert stream.close() == []


def test_concurrent_requests_on_one_stream_keep_their_own_order(stream: StreamClient) -> None:
    batch_sizes.clear()
    for index in range(CONCURRENT):
        stream.send(
            "batched_partials", index * 10.0, request_id=str(index), batched=True, enable_empty_final_response=True
        )
    by_request: Dict[str, List[Any]] = defaultdict(list)
    for _ in range(CONCURRENT * (PARTIALS + 1)):
        result, error = stream.next()
        assert error is None, error.message()
        by_request[result.get_response().id].append(result)
    assert stream.close() == []
    assert sorted(by_request, key=int) == [str(index) for index in range(CONCURRENT)]
    for request_id, results in by_request.items():
        base = int(request_id) * 10
        assert [_value(result) for result in results[:PARTIALS]] == [base, base + 1, base + 2]
        assert [_final(result) for result in results] == [False] * PARTIALS + [True]
    assert sum(batch_sizes) == CONCURRENT and max(batch_sizes) > 1


def test_forwarded_headers_and_parameters_on_a_stream(triton: Triton) -> None:
    stream = StreamClient(grpc_url(triton), headers={"x-fwd-user": "ann", "x-hidden": "no"})
    try:
        stream.send("parameters", 0.0, parameters={"level": 3})
        result, error = stream.next()
        assert error is None
        assert json.loads(result.as_numpy("OUT")[0]) == {"level": 3, "x-fwd-user": "ann"}
    finally:
        stream.close()


def test_cancelling_the_stream_stops_the_generator(triton: Triton) -> None:
    forever_stopped.clear()
    stream = StreamClient(grpc_url(triton))
    stream.send("forever", 1.0)
    result, error = stream.next()
    assert error is None and _value(result) == 1.0
    stream.close(cancel=True)
    assert forever_stopped.wait(TIMEOUT_S)


def test_aio_client_streams_partials_for_many_requests(triton: Triton) -> None:
    async def requests() -> AsyncIterator[Dict[str, Any]]:
        for index in range(5):
            infer_input = aioclient.InferInput("IN", [1], "FP32")
            infer_input.set_data_from_numpy(np.array([index], dtype=np.float32))
            yield {
                "model_name": "async_partials",
                "inputs": [infer_input],
                "request_id": f"aio-{index}",
            }  # tritonclient.grpc.aio cannot ask for the empty final response

    async def main() -> Dict[str, List[Tuple[float, bool]]]:
        seen: Dict[str, List[Tuple[float, bool]]] = defaultdict(list)
        client = aioclient.InferenceServerClient(grpc_url(triton))
        try:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                response = result.get_response()
                seen[response.id].append((_value(result), _final(result)))
        finally:
            await client.close()
        return seen

    seen = asyncio.run(main())
    assert seen == {f"aio-{index}": [(index, False), (index + 1, False), (index + 2, False)] for index in range(5)}


def _one_request_streamed(triton: Triton, model: str, request_id: str, values: int, version: str = "") -> List[Any]:
    """The answers to a ModelStreamInfer call of one FP32 request of zeros."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    request.inputs.add(name="IN", datatype="FP32", shape=[values])
    request.raw_input_contents.append(b"\x00" * 4 * values)
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return list(stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT_S))


def test_stream_error_names_its_request(triton: Triton) -> None:
    (response,) = _one_request_streamed(triton, "partials", "bad-one", 2)
    assert "unexpected shape for input 'IN'" in response.error_message
    # As Triton's (side by side with nvidia-pytriton 0.7): a request that never reached its model has its id alone.
    assert response.infer_response == service_pb2.ModelInferResponse(id="bad-one")


@pytest.mark.parametrize("version", ["", "1"])
def test_stream_error_of_the_model_names_the_model_and_ends_the_request(triton: Triton, version: str) -> None:
    first, error = _one_request_streamed(triton, "mid_error", "fails-late", 1, version)
    assert not first.error_message and "broke after the first response" in error.error_message
    answer = error.infer_response
    # nvidia-pytriton 0.7 names the version the request asked for: none when it asked for none (measured with a
    # decoupled and a non-decoupled model, failing at once and after a first response).
    assert (answer.id, answer.model_name, answer.model_version) == ("fails-late", "mid_error", version)
    assert answer.parameters["triton_final_response"].bool_param is True


def test_a_decoupled_request_that_fails_after_responses_counts_as_failed(triton: Triton) -> None:
    # nvidia-pytriton 0.7 counts it a success (and its inference_count): its Python backend reports a decoupled
    # request's statistics when execute() returns, before the error goes out on the response sender. Here, as
    # Triton counts any request its model failed: a failure (docs/migration.md lists the difference).
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    before = client.get_inference_statistics("mid_error", headers=GRPC_AUTH, as_json=True)["model_stats"][0]
    _one_request_streamed(triton, "mid_error", "counted", 1)
    after = client.get_inference_statistics("mid_error", headers=GRPC_AUTH, as_json=True)["model_stats"][0]
    client.close()

    def count(stats: Dict[str, Any], kind: str) -> int:
        return int(stats["inference_stats"].get(kind, {}).get("count", 0))

    assert count(after, "fail") - count(before, "fail") == 1
    assert count(after, "success") == count(before, "success")
    assert int(after.get("inference_count", 0)) == int(before.get("inference_count", 0))
