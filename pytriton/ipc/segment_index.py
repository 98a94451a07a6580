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


class _Spans:
    """Mappings by address: which one an array lies in (a sorted list of starts, bisected)."""

    def __init__(self) -> None:
        self._starts: List[int] = []
        self._spans: Dict[int, Tuple[int, int]] = {}  # start: (end, id)

    def add(self, start: int, size: int, segment_id: int) -> None:
        bisect.insort(self._starts, start)
        self._spans[start] = (start + size, segment_id)

    def remove(self, start: int, segment_id: int) -> None:
        """Forget a mapping (unless a newer one took its address meanwhile)."""
        if self._spans.get(start, (0, -1))[1] == segment_id:
            del self._spans[start]
            self._starts.pop(bisect.bisect_left(self._starts, start))

    def locate(self, array: np.ndarray) -> Optional[Tuple[int, int]]:
        """(segment id, offset) of a contiguous array that lies in one of the mappings, else None."""
        address = array.__array_interface__["data"][0]
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start = self._starts[index]
        end, segment_id = self._spans[start]
        if address + array.nbytes > end or not array.flags.c_contiguous:
            return None
        return segment_id, address - start


class OwnSegments:
    """Buffers that are shared segments, each with an id, found again by the address of any array over them."""

    def __init__(self, announce: Announce, forget: Callable[[int], None]) -> None:
        """`announce(id, fd, size)` when a buffer is made (before it is used); `forget(id)` once it is gone."""
        self._announce = announce
        self._forget = forget
        self._ids = itertools.count(1)
        self._spans = _Spans()
        self._buffers: Dict[int, weakref.ref[np.ndarray]] = {}

    def allocate(self, size: int) -> np.ndarray:
        """A new buffer of `size` bytes in a segment of its own (a heap buffer when no shared memory can be had).

        Its pages are taken as its bytes arrive (`SharedSegment.create`'s `lazy`): the size is the one a client
        declared, and a client that declares much and sends little must cost the server little.
        """
        try:
            segment = SharedSegment.create(size, lazy=True)
        except SharedMemoryUnavailable:
            return np.empty(size, np.uint8)
        try:
            fd = os.dup(segment.fileno())  # the peer's
        except OSError:  # out of descriptors
            segment.close()
            return np.empty(size, np.uint8)
        segment_id = next(self._ids)
        buffer = np.ndarray((size,), np.uint8, segment.view())
        start = buffer.__array_interface__["data"][0]
        self._announce(segment_id, fd, size)
        segment.close()  # the buffer keeps the mapping; the peer has its own descriptor
        self._spans.add(start, size, segment_id)
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
        return self._spans.locate(array)

    def refused(self, segment_id: int) -> None:
        """The peer could not map that buffer: arrays in it are located nowhere from now on (they are copied)."""
        ref = self._buffers.get(segment_id)
        buffer = ref() if ref is not None else None
        if buffer is not None:
            self._spans.remove(buffer.__array_interface__["data"][0], segment_id)

    def _gone(self, start: int, segment_id: int) -> None:
        """A buffer is gone (a finalizer: on whichever thread let go of it last)."""
        self._buffers.pop(segment_id, None)
        self._spans.remove(start, segment_id)
        self._forget(segment_id)


class SharedSegments:
    """The segments other processes made and sent, mapped here under ids of this process's own.

    The hub maps every frontend's receive buffers here; it keeps each one's descriptor, to pass it on to the
    instance processes that read a tensor of it in place, and tells those it passed it to when it is gone
    (`watch`).
    """

    def __init__(self) -> None:
        """None mapped yet."""
        self._ids = itertools.count(1)
        # id: (the whole segment's bytes, its descriptor). A memoryview of the mapping, not an array: numpy makes the
        # base of an array over a view of an array that array, and a region's views would not keep the region.
        self._segments: Dict[int, Tuple[memoryview, int]] = {}
        self._spans = _Spans()
        self._watchers: List[Callable[[int], None]] = []

    def __len__(self) -> int:
        return len(self._segments)

    def adopt(self, fd: int, size: int) -> int:
        """Map a segment another process sent (its descriptor is kept here); its id."""
        segment = SharedSegment.attach(os.dup(fd), size)
        view = segment.view()
        segment.close()
        segment_id = next(self._ids)
        self._segments[segment_id] = (view, fd)
        self._spans.add(np.frombuffer(view, np.uint8, 0).__array_interface__["data"][0], size, segment_id)
        return segment_id

    def region(self, segment_id: int, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 array over `nbytes` of a segment from `offset`, whose views keep it as their base.

        Raises:
            ValueError: no such segment, or the range is not inside it.
        """
        found = self._segments.get(segment_id)
        if found is None:
            raise ValueError(f"a tensor in shared memory segment {segment_id}, which was never sent")
        view = found[0]
        if offset < 0 or nbytes < 0 or offset + nbytes > len(view):
            raise ValueError(f"a tensor outside shared memory segment {segment_id}")
        return np.ndarray((nbytes,), np.uint8, view[offset : offset + nbytes])

    def locate(self, array: np.ndarray) -> Optional[Tuple[int, int]]:
        """(segment id, offset) of a contiguous array that lies in one of the segments, else None."""
        return self._spans.locate(array)

    def descriptor(self, segment_id: int) -> Tuple[int, int]:
        """(descriptor, size) of a segment, to send to another process (it stays this registry's)."""
        view, fd = self._segments[segment_id]
        return fd, len(view)

    def watch(self, forgotten: Callable[[int], None]) -> None:
        """Call `forgotten(id)` for each segment forgotten from now on."""
        self._watchers.append(forgotten)

    def unwatch(self, forgotten: Callable[[int], None]) -> None:
        """Stop calling `forgotten`."""
        if forgotten in self._watchers:
            self._watchers.remove(forgotten)

    def forget(self, segment_id: int) -> None:
        """Its maker let go of a segment: unmapped once nothing here views it; watchers are told."""
        found = self._segments.pop(segment_id, None)
        if found is None:
            return
        view, fd = found
        os.close(fd)
        self._spans.remove(np.frombuffer(view, np.uint8, 0).__array_interface__["data"][0], segment_id)
        for forgotten in list(self._watchers):
            forgotten(segment_id)


# The hub's: every frontend's buffers, which its links and its process instances share.
SHARED_SEGMENTS = SharedSegments()
