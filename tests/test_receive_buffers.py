"""Receive buffers: reused only once nothing refers to them, bounded; inputs a model keeps stay intact."""

from __future__ import annotations

import gc
from typing import Any, Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.transport import receive_buffers
from pytriton.transport.receive_buffers import MAX_BYTES, MIN_BYTES, PROBES, ReceiveBuffers
from pytriton.triton import Triton
from tests.conftest import running_triton

MIB = 2**20


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


def test_a_buffer_is_handed_out_again_once_unreferenced() -> None:
    buffers = ReceiveBuffers()
    first = buffers.take(MIB)
    address = _address(first)
    del first
    again = buffers.take(MIB)
    assert _address(again) == address
    assert buffers.kept_bytes == MIB


@pytest.mark.parametrize(
    "keep",
    [
        lambda view: view[10:20],  # a slice of the memoryview
        lambda view: np.frombuffer(view, np.float32),  # an array over it
        lambda view: np.frombuffer(view, np.uint8)[100:].reshape(-1, 4)[1:],  # a view of a view of an array over it
        lambda view: memoryview(np.frombuffer(view[4:], np.int32)),  # a memoryview of such an array
    ],
    ids=["memoryview slice", "array", "view of an array", "memoryview of an array"],
)
def test_a_buffer_anything_still_refers_to_is_never_handed_out(keep: Any) -> None:
    buffers = ReceiveBuffers()
    view = buffers.take(MIB)
    view[:] = b"\x07" * MIB
    kept = keep(view)
    address = _address(view)
    del view
    gc.collect()
    others = [buffers.take(MIB) for _ in range(3)]
    assert address not in [_address(other) for other in others]
    for other in others:
        other[:] = b"\x00" * MIB
    assert set(bytes(memoryview(kept).cast("B"))) == {7}  # never written through another buffer
    del kept, others
    buffers.take(MIB)
    assert buffers.kept_bytes == 4 * MIB  # all four free again: one of them served, none was added


def test_what_is_kept_is_bounded_and_free_buffers_make_room() -> None:
    buffers = ReceiveBuffers(kept_bytes=4 * MIB)
    held = [buffers.take(MIB) for _ in range(6)]  # six in use at once: only four are kept
    assert buffers.kept_bytes == 4 * MIB
    del held
    larger = buffers.take(3 * MIB)  # no free buffer fits: free ones let go, oldest first, to keep it
    assert buffers.kept_bytes <= 4 * MIB and len(larger) == 3 * MIB
    assert _address(buffers.take(3 * MIB)) != _address(larger)  # in use: another one


def test_buffers_in_use_are_looked_at_a_few_at_a_time_and_then_passed_over(monkeypatch: Any) -> None:
    # A take looks at PROBES buffers at most: with many in use it makes a new one rather than scanning them
    # all (a scan that fails every time once all are busy), and the busy ones it looked at wait at the back.
    buffers = ReceiveBuffers()
    held = [buffers.take(MIB) for _ in range(20)]
    looked = []
    counted = receive_buffers._first_references
    monkeypatch.setattr(receive_buffers, "_first_references", lambda bucket: looked.append(1) or counted(bucket))
    held.append(buffers.take(MIB))
    assert len(looked) == PROBES and buffers.kept_bytes == 21 * MIB
    addresses = {_address(view) for view in held}
    del held[::2]  # every other one free again
    again = [buffers.take(MIB) for _ in range(10)]
    assert sum(_address(view) not in addresses for view in again) <= 1
    assert buffers.kept_bytes <= 22 * MIB and len(buffers.in_use()) == len(held) + len(again)


def test_sizes_out_of_range_get_buffers_of_their_own() -> None:
    buffers = ReceiveBuffers()
    for size in (MIN_BYTES - 1, MAX_BYTES + 1):
        buffer = buffers.take(size)
        assert len(buffer) == size and not buffer.readonly
    assert buffers.kept_bytes == 0


def test_a_buffer_serves_sizes_close_to_its_own_only() -> None:
    buffers = ReceiveBuffers()
    address = _address(buffers.take(MIB))
    assert _address(buffers.take(MIB - 1000)) == address
    assert _address(buffers.take(MIB // 4)) != address  # far smaller: a buffer of its own size


# ---------------------------------------------------------------- a model that keeps its inputs

KEPT: List[np.ndarray] = []


def _keep_inputs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    KEPT.extend(request["INPUT"] for request in requests)
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "keeper",
        _keep_inputs,
        inputs=[Tensor(name="INPUT", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=4),
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_a_model_keeps_are_never_overwritten_by_later_requests(protocol: str) -> None:
    """The kept inputs are views of the request's buffer: the requests after them must get other buffers."""
    KEPT.clear()
    sent = [np.full((1, MIB // 4), float(index), np.float32) for index in range(12)]
    with running_triton(_bind) as triton:
        if protocol == "http":
            client: Any = httpclient.InferenceServerClient(f"127.0.0.1:{triton.http_port}")
            module: Any = httpclient
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}")
            module = grpcclient
        for array in sent:
            tensor = module.InferInput("INPUT", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, **({"binary_data": True} if protocol == "http" else {}))
            output = client.infer("keeper", [tensor]).as_numpy("OUTPUT")
            assert np.array_equal(output, array)
        client.close()
    assert len(KEPT) == len(sent)
    for kept, array in zip(KEPT, sent):
        assert np.array_equal(kept, array)
