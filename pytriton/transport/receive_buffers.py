"""Buffers for large request bodies and gRPC messages, reused once nothing refers to them any more.

Why: the pages of a fresh buffer are mapped, and zeroed, by the kernel as its first bytes land: 256
page faults per MiB. Under 1 MiB gRPC requests they were a sixth of the server's CPU (about 110 µs of
670 µs per round trip), and glibc's heap trimming made them vary from run to run between 40 and 110
faults per request. A buffer whose pages are mapped already costs none of that.

When a buffer is free: whatever can still read or write it (the request's tensors, response parts sent
as views of it, an input a model kept, a write the transport has queued) holds a reference to its array,
numpy views through `.base` and memoryviews through their exporter. Once the array's reference count is
back to the pool's own, nothing can reach its memory: the test numpy's `ndarray.resize(refcheck=True)`
makes before it moves memory.

Bounds: buffers of MIN_BYTES to MAX_BYTES are kept, KEPT_BYTES in all (the free ones oldest first make
room for new ones); other sizes get buffers of their own, freed as usual. A take looks at a few buffers of
each fitting capacity (PROBES), not at all of them.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import Callable, Deque, Dict, Set

import numpy as np

MIN_BYTES = 64 * 1024
MAX_BYTES = 8 * 2**20
KEPT_BYTES = 32 * 2**20
# Capacities are whole multiples of this; a buffer serves sizes down to 4/5 of its capacity.
_GRAIN = 64 * 1024
# Buffers of one capacity looked at per take before a new one is made. Looked at in the order they were
# handed out, so the first is the one handed out longest ago, the likeliest to be free: a full scan of every
# buffer in use cost 16 % of the server's CPU with 256 requests of 150 KiB in flight (a scan that fails
# every time once they are all in use).
PROBES = 4

Bucket = Deque[np.ndarray]


def _first_references(bucket: Bucket) -> int:
    """The reference count of `bucket[0]` as seen from here (compared with `_FREE`, measured the same way)."""
    return sys.getrefcount(bucket[0])


# What `_first_references` counts for an array nothing but its bucket refers to.
_FREE = _first_references(deque([np.empty(1, np.uint8)]))


class ReceiveBuffers:
    """A bounded set of uninitialised byte buffers, handed out again once unreferenced (module docstring)."""

    def __init__(self, kept_bytes: int = KEPT_BYTES, max_bytes: int = MAX_BYTES) -> None:
        """Keep buffers of up to `max_bytes`, `kept_bytes` of them in all."""
        self._kept_limit = kept_bytes
        self._max_bytes = max_bytes
        # By capacity, each in the order its buffers were last handed out (or made): oldest first.
        self._buckets: Dict[int, Bucket] = {}
        self._kept = 0
        self._lock = threading.Lock()  # servers of several loops may share the buffers
        # Makes each buffer: the heap, or, in a frontend process, shared memory the hub reads in place.
        self.allocate: Callable[[int], np.ndarray] = _heap

    def take(self, size: int) -> memoryview:
        """A writable buffer of `size` bytes, its contents undefined."""
        if size < MIN_BYTES:
            return np.empty(size, np.uint8).data
        if size > self._max_bytes:
            return self.allocate(size).data
        capacity = -(-size // _GRAIN) * _GRAIN
        with self._lock:
            buckets = self._buckets
            largest = size + size // 4 + _GRAIN
            for fitting in range(capacity, largest + 1, _GRAIN):
                bucket = buckets.get(fitting)
                if bucket is None:
                    continue
                for _ in range(min(PROBES, len(bucket))):
                    free = _first_references(bucket) == _FREE
                    bucket.rotate(-1)  # handed out now, or still in use: looked at last next time
                    if free:
                        return bucket[-1].data[:size]
            array = self.allocate(capacity)
            if self._kept + capacity > self._kept_limit:
                self._make_room(capacity)
            if self._kept + capacity <= self._kept_limit:
                buckets.setdefault(capacity, deque()).append(array)
                self._kept += capacity
            return array.data[:size]

    def _make_room(self, capacity: int) -> None:
        """Let go of free buffers, those handed out longest ago first, until `capacity` more bytes fit."""
        for size, bucket in list(self._buckets.items()):
            probes = PROBES
            while bucket and probes and self._kept + capacity > self._kept_limit:
                if _first_references(bucket) == _FREE:
                    bucket.popleft()
                    self._kept -= size
                else:
                    bucket.rotate(-1)
                    probes -= 1
            if not bucket:
                del self._buckets[size]
            if self._kept + capacity <= self._kept_limit:
                return

    def in_use(self) -> Set[int]:
        """The ids of the kept buffers something still refers to."""
        used: Set[int] = set()
        with self._lock:
            for bucket in self._buckets.values():
                for _ in range(len(bucket)):  # a whole turn leaves the bucket as it was
                    if _first_references(bucket) != _FREE:
                        used.add(id(bucket[0]))
                    bucket.rotate(-1)
        return used

    @property
    def kept_bytes(self) -> int:
        """The capacity of the buffers kept, in use or free."""
        return self._kept


def _heap(size: int) -> np.ndarray:
    """A buffer of the process's own memory."""
    return np.empty(size, np.uint8)


# The process's buffers: the HTTP and gRPC servers take theirs here.
RECEIVE_BUFFERS = ReceiveBuffers()
