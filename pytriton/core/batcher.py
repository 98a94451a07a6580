"""Triton's dynamic batcher rules: which queued requests run together, and when."""

from __future__ import annotations

from typing import List, Optional, Tuple

from pytriton.core.queues import Entry, PriorityQueues
from pytriton.core.request import ShapeKey
from pytriton.core.spec import ModelSpec


class BatchRules:
    """How one model's queued requests form batches.

    A batch starts when it reaches max_batch_size, when the next request would not fit or has other
    non-batch dims, when the largest possible preferred size is reached, or when its oldest request
    has waited max_queue_delay_microseconds. A model without a dynamic batcher (`ModelConfig(batcher=None)`:
    no `dynamic_batching`, Triton's default scheduler) runs each request alone, as a model that does not batch.
    """

    def __init__(self, spec: ModelSpec) -> None:
        """The rules of a model's batcher config."""
        self._spec = spec
        batcher = spec.batcher
        self.delay_ns = (batcher.max_queue_delay_microseconds * 1000) if batcher else 0
        preferred = (batcher.preferred_batch_size if batcher else None) or []
        self._preferred = frozenset(size for size in preferred if 0 < size <= spec.max_batch_size)
        self._one_at_a_time = not spec.batching or batcher is None

    def take_batch(self, queues: PriorityQueues, now_ns: int) -> Tuple[List[Entry], Optional[int]]:
        """Take the batch to run now out of `queues`, or take none and say when to look again.

        Requests whose caller has gone are dropped from the queue on the way.
        """
        spec = self._spec
        taken: List[Entry] = []
        dead: List[Entry] = []
        size = 0
        preferred_cut = 0
        full = False
        shape_key: Optional[ShapeKey] = None
        for entry in queues:
            if entry.sink.done():
                dead.append(entry)
                continue
            if self._one_at_a_time:
                taken.append(entry)
                full = True
                break
            rows = entry.request.batch_size
            key = entry.request.shape_key
            if taken and (size + rows > spec.max_batch_size or key != shape_key):
                full = True
                break
            taken.append(entry)
            shape_key = key
            size += rows
            if size in self._preferred:
                preferred_cut = len(taken)
            if size >= spec.max_batch_size:
                full = True
                break
        if dead:
            queues.take(dead)
        if not taken:
            return [], None
        if not full:
            taken, due = short_batch(taken, preferred_cut, self.delay_ns, now_ns)
            if due is not None:
                return [], due
        queues.take(taken)
        return taken, None


def short_batch(
    taken: List[Entry], preferred_cut: int, delay_ns: int, now_ns: int
) -> Tuple[List[Entry], Optional[int]]:
    """The batch to run of one short of full, or when to look again (the dynamic and sequence batchers' rule).

    Cut at the last preferred size it reached, else run it once its oldest request has waited `delay_ns`.
    """
    if preferred_cut:
        return taken[:preferred_cut], None
    due = min(entry.enqueue_ns for entry in taken) + delay_ns
    return (taken, None) if now_ns >= due else ([], due)
