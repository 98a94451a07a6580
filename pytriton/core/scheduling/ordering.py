"""Triton's preserve_ordering with several instances: responses leave in the order their requests left the queue.

Each request of a batch reserves a slot when the batch starts; its outcome (a response or an error) settles
the slot, and every settled slot at the head of the line is released. A batch that finishes early on one
instance waits for the batches that left the queue before it.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable, Deque, List, Optional

Slot = List[Optional[Callable[[], None]]]


class ReleaseOrder:
    """The line of reserved slots, oldest first."""

    def __init__(self) -> None:
        """An empty line."""
        self._line: Deque[Slot] = deque()

    def reserve(self, count: int) -> List[Slot]:
        """A slot for each request of a batch that starts now."""
        slots: List[Slot] = [[None] for _ in range(count)]
        self._line.extend(slots)
        return slots

    def settle(self, slot: Slot, action: Callable[..., None], *args: Any) -> None:
        """Run `action(*args)` once every earlier slot's action has run (at once if none waits)."""
        slot[0] = functools.partial(action, *args)
        line = self._line
        while line and line[0][0] is not None:
            line.popleft()[0]()  # type: ignore[misc]
