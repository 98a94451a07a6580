"""DecoupledModelClient and AsyncioDecoupledModelClient against a real server of this project (gRPC)."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from typing import Any, AsyncIterator, Coroutine, Dict, List, TypeVar

import numpy as np
import pytest

from pytriton.client import AsyncioDecoupledModelClient, DecoupledModelClient
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from tests.test_client_support import HELD_TIMEOUT_S, WAIT_S, ClientServer, Gate, floats

pytest_plugins = ["tests.test_client_support"]

T = TypeVar("T")
Arrays = Dict[str, np.ndarray]


@pytest.fixture
def grpc_url(client_server: ClientServer) -> str:
    return client_server.url("grpc")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT_S))


async def collect(responses: AsyncIterator[Arrays]) -> List[Arrays]:
    return [response async for response in responses]


def test_responses_stream_in_order(grpc_url: str) -> None:
    with DecoupledModelClient(grpc_url, "stream") as client:
        samples = list(client.infer_sample(x=floats(10, 20)))
        batches = list(client.infer_batch(x=np.ones((2, 1), np.float32)))
    assert [response["y"].tolist() for response in samples] == [[10 + step, 20 + step] for step in range(4)]
    assert [response["y"].tolist() for response in batches] == [[[1 + step], [1 + step]] for step in range(4)]


def test_asyncio_responses_stream_in_order(grpc_url: str) -> None:
    async def scenario() -> List[List[Arrays]]:
        async with AsyncioDecoupledModelClient(grpc_url, "stream") as client:
            return list(
                await asyncio.gather(
                    collect(client.infer_sample(floats(0))),
                    collect(client.infer_batch(x=np.zeros((3, 1), np.float32))),
                    collect(client.infer_sample(x=floats(100))),
                )
            )

    sample, batch, named = run(scenario())
    assert [response["y"].tolist() for response in sample] == [[step] for step in range(4)]
    assert [response["y"].shape for response in batch] == [(3, 1)] * 4
    assert [response["y"].tolist() for response in named] == [[100 + step] for step in range(4)]


def test_error_mid_stream(grpc_url: str) -> None:
    with DecoupledModelClient(grpc_url, "stream_fail") as client:
        responses = client.infer_sample(x=floats(5))
        assert next(responses)["y"].tolist() == [5]
        with pytest.raises(PyTritonClientInferenceServerError, match="the stream broke") as sync_error:
            next(responses)
    assert str(sync_error.value).startswith("Error occurred during inference request. Message: ")

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(grpc_url, "stream_fail") as client:
            responses = client.infer_sample(x=floats(6))
            assert (await responses.__anext__())["y"].tolist() == [6]
            with pytest.raises(PyTritonClientInferenceServerError, match="the stream broke") as error:
                await responses.__anext__()
        # 0.7's AsyncioDecoupledModelClient words the server's errors as its AsyncioModelClient does
        assert str(error.value).startswith("Error occurred on Triton Inference Server side:\n ")

    run(scenario())


def test_parameters_and_headers_reach_the_model(grpc_url: str) -> None:
    expected = {"p": "v", "n": 1, "x-test-h": "forwarded"}
    with DecoupledModelClient(grpc_url, "stream_params") as client:
        (response,) = client.infer_sample(floats(1), parameters={"p": "v", "n": 1}, headers={"x-test-h": "forwarded"})
    assert json.loads(response["params"][0]) == expected

    async def scenario() -> List[Arrays]:
        async with AsyncioDecoupledModelClient(grpc_url, "stream_params") as client:
            return await collect(
                client.infer_sample(floats(1), parameters={"p": "v", "n": 1}, headers={"X-Test-H": "forwarded"})
            )

    (response,) = run(scenario())
    assert json.loads(response["params"][0]) == expected


def test_response_timeout(grpc_url: str, stream_gate: Gate) -> None:
    with DecoupledModelClient(grpc_url, "stream_slow", inference_timeout_s=HELD_TIMEOUT_S) as client:
        responses = client.infer_sample(x=floats(1))
        assert next(responses)["y"].tolist() == [1]
        with pytest.raises(PyTritonClientTimeoutError):
            next(responses)
    stream_gate.drain()  # let the held request finish, so the model is free again
    stream_gate.arm()

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(grpc_url, "stream_slow", inference_timeout_s=HELD_TIMEOUT_S) as client:
            responses = client.infer_sample(x=floats(2))
            assert (await responses.__anext__())["y"].tolist() == [2]
            next_response = f"^Timeout while waiting for model stream_slow to return next response {HELD_TIMEOUT_S}s$"
            with pytest.raises(PyTritonClientTimeoutError, match=next_response):  # 0.7's words
                await responses.__anext__()

    run(scenario())


def test_unknown_model_times_out(grpc_url: str) -> None:
    with DecoupledModelClient(grpc_url, "missing", init_timeout_s=0.3) as client:
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(x=floats(1))

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(grpc_url, "missing", init_timeout_s=0.3) as client:
            with pytest.raises(PyTritonClientTimeoutError):
                await collect(client.infer_sample(x=floats(1)))

    run(scenario())


def test_http_url_is_refused(client_server: ClientServer) -> None:
    http_url = client_server.url("http")
    with pytest.raises(PyTritonClientValueError):
        DecoupledModelClient(http_url, "stream")
    with pytest.raises(PyTritonClientValueError):
        AsyncioDecoupledModelClient(http_url, "stream")
    with pytest.raises(PyTritonClientValueError):
        DecoupledModelClient(f"127.0.0.1:{client_server.triton.grpc_port}", "stream")  # no scheme means http


def test_coupled_model_is_refused(grpc_url: str) -> None:
    with DecoupledModelClient(grpc_url, "add_sub") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="ModelClient"):
            client.infer_sample(floats(1), floats(1))

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(grpc_url, "add_sub") as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="AsyncioModelClient"):
                await collect(client.infer_sample(floats(1), floats(1)))

    run(scenario())


def test_batching_and_closed_errors(grpc_url: str) -> None:
    with DecoupledModelClient(grpc_url, "stream_unbatched", lazy_init=False) as unbatched:
        assert not unbatched.is_batching_supported
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            unbatched.infer_batch(x=floats(1))
    client = DecoupledModelClient(grpc_url, "stream", lazy_init=False)
    assert client.model_config.decoupled
    with pytest.raises(PyTritonClientValueError):
        client.infer_sample(floats(1), x=floats(1))
    client.close()
    # 0.7's DecoupledModelClient's words: it is a ModelClient
    with pytest.raises(PyTritonClientClosedError, match=r"^ModelClient is closed$"):
        client.infer_sample(x=floats(1))

    async def scenario() -> None:
        async with AsyncioDecoupledModelClient(grpc_url, "stream_unbatched") as aio_client:
            with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
                await collect(aio_client.infer_batch(x=floats(1)))
            unbatched = await collect(aio_client.infer_sample(x=floats(1, 2)))
            assert [response["y"].tolist() for response in unbatched] == [[1 + step, 2 + step] for step in range(4)]
        with pytest.raises(PyTritonClientClosedError):
            await collect(aio_client.infer_sample(x=floats(1)))

    run(scenario())


def test_stopping_early_cancels_the_stream(grpc_url: str, stream_gate: Gate) -> None:
    with DecoupledModelClient(grpc_url, "stream_slow") as client:
        responses = client.infer_sample(x=floats(3))
        assert next(responses)["y"].tolist() == [3]
        assert stream_gate.entered.wait(WAIT_S)
        responses.close()
        stream_gate.release()
        assert [response["y"].tolist() for response in client.infer_sample(x=floats(0))] == [[0], [0]]


def test_a_stream_stopped_early_leaves_no_call_to_the_garbage_collector(grpc_url: str) -> None:
    # The call's CANCELLED error is the call itself; its traceback held it in a cycle, freed only by the collector,
    # at the latest at exit, where grpcio 1.67's __del__ waited forever on a lock (Python 3.9: a client hung there)
    calls: List[Any] = []
    with DecoupledModelClient(grpc_url, "stream") as client:
        start_call = client._stub.ModelStreamInfer

        def watched(*args: Any, **kwargs: Any) -> Any:
            call = start_call(*args, **kwargs)
            calls.append(weakref.ref(call))
            return call

        client._stub.ModelStreamInfer = watched
        gc.disable()
        try:
            responses = client.infer_sample(x=floats(1))
            assert next(responses)["y"].tolist() == [1]
            responses.close()  # cancels the call; its reader thread ends on the CANCELLED error
            del responses
            assert len(calls) == 1 and calls[0]() is None
        finally:
            gc.enable()
