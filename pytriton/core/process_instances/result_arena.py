"""Results that leave an instance process without a copy in the server: regions of the instance's arena, lent.

The server reads a result's arrays until its responses are encoded, which can be after the process has
started, and answered, its next job. So each result's region of the process's arena is lent to the server:
the server's arrays are views of it, and when the last of them is gone (a weak reference's callback on the
one array they all view) the server names the job in its next JOB message and the process may write there
again. Regions come back in any order and are taken first fit (ipc/regions.py); a result that finds
no room (the server still holds earlier ones) grows the arena within the budget,
or travels in the message body. A result of at most COPY_BYTES is copied out by the server at once and lent
to no one; outputs that lie in the job's inputs are not in the result region at all (input_arena.py).

Copying a 1 MiB result out of the arena in the server cost a copy and fresh pages for every response.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from pytriton.core.process_instances.protocol import result_items, result_value
from pytriton.core.tensors.raw_tensors import Buffer, mark_leased
from pytriton.ipc.regions import COPY_BYTES, LendingArena
from pytriton.ipc.tensors import IN_ARENA, IN_INPUTS, ArenaReader


class ResultArena(LendingArena):
    """The instance process's side: regions of its arena lent to the server, one per job, given back in any order."""

    def pack_result(
        self, value: Any, job_id: int, in_inputs: Optional[Dict[int, int]] = None
    ) -> Tuple[Any, List[Buffer], int]:
        """Pack a call's result (as `protocol.pack_result`), its arrays in a region lent for `job_id`.

        Arrays named in `in_inputs` (by id, with their offset) lie in the job's inputs: named, not copied.
        """
        items = result_items(value)
        if items is None:
            return (None, value), [], 0
        packed, body, new_arena, _ = self.lend(items[1], job_id, in_inputs)
        return (items[0], packed), body, new_arena


def lease_result(
    reader: ArenaReader,
    packed: Any,
    body: memoryview,
    release: Callable[[], None],
    inputs: Optional[Callable[[], Optional[np.ndarray]]] = None,
) -> Any:
    """A result whose arena arrays are views leased from the process; `release` is called once they are all gone.

    A small result (ipc/regions.copied_out) is copied out instead, and `release` is not called: the process
    lent no region for it. Arrays that lie in the job's inputs are views of what `inputs()` returns (the server's
    lease of that region, core/process_instances/input_arena.py).
    """
    as_tuple, items = packed
    if as_tuple is None:
        return items
    copied, in_inputs = _layout(items)
    input_lease = inputs() if in_inputs and inputs is not None else None
    view = reader.view
    if view is None or copied:
        return result_value(as_tuple, reader.unpack(items, body, copy=True, inputs=input_lease))
    lease = np.ndarray((len(view),), np.uint8, view)  # every array of the result is a view of this one
    # The responses may send its views as they are: the process writes there only after `release`.
    mark_leased(lease, release)
    rebuilt = reader.unpack(items, body, copy=False, arena=lease, inputs=input_lease)
    return result_value(as_tuple, rebuilt)


def _layout(items: List[Any]) -> Tuple[bool, bool]:
    """Whether a packed result's arrays in the arena are copied out, and whether any lies in the job's inputs.

    Copied out: they lie in the arena's first COPY_BYTES (ipc/regions.copied_out).
    """
    first = -1
    in_inputs = False
    for item in items:
        if len(item) == 3:
            for ref in item[0].values():
                if ref[0] == IN_ARENA:
                    if first < 0:
                        first = ref[1]
                elif ref[0] == IN_INPUTS:
                    in_inputs = True
    return first < COPY_BYTES, in_inputs
