"""The shared memory of a process instance's calls to other models (core/process_instances/model_calls.py)."""

from __future__ import annotations

import gc
import os
from typing import Any, List

import numpy as np

from pytriton.core.composition.path import CallArguments
from pytriton.core.process_instances.model_calls import CalleeArenas, CallerArenas
from pytriton.ipc.channel import Message
from pytriton.ipc.regions import COPY_BYTES, LendingArena
from pytriton.ipc.tensors import IN_ARENA, IN_BODY


def _refs(packed: List[Any]) -> List[Any]:
    return list(packed[0][0].values())


def test_messages_that_cross_never_share_the_arenas_start_and_small_ones_go_in_the_body() -> None:
    arena = LendingArena(64 << 20)
    small = {"x": np.ones(COPY_BYTES // 4, np.float32)}  # 64 KiB: the body
    large = {"x": np.ones(COPY_BYTES // 4 + 1, np.float32)}
    packed, body, new_arena, lent = arena.lend_apart([small], 1)
    assert (new_arena, lent, len(body)) == (0, False, 1) and _refs(packed)[0][0] == IN_BODY
    first, _, new_arena, lent = arena.lend_apart([large], 2)
    second, _, again, lent_too = arena.lend_apart([large], 3)
    assert new_arena and lent and not again and lent_too
    (where, start, nbytes, *_), (_, other, _, *_) = _refs(first)[0], _refs(second)[0]
    assert where == IN_ARENA and start >= COPY_BYTES and other >= start + nbytes  # apart, past the start
    arena.give_back(2)
    assert _refs(arena.lend_apart([large], 4)[0])[0][1] == start  # its region again
    arena.close()


def test_a_calls_inputs_and_its_answers_outputs_are_read_in_place_and_their_regions_come_back() -> None:
    caller, callee = CallerArenas(64 << 20), CalleeArenas(64 << 20)
    sent = np.arange(1 << 18, dtype=np.float32).reshape(1, -1)  # 1 MiB
    arguments = CallArguments("identity", {"x": sent}, None, None, None, None, False)
    packed, body, new_arena, fds = caller.pack_call(7, arguments)
    head = (17, 1, 7, packed, new_arena, ())
    passed = [os.dup(fd) for fd in fds]  # as the channel passes them: the receiver's own descriptors
    received, lease = callee.arguments(head, Message(head, memoryview(b"".join(body)), passed))
    assert received.name == "identity" and np.array_equal(received.inputs["x"], sent)
    assert not received.inputs["x"].flags.owndata and lease is not None

    # An identity's answer: its output lies in the call's inputs, named there, not copied; the process's region
    # stays held while the process views it, after the server let go.
    outputs, parts, arena_size, key, answer_fds = callee.pack_answer({"y": received.inputs["x"]}, lease)
    assert (arena_size, key, answer_fds, parts) == (0, 0, [], [])
    answer = (8, 7, "response", outputs, 0, 0, ())
    echoed = caller.answer(answer, Message(answer, memoryview(b""), []), wanted=True)
    assert echoed is not None and np.array_equal(echoed["y"], sent)
    assert callee.take_read() == ()
    del received, lease, outputs
    gc.collect()
    assert callee.take_read() == (7,)  # the inner request let go of its inputs
    caller.calls_read((7,))
    held_by = {"x": np.zeros_like(sent)}
    again = caller.pack_call(8, arguments._replace(inputs=held_by))[0][1]
    assert again[0][0]["x"][1] != packed[1][0][0]["x"][1]  # the echo still views call 7's region: not written over
    del echoed
    gc.collect()
    caller.calls_read((8,))
    ninth = caller.pack_call(9, arguments)[0][1]  # both regions are free again: call 9 takes the lowest, call 7's
    assert ninth[0][0]["x"][1] == packed[1][0][0]["x"][1] and caller._holds == {9: 1}

    outputs, parts, arena_size, key, answer_fds = callee.pack_answer({"y": sent * 2})
    assert key and arena_size and len(answer_fds) == 1
    answer = (8, 7, "response", outputs, arena_size, key, (7,))
    got = caller.answer(answer, Message(answer, memoryview(b"".join(parts)), answer_fds), wanted=True)
    assert got is not None and np.array_equal(got["y"], sent * 2) and not got["y"].flags.owndata
    assert caller.take_answers_read() == ()
    del got
    gc.collect()
    assert caller.take_answers_read() == (key,)
    callee.answers_read((key,))

    # An answer to a call nobody waits for any more gives its region back at once.
    outputs, parts, arena_size, key, answer_fds = callee.pack_answer({"y": sent})
    dropped = (8, 7, "response", outputs, arena_size, key, ())
    assert caller.answer(dropped, Message(dropped, memoryview(b"".join(parts)), answer_fds), wanted=False) is None
    assert caller.take_answers_read() == (key,)
    caller.close()
    callee.close()
