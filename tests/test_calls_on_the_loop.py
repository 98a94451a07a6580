"""Calls that wait for the server's event loop, made on that loop (an `async def` callable or route handler)."""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any, Dict, List

import numpy as np
import pytest

from pytriton.client import FuturesModelClient, ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.routes import RouteRequest
from pytriton.triton import RemoteTriton, Triton
from tests.conftest import running_triton

WAIT_S = 30.0  # a bound on what should happen at once

X = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
Y = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
BATCHING = ModelConfig(max_batch_size=4)


def _double(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"] * 2} for request in requests]


def test_a_blocking_client_call_to_the_server_from_its_loop_fails_at_once() -> None:
    # An async callable's blocking ModelClient call to its own server waited for an answer only the loop it blocked
    # could give: every client of the server stood still until the call gave up (init_timeout_s, 60 s by
    # default), and then the request failed with a timeout. nvidia-pytriton 0.7 runs async callables apart from its
    # server, where the call is answered.
    ports: Dict[str, Any] = {}

    async def calls_its_server(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        with ModelClient(f"http://127.0.0.1:{ports['http']}", "double", init_timeout_s=5) as client:
            return [{"y": client.infer_batch(x=request["x"])["y"]} for request in requests]

    def bind(triton: Triton) -> None:
        triton.bind("double", _double, inputs=X, outputs=Y, config=BATCHING)
        triton.bind("calls_its_server", calls_its_server, inputs=X, outputs=Y, config=BATCHING)

    with running_triton(bind) as triton:
        ports["http"] = triton.http_port
        with ModelClient(f"http://127.0.0.1:{triton.http_port}", "calls_its_server", inference_timeout_s=30) as client:
            with pytest.raises(PyTritonClientInferenceServerError) as raised:
                client.infer_sample(x=np.ones(2, np.float32))
        assert "ModelClient called on the event loop of the server at 127.0.0.1:" in str(raised.value)
        assert "Await an AsyncioModelClient or pytriton.compose.call_model_async" in str(raised.value)
        with ModelClient(f"grpc://127.0.0.1:{triton.grpc_port}", "double") as client:
            assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2.0, 2.0]


def test_a_futures_client_result_awaited_on_the_server_loop_fails_at_once_and_wrapped_is_answered() -> None:
    # future.result() of a FuturesModelClient call to the server, on that server's loop, waited as a ModelClient's
    # call did (the client's inference_timeout_s); the future wrapped for the loop (asyncio.wrap_future) is answered.
    ports: Dict[str, Any] = {}

    async def waits(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        with FuturesModelClient(f"http://127.0.0.1:{ports['http']}", "double", inference_timeout_s=5) as client:
            future = client.infer_sample(x=requests[0]["x"])
            if requests[0]["x"][0] == 1:
                return [{"y": (await asyncio.wrap_future(future))["y"]}]
            return [{"y": future.result()["y"]}]

    def bind(triton: Triton) -> None:
        triton.bind("double", _double, inputs=X, outputs=Y, config=BATCHING)
        triton.bind("waits", waits, inputs=X, outputs=Y, config=ModelConfig(batching=False))

    with running_triton(bind) as triton:
        ports["http"] = triton.http_port
        with ModelClient(f"http://127.0.0.1:{triton.http_port}", "waits", inference_timeout_s=30) as client:
            assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2.0, 2.0]
            with pytest.raises(PyTritonClientInferenceServerError) as raised:
                client.infer_sample(x=np.full(2, 3, np.float32))
        assert "FuturesModelClient's future.result() called on the event loop of the server at" in str(raised.value)


def test_a_remote_triton_made_on_the_loop_of_its_server_is_refused() -> None:
    # A RemoteTriton attaching from an async callable to the server that runs it waited for that server's loop,
    # which it blocked: the server answered no one any more, and stop() could not end it.
    ports: Dict[str, Any] = {}

    async def attaches(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        with RemoteTriton(url=f"http://127.0.0.1:{ports['http']}") as remote:
            remote.bind("remote", _double, inputs=X, outputs=Y, config=BATCHING)
        return requests

    def bind(triton: Triton) -> None:
        triton.bind("double", _double, inputs=X, outputs=Y, config=BATCHING)
        triton.bind("attaches", attaches, inputs=X, outputs=Y, config=BATCHING)

    with running_triton(bind) as triton:
        ports["http"] = triton.http_port
        with ModelClient(f"http://127.0.0.1:{triton.http_port}", "attaches", inference_timeout_s=WAIT_S) as client:
            with pytest.raises(PyTritonClientInferenceServerError) as raised:
                client.infer_sample(x=np.ones(2, np.float32))
        assert "RemoteTriton created on the event loop of the server at 127.0.0.1:" in str(raised.value)
        with ModelClient(f"http://127.0.0.1:{triton.http_port}", "double") as client:
            assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("frontends", [1, 2])
def test_bind_from_an_async_callable_or_route_handler(frontends: int) -> None:
    # bind() waited for the server's event loop from that loop's own thread: the server stopped answering anyone,
    # for good, and stop() could not end it. nvidia-pytriton 0.7 binds from an async callable.
    holder: Dict[str, Triton] = {}

    async def binds(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        holder["triton"].bind("bound_by_a_callable", _double, inputs=X, outputs=Y, config=BATCHING)
        return [{"y": request["x"]} for request in requests]

    async def bind_route(request: RouteRequest) -> Dict[str, str]:
        name = request.path_params["name"]
        try:
            infer_func = ProcessInstances(_double) if name == "in_processes" else _double
            holder["triton"].bind(name, infer_func, inputs=X, outputs=Y, config=BATCHING)
        except PyTritonInvalidOperationError as error:
            return {"refused": str(error)}
        return {"bound": name}

    def bind(triton: Triton) -> None:
        holder["triton"] = triton
        triton.bind("binds", binds, inputs=X, outputs=Y, config=BATCHING)
        triton.add_route("/bind/{name}", bind_route)

    with running_triton(bind, frontends=frontends) as triton:
        url = f"http://127.0.0.1:{triton.http_port}"
        with ModelClient(url, "binds", inference_timeout_s=WAIT_S) as client:
            assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [1.0, 1.0]
        assert _post(triton, "/bind/by_a_route") == {"bound": "by_a_route"}
        refused = _post(triton, "/bind/in_processes")["refused"]
        assert refused.startswith("model 'in_processes': ProcessInstances are bound from a thread other than")
        for name in ("bound_by_a_callable", "by_a_route"):
            with ModelClient(url, name, init_timeout_s=WAIT_S) as client:
                assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [2.0, 2.0]


def _post(triton: Triton, path: str) -> Any:
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=WAIT_S)
    try:
        connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        return json.loads(response.read())
    finally:
        connection.close()
