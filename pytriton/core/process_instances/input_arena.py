"""A job's inputs in shared memory: lent to the instance process until nothing there views them.

The server copies a batch's inputs into a region of its arena (`InputArena`, the one copy of the hop). The
process's requests are views of that region (`InputViews`), so a model that keeps its inputs (a list of
what it saw, a generator that yields later) keeps the region: it is the process's until the last array over
it is gone there (a weak reference's callback on the one array they all view), which the process's next
message says, usually the job's own answer. Until then no later batch is written there: when the arena was
simply reused for every job, a model that kept an input saw it change under it at the next batch.

An output that is one of those views (an identity model's, a slice of an input) is not copied into the
process's result region: the result names where it lies, and the server's output array is a view of its own
arena, which keeps the region until the responses are out. The region of a job is free again once neither
side views it. Inputs of at most COPY_BYTES are copied out by the process before the call and are lent to
no one (ipc/regions.py).
"""

from __future__ import annotations

import functools
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.tensors.raw_tensors import Buffer, mark_leased
from pytriton.ipc.regions import COPY_BYTES, LendingArena, copied_out
from pytriton.ipc.segments import SharedSegment
from pytriton.ipc.tensors import ArenaReader, SharedPlaces


class InputArena(LendingArena):
    """The server's side: each job's inputs in a region of its arena, held while either process views it."""

    def __init__(self, budget_bytes: int) -> None:
        """An arena of at most `budget_bytes` (0: every input travels in the message body)."""
        super().__init__(budget_bytes)
        self._holds: Dict[int, int] = {}  # job id: how many sides view its region (the process, the server)
        self._shared: Dict[int, Any] = {}  # job id: its inputs in frontend buffers, held while the process views them
        self._arenas: Dict[int, memoryview] = {}  # job id: the whole arena its region is in
        # Jobs whose outputs the server no longer views: appended by weak reference callbacks, in any thread.
        self._let_go: Deque[int] = deque()

    def pack(
        self, dicts: Sequence[Any], job_id: int = 0, in_shared: Optional[SharedPlaces] = None
    ) -> Tuple[List[Any], List[Buffer], int]:
        """Pack a batch's inputs into a region lent to `job_id`: (packed items, body parts, new arena size or 0).

        Those in `in_shared` lie in a frontend process's buffer that the process maps too: named, not copied, and
        held here until the process no longer views them.
        """
        let_go = self._let_go
        while let_go:
            self._let_go_of(let_go.popleft())
        packed, body, new_arena, lent = self.lend(dicts, job_id, in_shared=in_shared)
        if in_shared:
            self._shared[job_id] = dicts
        if lent:
            assert self._view is not None
            self._holds[job_id] = 1
            self._arenas[job_id] = self._view
        return packed, body, new_arena

    def released(self, job_ids: Sequence[int]) -> None:
        """The process no longer views these jobs' inputs."""
        for job_id in job_ids:
            self._shared.pop(job_id, None)
            self._let_go_of(job_id)

    def lease(self, job_id: int) -> Optional[np.ndarray]:
        """A uint8 array over the arena of `job_id`'s region, holding the region until it is gone (None: no region).

        A result's outputs that lie in the job's inputs are views of it; it counts as unchanging
        (raw_tensors.mark_leased): nothing writes there while it lives.
        """
        view = self._arenas.get(job_id)
        if view is None:
            return None
        lease = np.ndarray((len(view),), np.uint8, view)
        self._holds[job_id] += 1
        mark_leased(lease, functools.partial(self._let_go.append, job_id))
        return lease

    def _let_go_of(self, job_id: int) -> None:
        holds = self._holds.get(job_id)
        if holds is None:
            return  # a region of an arena since replaced
        if holds > 1:
            self._holds[job_id] = holds - 1
            return
        del self._holds[job_id], self._arenas[job_id]
        self.give_back(job_id)

    def close(self) -> None:
        """Release the arena; what still views it keeps it mapped, and nothing is written there again."""
        super().close()
        self._holds.clear()
        self._arenas.clear()
        self._shared.clear()


class InputViews:
    """The process's side: each job's inputs as views of the server's arena, and which jobs it no longer views.

    Inputs a frontend process read into its buffers are views of those (segments the server passed on), not of the
    arena: a job is free once every region it views, in the arena or in a buffer, is no longer viewed.
    """

    def __init__(self) -> None:
        """No arena until the first job that uses one."""
        self.reader = ArenaReader()
        # Appended by weak reference callbacks, whenever a region's last view goes: (job id, the region's id).
        self._released: Deque[Tuple[int, int]] = deque()
        self._watched: Dict[Tuple[int, int], Any] = {}
        self._viewed: Dict[int, int] = {}  # job id: its regions still viewed
        # Frontend buffers the server passed on, by id: memoryviews of their mappings (an array over a view of an
        # array would take that array as its base, and a region's views would not keep the region).
        self._segments: Dict[int, memoryview] = {}

    def adopt_segment(self, segment_id: int, fd: int, size: int) -> None:
        """Map a frontend process's buffer that jobs name inputs in (the descriptor is closed here)."""
        segment = SharedSegment.attach(fd, size)
        self._segments[segment_id] = segment.view()
        segment.close()

    def forget_segment(self, segment_id: int) -> None:
        """A buffer is gone: unmapped once no input views it."""
        self._segments.pop(segment_id, None)

    def unpack(self, job_id: int, packed: Sequence[Any], body: memoryview) -> Tuple[List[Any], Optional[np.ndarray]]:
        """A job's input dicts, and the array they all view (None when they view no region: copied, or in the body).

        Inputs that take at most COPY_BYTES of the arena are copied out: the server writes there again.
        """
        shared = functools.partial(self._shared, job_id) if self._segments else None
        if copied_out(packed):
            return self.reader.unpack(packed, body, copy=True, shared=shared), None
        view = self.reader.view
        if view is None:
            raise ValueError("inputs in an arena that never arrived")
        lease = np.ndarray((len(view),), np.uint8, view)
        self._watch(job_id, lease)
        return self.reader.unpack(packed, body, copy=False, arena=lease, shared=shared), lease

    def _shared(self, job_id: int, segment_id: int, offset: int, nbytes: int) -> np.ndarray:
        """A job's input region in a frontend buffer, watched as the arena's region is."""
        segment = self._segments.get(segment_id)
        if segment is None or offset < 0 or offset + nbytes > len(segment):
            raise ValueError(f"an input in shared memory segment {segment_id}, which is not mapped here")
        region = np.ndarray((nbytes,), np.uint8, segment[offset : offset + nbytes])
        self._watch(job_id, region)
        return region

    def _watch(self, job_id: int, region: np.ndarray) -> None:
        key = (job_id, id(region))
        self._viewed[job_id] = self._viewed.get(job_id, 0) + 1
        self._watched[key] = weakref.ref(region, functools.partial(_let_go, self._watched, self._released, key))

    def take_released(self) -> Tuple[int, ...]:
        """The jobs whose inputs nothing here views any more, since the last call."""
        released = self._released
        if not released:
            return ()
        taken = []
        viewed = self._viewed
        while released:
            job_id = released.popleft()[0]
            left = viewed[job_id] - 1
            if left:
                viewed[job_id] = left
            else:
                del viewed[job_id]
                taken.append(job_id)
        return tuple(taken)

    def close(self) -> None:
        """Unmap the arena and the buffers (arrays still viewing them keep them mapped)."""
        self.reader.close()
        self._segments.clear()


def _let_go(
    watched: Dict[Tuple[int, int], Any], released: Deque[Tuple[int, int]], key: Tuple[int, int], _: Any
) -> None:
    """A region's last view is gone (a weak reference's callback; it refers to no InputViews: no cycle)."""
    watched.pop(key, None)
    released.append(key)


def outputs_in_inputs(value: Any, lease: np.ndarray) -> Optional[Dict[int, int]]:
    """The arrays of a result that lie whole in the job's inputs (`lease`), by id, with their offset there.

    Only contiguous arrays over COPY_BYTES (smaller ones cost less copied). None when there is none.
    """
    if not isinstance(value, (list, tuple)):
        return None
    found: Optional[Dict[int, int]] = None
    address = -1
    for item in value:
        if type(item) is not dict:
            continue
        for array in item.values():
            if (
                type(array) is not np.ndarray
                or array.nbytes <= COPY_BYTES
                or not array.flags.c_contiguous
                or not _views(array, lease)
            ):
                continue
            if address < 0:
                address = lease.__array_interface__["data"][0]
            offset = array.__array_interface__["data"][0] - address
            if 0 <= offset and offset + array.nbytes <= lease.nbytes:
                if found is None:
                    found = {}
                found[id(array)] = offset
    return found


def _views(array: np.ndarray, lease: np.ndarray) -> bool:
    """Whether `array`'s chain of bases reaches `lease` (numpy makes a view's base the array that holds the memory)."""
    base: Any = array.base
    for _ in range(8):
        if base is lease:
            return True
        if isinstance(base, np.ndarray):
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return False
    return False
