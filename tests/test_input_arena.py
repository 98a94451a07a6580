"""A job's inputs in the server's arena: lent to the process while it views them, and to the server's outputs.

Both sides run here, as the server and the instance process run them (the process's arena is the server's,
mapped through a duplicate of its descriptor).
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from pytriton.core.process_instances.input_arena import InputArena, InputViews, outputs_in_inputs
from pytriton.core.process_instances.result_arena import ResultArena, lease_result
from pytriton.ipc.regions import COPY_BYTES
from pytriton.ipc.tensors import IN_ARENA, IN_INPUTS, ArenaReader

MIB = 1 << 20


class Hop:
    """The server's input arena and the process's views of it, a job at a time."""

    def __init__(self, budget: int = 256 * MIB) -> None:
        self.server = InputArena(budget)
        self.process = InputViews()
        self.results = ResultArena(budget)
        self.reader = ArenaReader()
        self.job = 0

    def send(self, *arrays: np.ndarray) -> Tuple[int, List[Any], Optional[np.ndarray], Any]:
        """Pack a batch (one request per array) and unpack it in the process: (job, inputs, lease, packed)."""
        self.job += 1
        packed, body, new = self.server.pack([{"x": array} for array in arrays], self.job)
        if new:
            assert self.server.segment is not None
            self.process.reader.adopt(new, [os.dup(self.server.segment.fileno())])
        joined = memoryview(b"".join(bytes(part) for part in body))
        inputs, lease = self.process.unpack(self.job, packed, joined)
        return self.job, inputs, lease, packed

    def run(self, model: Callable[[List[Any]], Any], *arrays: np.ndarray) -> Tuple[Any, Any, Any]:
        """One job as the process runs it (nothing of it left but what the model keeps), and its result in the server.

        Returns the packed inputs, the packed result and the server's result.
        """
        job, inputs, lease, packed = self.send(*arrays)
        value = model(inputs)
        del inputs
        in_inputs = outputs_in_inputs(value, lease) if lease is not None else None
        result_packed, body, new = self.results.pack_result(value, job, in_inputs)
        if new:
            assert self.results.segment is not None
            self.reader.adopt(new, [os.dup(self.results.segment.fileno())])
        del value, lease
        released = self.process.take_released()  # sent with the result: usually this job
        joined = memoryview(b"".join(bytes(part) for part in body))
        result = lease_result(self.reader, result_packed, joined, lambda: None, lambda: self.server.lease(job))
        self.server.released(released)  # after the result's outputs took their hold, as the server does
        return packed, result_packed, result


def _region(packed: Any) -> int:
    return int(packed[0][0]["x"][1])


def test_inputs_a_model_keeps_are_never_written_over() -> None:
    hop = Hop()
    kept = []
    for value in range(1, 6):
        _, inputs, lease, _ = hop.send(np.full(MIB // 4, value, np.float32))
        kept.append(inputs[0]["x"])  # the model keeps its input
        del inputs, lease
        assert hop.process.take_released() == ()  # still viewed: not given back
    for value, array in enumerate(kept, start=1):
        assert np.all(array == value)
    del kept, array
    gc.collect()
    assert sorted(hop.process.take_released()) == [1, 2, 3, 4, 5]


def test_a_region_comes_back_once_the_process_lets_go_and_is_reused() -> None:
    hop = Hop()
    regions = []
    for value in range(1, 6):
        job, inputs, lease, packed = hop.send(np.full(MIB // 4, value, np.float32))
        assert np.all(inputs[0]["x"] == value)
        regions.append(_region(packed))
        del inputs, lease
        released = hop.process.take_released()
        assert released == (job,)
        hop.server.released(released)
    assert set(regions) == {COPY_BYTES}  # the same region, its pages mapped already


def test_an_output_that_is_an_input_is_not_copied_and_holds_the_region_until_it_is_gone() -> None:
    hop = Hop()

    def views(inputs: List[Any]) -> Any:
        x = inputs[0]["x"]
        return [{"y": x, "tail": x[1024:], "bytes": x.view(np.uint8)}]  # the input, a slice of it, another dtype

    packed, result_packed, result = hop.run(views, np.full(MIB // 4, 7.0, np.float32))
    first = _region(packed)
    refs = result_packed[1][0][0]
    assert {name: ref[0] for name, ref in refs.items()} == {"y": IN_INPUTS, "tail": IN_INPUTS, "bytes": IN_INPUTS}
    assert refs["tail"][1] == first + 1024 * 4
    assert hop.results.segment is None  # nothing went into the process's result arena
    assert np.all(result[0]["y"] == 7.0) and result[0]["tail"].shape == (MIB // 4 - 1024,)
    assert result[0]["bytes"].nbytes == MIB
    # The process let go; the server still sends the outputs: the next batch goes elsewhere, and does not touch them.
    packed, _, _ = hop.run(lambda inputs: [{"y": inputs[0]["x"]}], np.full(MIB // 4, 8.0, np.float32))
    assert _region(packed) != first and np.all(result[0]["y"] == 7.0)
    del result
    gc.collect()
    packed, _, _ = hop.run(lambda inputs: [{"y": inputs[0]["x"]}], np.full(MIB // 4, 9.0, np.float32))
    assert _region(packed) == first  # both sides let go of the first region


def test_outputs_that_are_not_whole_views_of_the_inputs_are_copied() -> None:
    hop = Hop()

    def model(inputs: List[Any]) -> Any:
        x = inputs[0]["x"]
        value = [{"strided": x[::2], "new": x * 2, "small": x[:16], "elsewhere": np.array(x)}]
        assert outputs_in_inputs(value, x.base) is None
        return value

    _, result_packed, result = hop.run(model, np.arange(MIB // 4, dtype=np.float32))
    assert all(ref[0] == IN_ARENA for ref in result_packed[1][0][0].values())
    assert np.array_equal(result[0]["strided"], np.arange(0, MIB // 4, 2, dtype=np.float32))
    assert np.array_equal(result[0]["new"], np.arange(MIB // 4, dtype=np.float32) * 2)


def test_small_inputs_are_copied_out_and_lent_to_no_one() -> None:
    hop = Hop()
    kept: List[Dict[str, np.ndarray]] = []
    for value in range(1, 20):
        _, inputs, lease, packed = hop.send(np.full(100, value, np.float32), np.full(3, value, np.int64))
        assert lease is None and _region(packed) == 0  # the start of the arena, every time
        assert inputs[0]["x"].flags.owndata  # a copy: the model may keep it
        kept.extend(inputs)
        assert hop.process.take_released() == ()  # nothing to give back
    assert [int(item["x"][0]) for item in kept] == [value for value in range(1, 20) for _ in range(2)]


def test_inputs_kept_for_good_fill_the_budget_and_then_travel_in_the_body() -> None:
    hop = Hop(budget=4 * MIB)
    kept = []
    for value in range(1, 8):
        _, inputs, _, packed = hop.send(np.full(MIB // 4, value, np.float32))
        kept.append(inputs[0]["x"])
        where = packed[0][0]["x"][0]
        assert where == (IN_ARENA if value <= 3 else 1)  # three regions fit 4 MiB after the start kept for small ones
    assert [float(array[0]) for array in kept] == [1, 2, 3, 4, 5, 6, 7]
