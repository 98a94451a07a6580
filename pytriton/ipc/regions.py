"""Regions of a process instance's arena lent to the other side until given back: first fit, low addresses first.

Both sides of the process hop lend regions of their arena, one per job: the server lends a batch's inputs to
the process (core/process_instances/input_arena.py: a model may keep them), the process lends a result to the
server (core/process_instances/result_arena.py: the responses are still being sent when the next batch runs).
Regions come back in any order (responses finish in any order), so this is a first fit over the few regions
out, not a ring: a ring that wrapped to its start while room was left after its oldest region saw no room
there, grew its arena to the budget (each time a fresh segment, its pages reserved and faulted again) and then
sent results through the socket.

What fits in the first COPY_BYTES of the arena is not lent: it goes there, where no region is ever lent, and
the receiver copies it out at once (a copy of a few KiB costs less than watching for the last view), before
the sender's next message. It needs no bookkeeping on either side.
"""

from __future__ import annotations

import bisect
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pytriton.ipc.tensors import IN_ARENA, ArenaWriter, Buffer, SharedPlaces, arena_bytes

# What takes at most this in the arena is copied out by the receiver, never lent.
COPY_BYTES = 64 * 1024
# How many messages of the usual size a new arena should hold while the receiver still views earlier ones.
_LENT_AT_ONCE = 4
_COPIED = -1  # the key of the start of the arena, kept for what is copied out
Placed = Tuple[List[Any], List[Buffer]]  # packed items and body parts


class Regions:
    """Which bytes of an arena of `size` bytes are lent, by key (a job id)."""

    def __init__(self, size: int) -> None:
        """An arena with nothing lent."""
        self.size = size
        self._starts: List[int] = []  # sorted
        self._ends: List[int] = []  # the end of the region that starts at the same index
        self._keys: List[int] = []
        self._by_key: Dict[int, Tuple[int, int]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def take(self, key: int, needed: int) -> Optional[int]:
        """Lend `needed` bytes to `key` (which has none yet): the lowest offset with room, or None.

        A key that holds a region already is refused: its two regions would go back as one, and the other be
        written over while it is still read.
        """
        if key in self._by_key:
            raise ValueError(f"region key {key} holds a region already")
        candidate = 0
        for start, end in zip(self._starts, self._ends):
            if start - candidate >= needed:
                break
            candidate = max(candidate, end)
        else:
            if self.size - candidate < needed:
                return None
        index = bisect.bisect_left(self._starts, candidate)
        self._starts.insert(index, candidate)
        self._ends.insert(index, candidate + needed)
        self._keys.insert(index, key)
        self._by_key[key] = (candidate, candidate + needed)
        return candidate

    def give_back(self, key: int) -> bool:
        """The region lent to `key` is free again (False when `key` holds none here)."""
        region = self._by_key.pop(key, None)
        if region is None:
            return False
        index = bisect.bisect_left(self._starts, region[0])
        while self._keys[index] != key:  # a zero-byte region may share its start with another
            index += 1
        del self._starts[index], self._ends[index], self._keys[index]
        return True


class LendingArena(ArenaWriter):
    """A sender's arena: each message's arrays in a region lent for its job, or copied out from the arena's start."""

    def __init__(self, budget_bytes: int) -> None:
        """An arena of at most `budget_bytes` (0: everything travels in the message body)."""
        super().__init__(budget_bytes)
        self._regions = Regions(0)

    def lend(
        self,
        dicts: Sequence[Any],
        job_id: int,
        in_inputs: Optional[Dict[int, int]] = None,
        in_shared: Optional[SharedPlaces] = None,
    ) -> Tuple[List[Any], List[Buffer], int, bool]:
        """Pack a message's arrays: (packed items, body parts, new arena size or 0, whether a region was lent).

        Arrays named in `in_inputs` (by id, with their offset) lie in the job's inputs, and those in `in_shared` in
        a segment both sides map: named, not copied. What finds no room (the receiver still views earlier regions
        and the budget is reached) goes in the body.
        """
        place = functools.partial(self._place, in_inputs=in_inputs, in_shared=in_shared)
        segment = self.segment
        if segment is not None:  # the usual small batch: into the start, no bookkeeping (and no sizing pass)
            placed = place(dicts, overflow=False, start=0, end=min(COPY_BYTES, segment.size))
            if placed is not None:
                return placed[0], placed[1], 0, False
        skip = {**in_inputs, **in_shared} if in_inputs and in_shared else in_inputs or in_shared
        needed = arena_bytes(dicts, skip)
        new_arena = 0
        if needed <= COPY_BYTES:  # no arena yet, or one smaller than this
            new_arena = self._grow(needed) if needed else 0
            end = min(COPY_BYTES, self.segment.size) if self.segment is not None else 0
            placed = place(dicts, overflow=True, start=0, end=end)
            assert placed is not None
            return placed[0], placed[1], new_arena, False
        placed, new_arena, lent = self._lend_region(dicts, job_id, needed, place)
        return placed[0], placed[1], new_arena, lent

    def lend_apart(
        self, dicts: Sequence[Any], key: int, in_inputs: Optional[Dict[int, int]] = None
    ) -> Tuple[List[Any], List[Buffer], int, bool]:
        """Pack a message that the receiver may read after the sender's next one (several threads send): as `lend`.

        Never in the arena's copied-out start, which the next message would overwrite: arrays of at most
        COPY_BYTES in all travel in the body, larger ones in a region lent to `key`.
        """
        place = functools.partial(self._place, in_inputs=in_inputs)
        needed = arena_bytes(dicts, in_inputs)
        if needed <= COPY_BYTES:
            body_only = place(dicts, overflow=True, start=0, end=0)
            assert body_only is not None
            return body_only[0], body_only[1], 0, False
        placed, new_arena, lent = self._lend_region(dicts, key, needed, place)
        return placed[0], placed[1], new_arena, lent

    def _lend_region(
        self, dicts: Sequence[Any], job_id: int, needed: int, place: Callable[..., Optional[Placed]]
    ) -> Tuple[Placed, int, bool]:
        """Pack into `needed` bytes lent to `job_id`, growing the arena once if none is free, else in the body."""
        new_arena = 0
        start = self._regions.take(job_id, needed)
        if start is None:
            new_arena = self._grow(max(_LENT_AT_ONCE * needed, 2 * self._regions.size))
            if new_arena:
                start = self._regions.take(job_id, needed)  # None when the budget kept the arena smaller than this
        if start is None:
            placed = place(dicts, overflow=True, start=0, end=0)  # no room: in the body
        else:
            placed = place(dicts, overflow=True, start=start, end=start + needed)
        assert placed is not None
        return placed, new_arena, start is not None

    def give_back(self, job_id: int) -> None:
        """The receiver no longer views the region lent to `job_id` (nothing when an arena since replaced held it)."""
        self._regions.give_back(job_id)

    def _grow(self, wanted: int) -> int:
        """A new arena of at least `wanted` bytes within the budget (its size), or 0.

        The receiver keeps the old one mapped while it views it, and nothing here is written there again.
        """
        size = self._reserve(wanted)
        if size:
            self._regions = Regions(size)
            self._regions.take(_COPIED, min(COPY_BYTES, size))
        return size

    def close(self) -> None:
        """Release the arena; what still views it keeps it mapped."""
        super().close()
        self._regions = Regions(0)


def copied_out(packed: Sequence[Any]) -> bool:
    """Whether the receiver copies a message's arrays out at once: they lie in the arena's first COPY_BYTES.

    Lent regions never start there, so the first array in the arena says where all of them are.
    """
    for item in packed:
        if len(item) == 3:
            for ref in item[0].values():
                if ref[0] == IN_ARENA:
                    return bool(ref[1] < COPY_BYTES)
    return True
