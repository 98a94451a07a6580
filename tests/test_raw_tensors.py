"""Which outputs may leave as views: memory the request brought, followed through views of views."""

from __future__ import annotations

import numpy as np

from pytriton.core.tensors.raw_tensors import array_from_raw, backed_by, mark_leased, raw_from_array, unchanging


def test_an_input_view_and_what_is_made_of_it_are_backed_by_the_body() -> None:
    body = bytearray(np.arange(8, dtype=np.float32).tobytes())
    array = array_from_raw(memoryview(body), "FP32", [2, 4], "INPUT", "model")
    assert backed_by(raw_from_array(array, "FP32"), body)
    assert backed_by(raw_from_array(array[1:], "FP32"), body)
    assert backed_by(raw_from_array(array.reshape(4, 2).T.T, "FP32"), body)


def test_new_arrays_and_copies_are_not_backed_by_the_body() -> None:
    body = bytearray(np.arange(8, dtype=np.float32).tobytes())
    array = array_from_raw(memoryview(body), "FP32", [2, 4], "INPUT", "model")
    assert not backed_by(raw_from_array(array * 2, "FP32"), body)
    assert not backed_by(raw_from_array(array.T, "FP32"), body)  # not contiguous: copied
    assert not backed_by(raw_from_array(array.astype(np.float64), "FP64"), body)
    assert not backed_by(raw_from_array(np.zeros(3, np.float32), "FP32"), body)
    assert not backed_by(raw_from_array(array, "FP32"), bytearray(body))


def test_bytes_never_change_and_other_memory_may() -> None:
    body = bytearray(16)
    view = raw_from_array(array_from_raw(memoryview(body), "FP32", [4], "INPUT", "model"), "FP32")
    assert unchanging([b"head", view, b"prefix"], body)
    assert not unchanging([b"head", view, memoryview(bytearray(4))], body)
    assert not unchanging([b"head"], None)


def test_a_leased_region_is_unchanging_while_it_lives() -> None:
    lease = np.zeros(64, np.uint8)
    output = raw_from_array(lease[16:32].view(np.float32), "FP32")
    assert not unchanging([output], object())
    mark_leased(lease)
    assert unchanging([output], object())
    del output, lease  # the entry goes with the array: a new object at the same id is not leased
    assert not unchanging([raw_from_array(np.zeros(4, np.float32), "FP32")], object())
