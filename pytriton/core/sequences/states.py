"""The state a callable keeps per sequence: one dict per live sequence, in the process that runs its instance."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List

from pytriton.proxy.types import Request


class SequenceStates:
    """Each live sequence's `request.sequence_state` dict, by the sequence's serial (its run, not its id).

    A START request gets a new, empty dict; the END request still sees its dict, which the store forgets at
    once (nothing of the sequence runs after it). Sequences the batcher released when idle are forgotten
    when it says so (`forget`). One store per instance: a sequence's requests all run on the instance
    holding its slot.
    """

    def __init__(self) -> None:
        """An empty store."""
        self._states: Dict[int, Dict[str, Any]] = {}

    def __len__(self) -> int:
        """How many sequences have state here."""
        return len(self._states)

    def forget(self, serials: Iterable[int]) -> None:
        """Drop the state of sequences that ended without an END request run here (idle, cancelled)."""
        for serial in serials:
            self._states.pop(serial, None)

    def attach(self, requests: List[Request]) -> None:
        """Give each request of a sequence its sequence's state dict (requests of no sequence get None)."""
        states = self._states
        for request in requests:
            serial = request.sequence_serial
            if not serial:
                continue
            state = None if request.sequence_start else states.get(serial)
            if state is None:
                state = {}
            if request.sequence_end:
                states.pop(serial, None)
            else:
                states[serial] = state
            request.sequence_state = state
