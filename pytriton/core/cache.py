"""The response cache: LRU within a byte budget, keyed by model, version and input bytes."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.datatypes import datatype_of_dtype
from pytriton.core.raw_tensors import raw_from_array
from pytriton.core.request import InferenceResponse


def cache_key(
    model: str, version: str, inputs: Dict[str, np.ndarray], requested_outputs: Optional[Sequence[str]] = None
) -> bytes:
    """Hash of model name, version, each input (sorted by name: name, dtype, shape, bytes) and the outputs asked for.

    tritonserver 2.51 hashes the names and bytes only: a request of other shapes got the cached outputs in the
    first request's shapes, and one asking for other outputs got the first request's outputs (those it asked
    for); here each gets its own answer (docs/migration.md).
    """
    digest = hashlib.blake2b(digest_size=32)
    digest.update(f"{model}\0{version}\0".encode())
    if requested_outputs is not None:
        digest.update(("\1" + "\0".join(requested_outputs) + "\1").encode())
    for name in sorted(inputs):
        array = inputs[name]
        datatype = datatype_of_dtype(array.dtype) or array.dtype.str
        digest.update(f"{name}\0{datatype}\0{array.shape}\0".encode())
        digest.update(raw_from_array(array, datatype))
    return digest.digest()


class ResponseCache:
    """A least-recently-used cache of responses holding at most `capacity_bytes`.

    Each entry remembers its model, so that a model removed (a RemoteTriton closed) takes its responses
    with it: one bound later under the same name must not be answered with them. The responses may view
    an instance process's shared memory; the server's stop drops them all (`clear`).
    """

    def __init__(self, capacity_bytes: int) -> None:
        """Create an empty cache."""
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[bytes, Tuple[str, InferenceResponse]] = OrderedDict()
        # Triton's server-wide cache metrics (nv_cache_*): lookups that found a response or not, responses
        # evicted to make room, and the time spent looking up and inserting.
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insertion_ns = 0

    @property
    def entries(self) -> int:
        """How many responses the cache holds."""
        return len(self._entries)

    def get(self, key: bytes) -> Optional[InferenceResponse]:
        """The cached response for a key, marked as recently used."""
        start = time.monotonic_ns()
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
            self._entries.move_to_end(key)
        self.lookup_ns += time.monotonic_ns() - start
        return None if entry is None else entry[1]

    def put(self, key: bytes, response: InferenceResponse, model: str) -> bool:
        """Store a response of `model`, evicting the least recently used ones to stay within capacity.

        False when the key has a response already (kept: the local cache's ALREADY_EXISTS); True otherwise,
        a response too large for the whole cache included (not stored: an insert that failed).
        """
        start = time.monotonic_ns()
        if key in self._entries:
            self.insertion_ns += time.monotonic_ns() - start
            return False
        size = response.nbytes() + len(key)
        if size <= self.capacity_bytes:
            while self.used_bytes + size > self.capacity_bytes and self._entries:
                evicted_key, (_, evicted) = self._entries.popitem(last=False)
                self.used_bytes -= evicted.nbytes() + len(evicted_key)
                self.evictions += 1
            self._entries[key] = (model, response)
            self.used_bytes += size
        self.insertion_ns += time.monotonic_ns() - start
        return True

    def forget(self, model: str) -> None:
        """Drop every response of `model`."""
        for key in [key for key, (owner, _) in self._entries.items() if owner == model]:
            _, response = self._entries.pop(key)
            self.used_bytes -= response.nbytes() + len(key)

    def clear(self) -> None:
        """Drop every response."""
        self._entries.clear()
        self.used_bytes = 0
