"""Regions of an arena lent out until given back: first fit, low addresses first.

An instance process lends regions of its arena to the server, one per result (core/result_arena.py): the
server still sends a result's responses when the next batch has run. Regions come back in any order
(responses finish in any order), so this is a first fit over the few regions out, not a ring: a ring that
wrapped to its start while room was left after its oldest region saw no room there, grew its arena to the
budget (each time a fresh segment, its pages reserved and faulted again) and then sent results through the
socket.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple


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
        """Lend `needed` bytes to `key` (which has none yet): the lowest offset with room, or None."""
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
