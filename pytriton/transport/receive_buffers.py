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
room for new ones); other sizes get buffers of their own, freed as usual.
"""

from __future__ import annotations

import sys
import threading
from typing import List

import numpy as np

MIN_BYTES = 64 * 1024
MAX_BYTES = 8 * 2**20
KEPT_BYTES = 32 * 2**20
# Capacities are whole multiples of this; a buffer serves sizes down to 4/5 of its capacity.
_GRAIN = 64 * 1024


def _references(arrays: List[np.ndarray], index: int) -> int:
    """The reference count of `arrays[index]` as seen from here (compared with `_FREE`, measured the same way)."""
    return sys.getrefcount(arrays[index])


# What `_references` counts for an array nothing but its list refers to.
_FREE = _references([np.empty(1, np.uint8)], 0)


class ReceiveBuffers:
    """A bounded set of uninitialised byte buffers, handed out again once unreferenced (module docstring)."""

    def __init__(self, kept_bytes: int = KEPT_BYTES, max_bytes: int = MAX_BYTES) -> None:
        """Keep buffers of up to `max_bytes`, `kept_bytes` of them in all."""
        self._kept_limit = kept_bytes
        self._max_bytes = max_bytes
        self._arrays: List[np.ndarray] = []  # oldest first
        self._capacities: List[int] = []
        self._kept = 0
        self._lock = threading.Lock()  # servers of several loops may share the buffers

    def take(self, size: int) -> memoryview:
        """A writable buffer of `size` bytes, its contents undefined."""
        if not MIN_BYTES <= size <= self._max_bytes:
            return np.empty(size, np.uint8).data
        with self._lock:
            arrays, capacities = self._arrays, self._capacities
            for index, capacity in enumerate(capacities):
                if size <= capacity <= size + size // 4 + _GRAIN and _references(arrays, index) == _FREE:
                    return arrays[index].data[:size]
            capacity = -(-size // _GRAIN) * _GRAIN
            array = np.empty(capacity, np.uint8)
            if self._kept + capacity > self._kept_limit:
                self._make_room(capacity)
            if self._kept + capacity <= self._kept_limit:
                arrays.append(array)
                capacities.append(capacity)
                self._kept += capacity
            return array.data[:size]

    def _make_room(self, capacity: int) -> None:
        """Let go of free buffers, oldest first, until `capacity` more bytes fit (or none is free)."""
        arrays, capacities = self._arrays, self._capacities
        index = 0
        while index < len(arrays) and self._kept + capacity > self._kept_limit:
            if _references(arrays, index) == _FREE:
                self._kept -= capacities.pop(index)
                del arrays[index]
            else:
                index += 1

    @property
    def kept_bytes(self) -> int:
        """The capacity of the buffers kept, in use or free."""
        return self._kept


# The process's buffers: the HTTP and gRPC servers take theirs here.
RECEIVE_BUFFERS = ReceiveBuffers()
