"""Shared-memory buffers a process hands out to be written in place, and the segments its peers mapped.

A frontend process reads a large request body straight into a buffer of its own that is a shared segment
(`OwnSegments.allocate`, the receive buffers' allocator there); a tensor of that body is then named to the hub
by segment and offset (`locate`), and the hub views it where it lies (`PeerSegments`): the kernel's copy into
the buffer is the only one. The segment's descriptor goes to the peer when the buffer is made, and the peer is
told to forget it when the buffer is gone.
"""

from __future__ import annotations

import bisect
import itertools
import os
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from pytriton.ipc.segments import SharedMemoryUnavailable, SharedSegment

# What a buffer made here becomes known as: (segment id, descriptor, size); the descriptor is the callee's.
Announce = Callable[[int, int, int], None]


class OwnSegments:
    """Buffers that are shared segments, each with an id, found again by the address of any array over them."""

    def __init__(self, announce: Announce, forget: Callable[[int], None]) -> None:
        """`announce(id, fd, size)` when a buffer is made (before it is used); `forget(id)` once it is gone."""
        self._announce = announce
        self._forget = forget
        self._ids = itertools.count(1)
        self._starts: List[int] = []  # sorted addresses of the mappings
        self._spans: Dict[int, Tuple[int, int]] = {}  # start: (end, id)
        self._buffers: Dict[int, weakref.ref[np.ndarray]] = {}

    def allocate(self, size: int) -> np.ndarray:
        """A new buffer of `size` bytes in a segment of its own (a heap buffer when no shared memory can be had)."""
        try:
            segment = SharedSegment.create(size)
        except SharedMemoryUnavailable:
            return np.empty(size, np.uint8)
        segment_id = next(self._ids)
        buffer = np.ndarray((size,), np.uint8, segment.view())
        start = buffer.__array_interface__["data"][0]
        self._announce(segment_id, os.dup(segment.fileno()), size)
        segment.close()  # the buffer keeps the mapping; the peer has its own descriptor
        bisect.insort(self._starts, start)
        self._spans[start] = (start + size, segment_id)
        self._buffers[segment_id] = weakref.ref(buffer)
        weakref.finalize(buffer, self._gone, start, segment_id)
        return buffer

    def region(self, segment_id: int, offset: int, nbytes: int) -> np.ndarray:
        """A view of `nbytes` of a buffer made here, from `offset` (the hub names outputs that lie in one).

        Raises:
            ValueError: the buffer is gone, or the range is not inside it.
        """
        ref = self._buffers.get(segment_id)
        buffer = ref() if ref is not None else None
        if buffer is None or offset < 0 or nbytes < 0 or offset + nbytes > len(buffer):
            raise ValueError(f"a tensor outside the buffers of this process (segment {segment_id})")
        return buffer[offset : offset + nbytes]

    def locate(self, array: np.ndarray) -> Optional[Tuple[int, int]]:
        """(segment id, offset) of a contiguous array that lies in one of the buffers, else None."""
        address = array.__array_interface__["data"][0]
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start = self._starts[index]
        end, segment_id = self._spans[start]
        if address + array.nbytes > end or not array.flags.c_contiguous:
            return None
        return segment_id, address - start

    def _gone(self, start: int, segment_id: int) -> None:
        """A buffer is gone (a finalizer: on whichever thread let go of it last)."""
        self._buffers.pop(segment_id, None)
        span = self._spans.get(start)
        if span is not None and span[1] == segment_id:  # not a newer buffer mapped at the same address
            del self._spans[start]
            self._starts.pop(bisect.bisect_left(self._starts, start))
        self._forget(segment_id)


class PeerSegments:
    """The segments a peer made and sent, mapped here by id."""

    def __init__(self) -> None:
        """None mapped yet."""
        self._arrays: Dict[int, np.ndarray] = {}
        self._starts: List[int] = []
        self._spans: Dict[int, Tuple[int, int]] = {}  # start: (end, id)

    def adopt(self, segment_id: int, fd: int, size: int) -> None:
        """Map a segment the peer sent (the descriptor is closed here; the mapping stays while arrays view it)."""
        segment = SharedSegment.attach(fd, size)
        array = np.ndarray((size,), np.uint8, segment.view())
        segment.close()
        self.forget(segment_id)
        self._arrays[segment_id] = array
        start = array.__array_interface__["data"][0]
        bisect.insort(self._starts, start)
        self._spans[start] = (start + size, segment_id)

    def region(self, segment_id: int, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 array over `nbytes` of a segment from `offset`, whose views keep it as their base.

        Raises:
            ValueError: no such segment, or the range is not inside it.
        """
        array = self._arrays.get(segment_id)
        if array is None:
            raise ValueError(f"a tensor in shared memory segment {segment_id}, which was never sent")
        if offset < 0 or nbytes < 0 or offset + nbytes > len(array):
            raise ValueError(f"a tensor outside shared memory segment {segment_id}")
        return np.ndarray((nbytes,), np.uint8, array.data[offset : offset + nbytes])

    def locate(self, array: np.ndarray) -> Optional[Tuple[int, int]]:
        """(segment id, offset) of a contiguous array that lies in one of the peer's segments, else None."""
        address = array.__array_interface__["data"][0]
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start = self._starts[index]
        end, segment_id = self._spans[start]
        if address + array.nbytes > end or not array.flags.c_contiguous:
            return None
        return segment_id, address - start

    def forget(self, segment_id: int) -> None:
        """The peer let go of a segment: unmapped once nothing here views it."""
        array = self._arrays.pop(segment_id, None)
        if array is None:
            return
        start = array.__array_interface__["data"][0]
        if self._spans.get(start, (0, -1))[1] == segment_id:
            del self._spans[start]
            self._starts.pop(bisect.bisect_left(self._starts, start))

    def close(self) -> None:
        """Forget every segment."""
        for segment_id in list(self._arrays):
            self.forget(segment_id)
