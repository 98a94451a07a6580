"""The response cache: LRU within a byte budget, keyed by model, version and input bytes."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.request import InferenceResponse, OutputTensor
from pytriton.core.tensors.datatypes import datatype_of_dtype
from pytriton.core.tensors.raw_tensors import raw_from_array, serialize_bytes_tensor

# tritonserver's local cache (triton-inference-server/local_cache) packs a response into one block of a managed
# buffer of the configured size (core's cache_entry.cc: the output count, then per output its packed size, name,
# datatype, shape and bytes); a block takes a 16-byte header and is rounded up to 16 bytes, and the buffer keeps
# 128 bytes of its own from the start. Counted so, nv_cache_util and the responses that fit are 2.51's (measured
# with 1 KiB to 30 KiB responses in 30 KB and 100 KB caches).
_BLOCK_HEADER = 16
_BLOCK_ALIGN = 16
BUFFER_OWN_BYTES = 128


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


def entry_bytes(response: InferenceResponse) -> int:
    """The bytes a response takes in tritonserver's local cache (see above)."""
    packed = 4
    for output in response.outputs:
        array = output.array
        data = len(serialize_bytes_tensor(array)) if output.datatype == "BYTES" else array.nbytes
        packed += 28 + len(output.name.encode()) + len(output.datatype) + 8 * array.ndim + data
    return _BLOCK_HEADER + -(-packed // _BLOCK_ALIGN) * _BLOCK_ALIGN


class ResponseCache:
    """A least-recently-used cache of responses holding at most `capacity_bytes`.

    Each entry remembers its model, so that a model removed (a RemoteTriton closed) takes its responses
    with it: one bound later under the same name must not be answered with them. Each response is kept as a
    copy of its own (`_snapshot`).
    """

    def __init__(self, capacity_bytes: int) -> None:
        """Create an empty cache."""
        self.capacity_bytes = capacity_bytes
        self.used_bytes = BUFFER_OWN_BYTES
        self._entries: OrderedDict[bytes, Tuple[str, InferenceResponse, int]] = OrderedDict()
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
        size = entry_bytes(response)
        if size <= self.capacity_bytes:  # as the local cache: larger than the buffer is refused at once, and
            while self.used_bytes + size > self.capacity_bytes and self._entries:  # else it evicts until it fits
                _, (_, _, evicted_size) = self._entries.popitem(last=False)
                self.used_bytes -= evicted_size
                self.evictions += 1
            if self.used_bytes + size <= self.capacity_bytes:  # (or the cache is empty, and it fails)
                self._entries[key] = (model, _snapshot(response), size)
                self.used_bytes += size
        self.insertion_ns += time.monotonic_ns() - start
        return True

    def forget(self, model: str) -> None:
        """Drop every response of `model`."""
        for key in [key for key, (owner, _, _) in self._entries.items() if owner == model]:
            _, _, size = self._entries.pop(key)
            self.used_bytes -= size

    def clear(self) -> None:
        """Drop every response."""
        self._entries.clear()
        self.used_bytes = BUFFER_OWN_BYTES


def _snapshot(response: InferenceResponse) -> InferenceResponse:
    """A copy of a response whose arrays are its own and read-only, as tritonserver copies one into its cache.

    A callable's outputs may be arrays it writes again (a buffer it returns each time): kept as they were, a
    later hit answered what they held by then. The copy also gives an instance process's arena its regions back.
    """
    outputs = []
    for output in response.outputs:
        array = output.array.copy()
        array.flags.writeable = False
        outputs.append(OutputTensor(output.name, output.datatype, array))
    parameters = None if response.parameters is None else dict(response.parameters)
    return InferenceResponse(outputs, response.final, parameters)
