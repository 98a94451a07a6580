"""A long BYTES answer's remaining steps off the event loop: its size counted in the instance thread that returned
it (core/tensors/counted_strings.py), its arrays freed in a codec thread a piece at a time (transport/codec_threads.py).

A million strings answered held the loop 60-80 ms: the `max_response_bytes` count (one C call over the object
array) and the array's free ran there (and a codec thread's one join of two million parts held the GIL meanwhile,
core/tensors/raw_tensors.serialize_in_pieces). The strings here are a bytes subclass that notes the thread each
element's length is taken in (the count, the codec's writing) and the thread it is freed in: no timing is asserted.
"""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.core.tensors.raw_tensors import object_array, serialize_bytes_tensor, serialize_in_pieces, unchanging
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.protocol import codec_place
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url, running_triton
from tests.waiting import wait_until

LONG = 20_000  # strings of an answer: over COUNTED_ELEMENTS and OFF_LOOP_VALUES
assert LONG > codec_place.OFF_LOOP_VALUES
LIMIT = 4 * 50_000 + 10 * 50_000  # max_response_bytes: an answer of 50,000 strings of 10 bytes, not one byte more
LOOP = "pytriton-loop"

measured: List[str] = []  # the threads elements' lengths were taken in
freed: List[str] = []  # the threads elements were freed in


class _Noted(bytes):
    """A string that notes where its length is taken and where it is freed."""

    def __len__(self) -> int:
        measured.append(threading.current_thread().name)
        return bytes.__len__(self)

    def __del__(self) -> None:
        freed.append(threading.current_thread().name)


def _noted(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """`count` strings of 10 bytes (the `in` value), made for each call."""
    responses = []
    for request in requests:
        count = int(request["in"][0])
        out = np.empty(count, dtype=object)
        out[:] = [_Noted(b"s%09d" % index) for index in range(count)]
        responses.append({"out": out})
    return responses


KEPT = np.array([b"k%09d" % index for index in range(LONG)], dtype=object)


def _kept(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """The same long array every time: the model keeps it."""
    return [{"out": KEPT} for _ in requests]


def _bind(triton: Triton) -> None:
    count = [Tensor(name="in", dtype=np.int64, shape=(1,))]
    strings = [Tensor(name="out", dtype=bytes, shape=(-1,))]
    config = ModelConfig(batching=False)
    triton.bind("noted", _noted, inputs=count, outputs=strings, config=config)
    triton.bind("kept", _kept, inputs=count, outputs=strings, config=config)


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, limits=ServerLimits(max_response_bytes=LIMIT)) as server:
        yield server


def _infer(triton: Triton, protocol: str, model: str, count: int) -> np.ndarray:
    value = np.array([count], np.int64)
    if protocol == "http":
        given = httpclient.InferInput("in", [1], "INT64")
        given.set_data_from_numpy(value)
        out = httpclient.InferenceServerClient(http_url(triton)).infer(model, [given]).as_numpy("out")
    else:
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            tensor = grpcclient.InferInput("in", [1], "INT64")
            tensor.set_data_from_numpy(value)
            out = client.infer(model, [tensor]).as_numpy("out")
    assert out is not None
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_long_bytes_answer_is_counted_and_freed_off_the_loop(triton: Triton, protocol: str) -> None:
    measured.clear()
    freed.clear()
    out = _infer(triton, protocol, "noted", LONG)
    assert out.tolist() == [b"s%09d" % index for index in range(LONG)]
    wait_until(lambda: len(freed) == LONG, "every string freed")
    # Counted in the model's thread (max_response_bytes), written in a codec thread; never on the loop.
    assert LOOP not in measured
    assert {name for name in measured if name.startswith("pytriton-noted-")}, set(measured)
    assert LOOP not in set(freed)
    assert set(freed) == {"pytriton-codec"}


def test_a_long_bytes_answer_over_max_response_bytes_is_refused_with_its_size_counted_ahead(triton: Triton) -> None:
    measured.clear()
    assert len(_infer(triton, "http", "noted", 50_000)) == 50_000  # LIMIT bytes exactly: answered
    with pytest.raises(InferenceServerException) as refused:
        _infer(triton, "http", "noted", 50_001)
    assert refused.value.message() == (
        f"the outputs 'out' returned by model 'noted' take {LIMIT + 14} bytes, more than the {LIMIT} bytes a "
        "response may carry on this server"
    )
    assert LOOP not in measured


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_answer_the_model_keeps_is_answered_whole_each_time(triton: Triton, protocol: str) -> None:
    # Emptied a piece at a time only when nothing else holds it: the model's own array is let go of, not emptied.
    expected = KEPT.tolist()
    for _ in range(3):
        assert _infer(triton, protocol, "kept", 1).tolist() == expected
    assert KEPT.tolist() == expected


def test_long_bytes_are_written_a_piece_at_a_time_as_at_once() -> None:
    strings = [b"s%07d" % index if index % 3 else f"é{index}" for index in range(100_002)]
    assert object_array(strings).tolist() == strings  # a long list made an array a piece at a time
    array = np.array(strings, dtype=object).reshape(7, -1)[:, ::2]  # 2-D, not contiguous, str and bytes
    assert bytes(serialize_in_pieces(array)) == serialize_bytes_tensor(array)
    # The pieces' parts are let go of piece by piece: two million parts at once held 70 MB more (and the GIL).
    million = np.array([b"s%07d" % index for index in range(1_000_000)], dtype=object)
    tracemalloc.start()
    try:
        written = serialize_in_pieces(million)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(written) == 12_000_000
    assert peak < 2 * 12_000_000 + 4_000_000
    # Its buffer is nobody else's: it goes out as it is (as the bytes it replaces did), not copied on the loop.
    assert unchanging([written], object())
