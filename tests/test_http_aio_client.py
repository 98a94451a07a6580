"""tritonclient.http.aio (aiohttp) against a real server: how the server treats aiohttp's pooled connections."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, Iterator, List

import aiohttp
import numpy as np
import pytest
import tritonclient.http.aio as aiohttpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton
from tests.conftest import http_url, running_triton

# Past the 5 s this server once closed idle connections after: aiohttp still held them in its pool.
IDLE_S = 6.0


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "identity",
        _identity,
        inputs=[Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    """A server with the default limits (its keep-alive timeout is what is under test)."""
    with running_triton(_bind, allow_grpc=False, allow_metrics=False) as server:
        yield server


def _inputs() -> List[aiohttpclient.InferInput]:
    infer_input = aiohttpclient.InferInput("INPUT_1", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
    return [infer_input]


def _aiohttp_pool_keeps_s() -> float:
    """How long aiohttp's default connector (tritonclient.http.aio's) reuses an idle connection."""

    async def read() -> float:
        connector = aiohttp.TCPConnector()
        try:
            return float(connector._keepalive_timeout)  # no public name for it
        finally:
            await connector.close()

    return asyncio.run(read())


def test_an_idle_connection_outlives_aiohttps_pool() -> None:
    """aiohttp sends a request on a pooled connection up to 15 s idle; the server must not close it first.

    A POST sent on a connection the server is closing fails with ServerDisconnectedError or a reset, and
    aiohttp retries no POST: with a 5 s timeout, about 1 in 13 requests after 5 s of idling failed.
    tritonserver keeps idle connections open.
    """
    assert ServerLimits().keep_alive_timeout_s > _aiohttp_pool_keeps_s() + 5


def test_the_aio_client_reuses_its_connection_after_idling(triton: Triton) -> None:
    async def scenario() -> None:
        async with aiohttpclient.InferenceServerClient(http_url(triton)) as client:
            await client.infer("identity", _inputs())
            pooled = [proto for connections in client._conn._conns.values() for proto, _ in connections]
            assert len(pooled) == 1
            started = time.monotonic()
            await asyncio.sleep(IDLE_S)
            assert pooled[0].is_connected(), f"closed by the server within {time.monotonic() - started:.1f} s idle"
            result = await client.infer("identity", _inputs())
            reused = [proto for connections in client._conn._conns.values() for proto, _ in connections]
            assert reused == pooled
            np.testing.assert_array_equal(result.as_numpy("OUTPUT_1"), np.ones((1, 4), np.float32))

    asyncio.run(scenario())
