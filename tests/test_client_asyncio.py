"""AsyncioModelClient and pytriton.client.asyncio_utils against a real server of this project, over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Coroutine, Iterator, List, TypeVar

import numpy as np
import pytest
import tritonclient.grpc.aio
import tritonclient.http.aio

from pytriton.client import AsyncioModelClient
from pytriton.client.asyncio_utils import (
    asyncio_get_model_config,
    asyncio_get_model_state,
    asyncio_wait_for_model_ready,
    asyncio_wait_for_model_status_loaded,
    asyncio_wait_for_server_ready,
)
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.utils import ModelState, TritonUrl
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonSecurityConfig
from tests.conftest import running_triton
from tests.fleet import free_ports
from tests.test_client_support import HELD_TIMEOUT_S, PROTOCOLS, WAIT_S, Gate, floats

pytest_plugins = ["tests.test_client_support"]

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT_S))


def test_infer_sample_and_batch(client_url: str) -> None:
    async def scenario() -> None:
        async with AsyncioModelClient(client_url, "add_sub") as client:
            sample = await client.infer_sample(floats(1, 2), floats(1, 1))
            batch = await client.infer_batch(a=np.ones((2, 2), np.float32), b=np.ones((2, 2), np.float32))
            concurrent = await asyncio.gather(*(client.infer_sample(floats(i), floats(i)) for i in range(8)))
        np.testing.assert_array_equal(sample["sum"], floats(2, 3))
        np.testing.assert_array_equal(batch["diff"], np.zeros((2, 2), np.float32))
        assert [result["sum"].tolist() for result in concurrent] == [[2.0 * i] for i in range(8)]

    run(scenario())


def test_bytes_parameters_and_headers(client_url: str) -> None:
    async def scenario() -> None:
        async with AsyncioModelClient(client_url, "shout") as client:
            shouted = await client.infer_sample(text=np.array([b"x"], dtype=object))
        async with AsyncioModelClient(client_url, "params") as client:
            result = await client.infer_sample(
                floats(1), parameters={"n": 3, "on": False}, headers={"x-test-a": "b", "skipped": "c"}
            )
        assert shouted["text"].tolist() == [b"X!"]
        assert json.loads(result["params"][0]) == {"n": 3, "on": False, "x-test-a": "b"}

    run(scenario())


def test_model_config_and_batching(client_url: str) -> None:
    async def scenario() -> None:
        async with AsyncioModelClient(client_url, "double", lazy_init=False) as client:
            config = await client.model_config
            assert config.max_batch_size == 0
            np.testing.assert_array_equal((await client.infer_sample(x=floats(2)))["y"], floats(4))
            with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
                await client.infer_batch(x=floats(2))
            await client.wait_for_model(WAIT_S)

    run(scenario())


def test_timeouts(client_url: str, slow_gate: Gate) -> None:
    async def scenario() -> None:
        # nvidia-pytriton 0.7's AsyncioModelClient words its timeouts differently from its ModelClient
        async with AsyncioModelClient(client_url, "slow", inference_timeout_s=HELD_TIMEOUT_S) as client:
            with pytest.raises(PyTritonClientTimeoutError) as timed_out:
                await client.infer_sample(x=floats(1))
            grpc_timeout = "Error occurred on Triton Inference Server side:\n Deadline Exceeded"  # the call's deadline
            http_timeout = "Timeout exceeded while running inference for slow"
            assert str(timed_out.value) == (grpc_timeout if client_url.startswith("grpc") else http_timeout)
            slow_gate.release()
            assert (await client.infer_sample(x=floats(2)))["y"].tolist() == [2]
        not_ready = r"^Timeout while waiting for model missing to be ready for {}s$"
        async with AsyncioModelClient(client_url, "missing", init_timeout_s=0.3) as client:
            with pytest.raises(PyTritonClientTimeoutError, match=not_ready.format(r"0\.3")):
                await client.infer_sample(x=floats(1))
            with pytest.raises(PyTritonClientTimeoutError, match=not_ready.format(r"0\.2")):
                await client.wait_for_model(0.2)
        eager_not_ready = r"^Timeout exceeded while waiting for model missing to be ready$"  # 0.7's __aenter__
        with pytest.raises(PyTritonClientTimeoutError, match=eager_not_ready):
            async with AsyncioModelClient(client_url, "missing", lazy_init=False, init_timeout_s=0.2):
                pass

    run(scenario())


def test_model_error(client_url: str) -> None:
    async def scenario() -> None:
        async with AsyncioModelClient(client_url, "fail") as client:
            with pytest.raises(PyTritonClientInferenceServerError) as error:
                await client.infer_sample(x=floats(1))
            # 0.7's AsyncioModelClient's words (its ModelClient says "Error occurred during inference request")
            assert str(error.value).startswith("Error occurred on Triton Inference Server side:\n ")
            assert "the model says no" in str(error.value)
        async with AsyncioModelClient(client_url, "stream") as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="AsyncioDecoupledModelClient"):
                await client.infer_sample(x=floats(1))

    run(scenario())


def test_queue_full(client_url: str, queue_gate: Gate) -> None:
    async def scenario() -> List[BaseException]:
        async with AsyncioModelClient(client_url, "queue") as client:
            first = asyncio.ensure_future(client.infer_sample(x=floats(0)))
            assert await asyncio.get_running_loop().run_in_executor(None, queue_gate.entered.wait, WAIT_S)
            others = [asyncio.ensure_future(client.infer_sample(x=floats(i))) for i in range(1, 5)]
            refused: List[BaseException] = []
            for finished in asyncio.as_completed(others):
                with pytest.raises(PyTritonClientQueueFullError) as error:
                    await finished
                refused.append(error.value)
                if len(refused) == 3:
                    break
            queue_gate.release()
            assert (await first)["y"].tolist() == [0]
            outcomes = await asyncio.gather(*others, return_exceptions=True)
        return [outcome for outcome in outcomes if isinstance(outcome, BaseException)]

    errors = run(scenario())
    assert len(errors) == 3
    assert all(isinstance(error, PyTritonClientQueueFullError) for error in errors)
    # 0.7's AsyncioModelClient raises it as every error the server answers, in its words
    assert all(isinstance(error, PyTritonClientInferenceServerError) for error in errors)
    side = r"Error occurred on Triton Inference Server side:\n "
    worded = re.compile(side + r"(\[request id: \d+\] )?Exceeds maximum queue size")
    assert all(worded.fullmatch(str(error)) for error in errors)


def test_use_after_close_and_argument_errors(client_url: str) -> None:
    async def scenario() -> None:
        client = AsyncioModelClient(client_url, "add_sub")
        with pytest.raises(PyTritonClientValueError):
            await client.infer_sample(floats(1), b=floats(1))
        with pytest.raises(PyTritonClientValueError):
            await client.infer_sample(floats(1), [1.0])  # type: ignore[arg-type]
        await client.infer_sample(floats(1), floats(1))
        await client.close()
        with pytest.raises(PyTritonClientClosedError):
            await client.infer_sample(floats(1), floats(1))
        with pytest.raises(PyTritonClientClosedError):
            await client.wait_for_model(1.0)

    run(scenario())


def _aio_client(url: str) -> Any:
    """tritonclient's asyncio client for a url with a scheme (created inside the running loop)."""
    triton_url = TritonUrl.from_url(url)
    lib: Any = tritonclient.grpc.aio if triton_url.scheme == "grpc" else tritonclient.http.aio
    return lib.InferenceServerClient(triton_url.without_scheme)


@pytest.fixture(scope="module")
def open_server() -> Iterator[Triton]:
    """A server that restricts nothing, so that the repository index answers without a token (as 0.7 asks)."""

    def bind(triton: Triton) -> None:
        tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
        triton.bind(
            "echo", lambda requests: requests, inputs=tensors, outputs=tensors, config=ModelConfig(max_batch_size=4)
        )

    with running_triton(bind, TritonSecurityConfig(restricted_endpoints=[])) as triton:
        yield triton


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_asyncio_utils_called_as_nvidia_pytriton_0_7_calls_them(open_server: Triton, protocol: str) -> None:
    port = open_server.grpc_port if protocol == "grpc" else open_server.http_port

    async def scenario() -> None:
        client = _aio_client(f"{protocol}://127.0.0.1:{port}")
        try:
            await asyncio_wait_for_server_ready(client, 0.05)  # the second argument is the pause between probes
            await asyncio_wait_for_model_status_loaded(client, "echo", 0.05)
            await asyncio_wait_for_model_ready(client, "echo")
            config = await asyncio_get_model_config(client, "echo", "1")
            assert (config.model_name, config.max_batch_size, config.decoupled) == ("echo", 4, False)
            assert await asyncio_get_model_state(client, "echo") is ModelState.READY
            assert await asyncio_get_model_state(client, "echo", "2") is ModelState.UNAVAILABLE
            # 0.7's words (its number is the time left when the wait began; here the timeout given)
            with pytest.raises(PyTritonClientTimeoutError) as not_ready:
                await asyncio_wait_for_model_ready(client, "missing", timeout_s=0.3)
            assert str(not_ready.value) == "Timeout while waiting for model missing to be ready (timeout=0.30)"
            with pytest.raises(PyTritonClientTimeoutError) as no_config:
                await asyncio_get_model_config(client, "missing", timeout_s=0.3)
            assert str(no_config.value) == "Timeout while waiting for model missing config (timeout=0.30)"
            with pytest.raises(asyncio.TimeoutError):  # no deadline of its own: the caller bounds it, as in 0.7
                await asyncio.wait_for(asyncio_wait_for_model_status_loaded(client, "missing", 0.05), 0.3)
        finally:
            await client.close()

    run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_asyncio_server_wait_outlasts_a_server_that_is_not_there(protocol: str) -> None:
    (port,) = free_ports(1)

    async def scenario() -> None:
        client = _aio_client(f"{protocol}://127.0.0.1:{port}")
        try:
            with pytest.raises(asyncio.TimeoutError):  # refused connections are "not ready yet", never an error
                await asyncio.wait_for(asyncio_wait_for_server_ready(client, 0.05), 0.5)
            with pytest.raises(PyTritonClientTimeoutError):
                await asyncio_wait_for_model_ready(client, "echo", timeout_s=0.3)
        finally:
            await client.close()

    run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_eager_init_without_a_server_times_out_in_nvidia_pytriton_0_7_words(protocol: str) -> None:
    (port,) = free_ports(1)

    async def scenario() -> None:
        client = AsyncioModelClient(f"{protocol}://127.0.0.1:{port}", "echo", lazy_init=False, init_timeout_s=0.3)
        with pytest.raises(PyTritonClientTimeoutError) as eager:
            async with client:
                pass
        assert str(eager.value) == "Timeout exceeded while waiting for model echo to be ready"  # 0.7's __aenter__
        with pytest.raises(PyTritonClientClosedError):  # closed by the failed __aenter__
            await client.infer_sample(floats(1.0))
        lazy = AsyncioModelClient(f"{protocol}://127.0.0.1:{port}", "echo", init_timeout_s=0.3)
        async with lazy:
            with pytest.raises(PyTritonClientTimeoutError) as first_call:
                await lazy.infer_sample(floats(1.0))
        assert str(first_call.value) == "Timeout while waiting for model echo to be ready for 0.3s"

    run(scenario())
