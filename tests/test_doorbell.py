"""Doorbells and loop inboxes: every posted call runs on the loop, in order, and nothing is left open."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any, Dict, List

import pytest

from pytriton.core.doorbell import Doorbell, inbox_of
from pytriton.runtime.loop_thread import new_event_loop


def test_calls_posted_from_many_threads_all_run_on_the_loop_in_each_threads_order() -> None:
    threads, posts = 4, 2000

    async def main() -> Dict[int, List[int]]:
        loop = asyncio.get_running_loop()
        inbox = inbox_of(loop)
        assert inbox_of(loop) is inbox
        seen: Dict[int, List[int]] = {sender: [] for sender in range(threads)}
        all_in = loop.create_future()
        loop_thread = threading.get_ident()
        count = [0]

        def record(sender: int, value: int) -> None:
            assert threading.get_ident() == loop_thread
            seen[sender].append(value)
            count[0] += 1
            if count[0] == threads * posts:
                all_in.set_result(None)

        def send(sender: int) -> None:
            for value in range(posts):
                inbox.post(record, sender, value)

        senders = [threading.Thread(target=send, args=(sender,)) for sender in range(threads)]
        for sender in senders:
            sender.start()
        await asyncio.wait_for(all_in, 10)
        for sender in senders:
            sender.join()
        return seen

    seen = asyncio.run(main())
    assert all(values == list(range(posts)) for values in seen.values())


def test_a_call_that_raises_is_reported_and_the_next_ones_still_run() -> None:
    reported: List[Dict[str, Any]] = []

    async def main() -> List[str]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        ran: List[str] = []
        done = loop.create_future()

        def fail() -> None:
            raise ValueError("broken callback")

        def post_all() -> None:
            inbox = inbox_of(loop)
            inbox.post(ran.append, "before")
            inbox.post(fail)
            inbox.post(ran.append, "after")
            inbox.post(done.set_result, None)

        await loop.run_in_executor(None, post_all)
        await asyncio.wait_for(done, 5)
        return ran

    assert asyncio.run(main()) == ["before", "after"]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)


def test_posting_to_a_closed_loop_raises_and_the_inbox_goes_with_its_loop() -> None:
    loop = new_event_loop()
    inbox = loop.run_until_complete(_inbox_of_running_loop())
    loop.close()
    with pytest.raises(RuntimeError):
        inbox.post(print, "never")
    inbox_ref = weakref.ref(inbox)
    del inbox, loop
    gc.collect()
    assert inbox_ref() is None, "the inbox (and its pipe) outlived its loop"


async def _inbox_of_running_loop() -> Any:
    return inbox_of(asyncio.get_running_loop())


def test_a_doorbell_rung_far_more_often_than_read_never_blocks_the_ringer() -> None:
    bell = Doorbell(blocking=True)
    for _ in range(200_000):  # several times what a pipe buffers
        bell.ring()
    bell.take()  # returns at once: rings are pending
    waiter_woke = threading.Event()
    quiet = Doorbell(blocking=True)

    def wait_for_ring() -> None:
        quiet.take()
        waiter_woke.set()

    waiter = threading.Thread(target=wait_for_ring, daemon=True)
    waiter.start()
    assert not waiter_woke.wait(0.05), "take() returned without a ring"
    quiet.ring()
    assert waiter_woke.wait(5)


def test_a_non_blocking_doorbell_takes_nothing_without_waiting() -> None:
    bell = Doorbell(blocking=False)
    bell.take()  # nothing pending: returns at once
    bell.ring()
    bell.take()


def test_a_sync_generator_streams_its_steps_in_order_through_the_inbox() -> None:
    from pytriton.core.instances import Instance

    def steps(requests: List[Any]) -> Any:
        for index in range(50):
            yield [{"index": index}]

    async def main() -> List[Any]:
        instance = Instance(steps, "test-instance")
        try:
            return [step async for step in instance.steps([], threading.Event())]
        finally:
            await instance.close()

    assert asyncio.run(main()) == [[{"index": index}] for index in range(50)]
