"""A system shared-memory region an in-flight request will write an output into is not unregistered.

What tritonserver 2.51 (nvidia-pytriton 0.7) answered, probed with a 64 MiB `identity` request whose output
went to a region: unregistering that region while the request ran was 500 / INTERNAL "Cannot unregister shared
memory region 'out', it is currently in use.", and the region stayed; unregistering all took the others and
answered 500 "Failed to unregister the following system shared memory regions: out ,"; the request was then
answered, its output written. The same with frontend processes (`frontends=3`), where the hub registers and
unregisters regions and the frontends' requests hold them: the hub asks the frontends before it unregisters.
"""

from __future__ import annotations

import queue
import secrets
import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import GRPC_AUTH, HTTP_AUTH, grpc_url, http_url, running_triton

_GATE, _STARTED = threading.Event(), threading.Event()


def _gated(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's `a` doubled, once the test opens the gate."""
    _STARTED.set()
    _GATE.wait(30)
    return [{"twice": request["a"] * 2} for request in requests]


def _bind(triton: Triton) -> None:
    vector = (-1,)
    triton.bind(
        "gated",
        infer_func=_gated,
        inputs=[Tensor(name="a", dtype=np.float32, shape=vector)],
        outputs=[Tensor(name="twice", dtype=np.float32, shape=vector)],
        config=ModelConfig(batching=False),
    )


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends-3"])
def triton(request: pytest.FixtureRequest) -> Iterator[Triton]:
    with running_triton(_bind, allow_metrics=False, frontends=request.param) as server:
        yield server


@pytest.fixture
def keys() -> Iterator[List[str]]:
    made = [f"/pytriton-test-{secrets.token_hex(6)}" for _ in range(2)]
    handles = [shm.create_shared_memory_region(key[1:], key, 64) for key in made]
    yield made
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def _send(protocol: str, url: str, a: Any, twice: Any) -> queue.Queue[Any]:
    """Send the request from a thread with a client of its own (tritonclient's calls wait for each other)."""
    answers: queue.Queue[Any] = queue.Queue()
    lib = httpclient if protocol == "http" else grpcclient
    sender = lib.InferenceServerClient(url)

    def send() -> None:
        try:
            if protocol == "stream":
                streamed: queue.Queue[Any] = queue.Queue()
                sender.start_stream(callback=lambda result, error: streamed.put(error or result))
                sender.async_stream_infer("gated", [a], outputs=[twice])
                answers.put(streamed.get(timeout=30))
                sender.stop_stream()
            else:
                answers.put(sender.infer("gated", [a], outputs=[twice]))
        except Exception as error:  # noqa: BLE001 - the test reads it
            answers.put(error)
        finally:
            sender.close()

    threading.Thread(target=send, daemon=True).start()
    return answers


@pytest.mark.parametrize("protocol", ["http", "grpc", "stream"])
def test_a_region_an_in_flight_request_writes_into_is_not_unregistered(
    triton: Triton, keys: List[str], protocol: str
) -> None:
    lib = httpclient if protocol == "http" else grpcclient
    url = http_url(triton) if protocol == "http" else grpc_url(triton)
    auth = HTTP_AUTH if protocol == "http" else GRPC_AUTH
    _GATE.clear()
    _STARTED.clear()
    client = lib.InferenceServerClient(url)
    try:
        client.register_system_shared_memory("in", keys[0], 64, headers=auth)
        client.register_system_shared_memory("out", keys[1], 64, headers=auth)
        a = lib.InferInput("a", [4], "FP32")
        a.set_data_from_numpy(np.arange(4, dtype=np.float32))
        twice = lib.InferRequestedOutput("twice")
        twice.set_shared_memory("out", 16)
        answers = _send(protocol, url, a, twice)
        assert _STARTED.wait(30)
        with pytest.raises(InferenceServerException) as refused:
            client.unregister_system_shared_memory("out", headers=auth)
        assert refused.value.message() == "Cannot unregister shared memory region 'out', it is currently in use."
        assert refused.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        with pytest.raises(InferenceServerException) as raised:
            client.unregister_system_shared_memory(headers=auth)
        assert raised.value.message() == "Failed to unregister the following system shared memory regions: out ,"
        status = client.get_system_shared_memory_status(headers=auth)
        assert ([region["name"] for region in status] if protocol == "http" else list(status.regions)) == ["out"]
        _GATE.set()
        answer = answers.get(timeout=30)
        assert not isinstance(answer, Exception), answer
        assert answer.get_output("twice") is not None  # answered, its data in the region
        with open(f"/dev/shm{keys[1]}", "rb") as written:
            assert np.frombuffer(written.read(16), np.float32).tolist() == [0.0, 2.0, 4.0, 6.0]
        client.unregister_system_shared_memory("out", headers=auth)  # the request is done: the region goes now
        status = client.get_system_shared_memory_status(headers=auth)
        assert (status if protocol == "http" else list(status.regions)) == []
    finally:
        _GATE.set()
        client.unregister_system_shared_memory(headers=auth)
        client.close()


def test_a_failed_request_lets_go_of_its_region(triton: Triton, keys: List[str]) -> None:
    """A request refused after its regions were found (an input the model does not have) holds nothing after."""
    client = httpclient.InferenceServerClient(http_url(triton))
    try:
        client.register_system_shared_memory("out", keys[1], 64, headers=HTTP_AUTH)
        wrong = httpclient.InferInput("b", [4], "FP32")
        wrong.set_data_from_numpy(np.zeros(4, dtype=np.float32))
        twice = httpclient.InferRequestedOutput("twice")
        twice.set_shared_memory("out", 16)
        with pytest.raises(InferenceServerException):
            client.infer("gated", [wrong], outputs=[twice])
        client.unregister_system_shared_memory("out", headers=HTTP_AUTH)
        assert client.get_system_shared_memory_status(headers=HTTP_AUTH) == []
    finally:
        client.close()
