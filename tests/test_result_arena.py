"""The instance process's result arena: regions lent to the server, given back in any order, never overwritten early."""

from __future__ import annotations

import gc
import os
from typing import Any, Dict, List

import numpy as np
import pytest

from pytriton.core.process_instances.result_arena import ResultArena, lease_result
from pytriton.ipc.regions import COPY_BYTES, Regions
from pytriton.ipc.tensors import ArenaReader

MIB = 1 << 20


def _result(value: float, size: int = MIB) -> List[Dict[str, np.ndarray]]:
    return [{"y": np.full(size // 4, value, dtype=np.float32)}]


def _region(arena: ResultArena, packed: Any) -> int:
    refs = packed[1][0][0]
    where, offset, *_ = refs["y"]
    assert where == 0, "expected the result in the arena"
    return int(offset)


def test_regions_take_turns_while_the_server_gives_each_back_one_job_late() -> None:
    arena = ResultArena(256 * MIB)
    offsets = []
    for job in range(1, 9):
        if job >= 3:
            arena.give_back(job - 2)
        packed, body, _ = arena.pack_result(_result(job), job)
        assert body == []
        offsets.append(_region(arena, packed))
    assert sorted(set(offsets)) == [COPY_BYTES, COPY_BYTES + MIB]  # two regions, the low ones, in turn


def test_regions_given_back_late_and_out_of_order_leave_the_arena_as_it_is() -> None:
    """Responses finish in any order and are said one job late: the room after the regions still lent is found.

    A ring that had wrapped to its start (the region there was free) saw no room after the region it wrapped
    past, so it grew a new arena, up to the budget, and then sent results through the socket.
    """
    arena = ResultArena(256 * MIB)
    held: List[int] = []
    sizes = [MIB, 3 * MIB, MIB, MIB, 2 * MIB, MIB]  # the first is the largest: the arena holds four of it
    first_arena = 0
    for job in range(1, 300):
        _, body, new = arena.pack_result(_result(job, sizes[job % len(sizes)]), job)
        first_arena = first_arena or new
        assert body == [] and (new == 0 or job == 1), f"job {job}: the result went through the socket or the arena grew"
        held.append(job)
        if job % 5 == 0:  # the server still holds three results now and then; the others come back out of order
            continue
        while len(held) > (1 if job % 2 else 2):
            arena.give_back(held.pop(1 if len(held) > 2 else 0))
    assert arena.segment is not None and arena.segment.size == first_arena == 16 * MIB


def test_the_lowest_free_region_is_taken() -> None:
    regions = Regions(10)
    assert [regions.take(key, 3) for key in (1, 2, 3)] == [0, 3, 6]
    assert regions.take(4, 3) is None
    assert regions.give_back(2) and not regions.give_back(2)
    assert regions.take(5, 4) is None and regions.take(6, 2) == 3
    regions.give_back(1)
    assert regions.take(7, 3) == 0 and regions.take(8, 1) == 5 and regions.take(9, 1) == 9


def test_a_key_that_holds_a_region_is_refused_another() -> None:
    """Two regions under one key would go back as one: the other would be written over while still read."""
    regions = Regions(10)
    assert regions.take(1, 3) == 0
    with pytest.raises(ValueError, match="region key 1 holds a region already"):
        regions.take(1, 3)
    assert regions.give_back(1) and regions.take(1, 3) == 0  # given back, the key may be lent again


def test_a_region_the_server_still_reads_is_never_written() -> None:
    arena = ResultArena(256 * MIB)
    reader = ArenaReader()
    held = []
    for job in range(1, 7):  # nothing is given back: each result needs a region of its own
        packed, body, new = arena.pack_result(_result(job), job)
        if new:
            reader.adopt(new, [os.dup(arena.segment.fileno())])  # type: ignore[union-attr]
        held.append(lease_result(reader, packed, memoryview(b"".join(bytes(part) for part in body)), lambda: None))
    for job, result in enumerate(held, start=1):
        assert np.all(result[0]["y"] == job)


def test_results_give_back_their_region_when_the_last_array_goes() -> None:
    arena = ResultArena(256 * MIB)
    reader = ArenaReader()
    released: List[int] = []
    packed, _, new = arena.pack_result(_result(1.0), 1)
    reader.adopt(new, [os.dup(arena.segment.fileno())])  # type: ignore[union-attr]
    result = lease_result(reader, packed, memoryview(b""), lambda: released.append(1))
    y = result[0]["y"][10:20]  # a view of a view keeps the lease
    del result
    gc.collect()
    assert released == []
    assert np.all(y == 1.0)
    del y
    gc.collect()
    assert released == [1]


def test_a_result_that_finds_no_room_travels_in_the_body() -> None:
    arena = ResultArena(4 * MIB)  # the budget holds three results at most (after the start kept for small ones)
    for job in range(1, 4):
        _, body, _ = arena.pack_result(_result(job), job)
        assert body == []
    packed, body, _ = arena.pack_result(_result(4), 4)
    assert len(body) == 1 and packed[1][0][0]["y"][0] == 1  # in the body
    arena.give_back(1)
    _, body, _ = arena.pack_result(_result(5), 5)
    assert body == []


def test_small_results_are_copied_out_and_lent_to_no_one() -> None:
    """What takes at most COPY_BYTES goes at the arena's start; the server copies it out and gives nothing back."""
    arena = ResultArena(256 * MIB)
    reader = ArenaReader()
    released: List[int] = []
    big, _, new = arena.pack_result(_result(-1.0), 100)  # lent, and never given back here
    reader.adopt(new, [os.dup(arena.segment.fileno())])  # type: ignore[union-attr]
    kept = lease_result(reader, big, memoryview(b""), lambda: released.append(100))
    for job in range(1, 50):
        packed, body, new = arena.pack_result(_result(job, COPY_BYTES), job)
        assert body == [] and new == 0 and _region(arena, packed) == 0
        result = lease_result(reader, packed, memoryview(b""), lambda job=job: released.append(job))
        assert np.all(result[0]["y"] == job) and result[0]["y"].flags.owndata  # a copy
    del result
    gc.collect()
    assert released == [] and np.all(kept[0]["y"] == -1.0)


@pytest.mark.parametrize("value", [None, "text", {"y": 1}])
def test_what_is_not_a_list_of_arrays_is_sent_as_it_is(value: Any) -> None:
    packed, body, new = ResultArena(MIB).pack_result(value, 1)
    assert packed == (None, value) and body == [] and new == 0
