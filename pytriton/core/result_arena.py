"""Results that leave an instance process without a copy in the server: regions of the instance's arena, leased.

The inputs' arena can be reused for every job (the process is done with a job's inputs when it answers).
Results are another matter: the server reads a result's arrays until its responses are encoded, which can
be after the process has started, and answered, its next job. So each result's region of the process's
arena is leased to the server: the server's arrays are views of it, and when the last of them is gone
(a finalizer on the one array they all view) the server names the job in its next JOB message and the
process may write there again. Regions come back in any order and are taken first fit (core/arena_regions.py);
a result that finds no room (the server still holds earlier ones, e.g. in its response cache) grows the arena
within the budget, or travels in the message body.

Copying a 1 MiB result out of the arena in the server cost a copy and fresh pages for every response.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable, List, Tuple

import numpy as np

from pytriton.core.arena_regions import Regions
from pytriton.core.instance_protocol import (
    ArenaReader,
    ArenaWriter,
    arena_bytes,
    result_items,
    result_value,
)
from pytriton.core.raw_tensors import Buffer, mark_leased

_IN_ARENA = 0
# How many results of the usual size a new arena should hold while the server still reads earlier ones.
_RESULTS_IN_FLIGHT = 4
# Results this small are copied out at once and their region given back.
_COPY_BYTES = 64 * 1024


class ResultArena(ArenaWriter):
    """The instance process's side: regions of its arena lent to the server, one per job, given back in any order."""

    def __init__(self, budget_bytes: int) -> None:
        """An arena of at most `budget_bytes`."""
        super().__init__(budget_bytes)
        self._regions = Regions(0)

    def pack_result(self, value: Any, job_id: int) -> Tuple[Any, List[Buffer], int]:
        """Pack a call's result (as `instance_protocol.pack_result`), its arrays in a region lent for `job_id`."""
        items = result_items(value)
        if items is None:
            return (None, value), [], 0
        as_tuple, dicts = items
        needed = arena_bytes(dicts)
        new_arena = 0
        start = self._regions.take(job_id, needed) if needed else None
        if start is None and needed:
            # Room for a few results: the server gives a region back only once its responses are out, which is
            # often after the next job has come. A new segment; the server keeps its mapping of the old one.
            current = self.segment.size if self.segment is not None else 0
            new_arena = self._reserve(max(_RESULTS_IN_FLIGHT * needed, 2 * current))
            if new_arena:
                self._regions = Regions(new_arena)
                start = self._regions.take(job_id, needed)  # None when the budget kept the arena smaller than this
        if start is None:
            placed = self._place(dicts, overflow=True, start=0, end=0)  # no room now: the body carries it
        else:
            placed = self._place(dicts, overflow=True, start=start, end=start + needed)
        assert placed is not None
        return (as_tuple, placed[0]), placed[1], new_arena

    def give_back(self, job_ids: Iterable[int]) -> None:
        """The server is done with these jobs' results: their regions are free (unless an arena replaced theirs)."""
        for job in job_ids:
            self._regions.give_back(job)


def lease_result(reader: ArenaReader, packed: Any, body: memoryview, release: Callable[[], None]) -> Any:
    """A result whose arena arrays are views leased from the process; `release` is called once they are all gone.

    A small result is copied out instead, and `release` called at once.
    """
    as_tuple, items = packed
    if as_tuple is None:
        release()
        return items
    view = reader.view
    leased = _arena_bytes(items)
    if view is None or leased <= _COPY_BYTES:  # a copy of a few KiB costs less than a finalizer
        rebuilt = reader.unpack(items, body, copy=True)
        release()
        return result_value(as_tuple, rebuilt)
    lease = np.ndarray((len(view),), np.uint8, view)  # every array of the result is a view of this one
    weakref.finalize(lease, release)
    mark_leased(lease)  # the responses may send its views as they are: the process writes there only after release
    rebuilt = reader.unpack(items, body, copy=False, arena=lease)
    return result_value(as_tuple, rebuilt)


def _arena_bytes(items: List[Any]) -> int:
    """The bytes of a packed result's arrays in the arena."""
    return sum(ref[2] for item in items if len(item) == 3 for ref in item[0].values() if ref[0] == _IN_ARENA)
