"""The outbox: a loop turn's messages leave as one batch, and a message that does not pickle is lost alone."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any, List, Optional, Sequence, Tuple

import pytest

from pytriton.ipc.calls import CALL, CallFailed, Calls
from pytriton.ipc.channel import LoopChannel, Message
from pytriton.ipc.outbox import BATCH, Outbox, items


class _Link:
    """Two loop channels over a socket pair; what the receiving one got, as (head, body bytes) per message."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.messages: List[Message] = []
        self.got: List[Tuple[Any, bytes]] = []
        self.arrived = asyncio.Event()
        self.sender = LoopChannel(ours, loop, lambda message: None, lambda: None)
        self.receiver = LoopChannel(theirs, loop, self._on_message, lambda: None)
        self.outbox = Outbox(self.sender, loop)

    def _on_message(self, message: Message) -> None:
        self.messages.append(message)
        self.got.extend((head, bytes(body)) for head, body in items(message))
        self.arrived.set()

    async def receive(self, count: int) -> List[Tuple[Any, bytes]]:
        """Wait until `count` items came (10 s at most)."""
        while len(self.got) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)
        return self.got

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def _run(test: Any) -> Any:
    return asyncio.run(test())


def test_a_loop_turns_messages_leave_as_one_batch_with_their_bodies() -> None:
    async def test() -> None:
        link = _Link(asyncio.get_running_loop())
        link.outbox.post(("first",), [b"ab", memoryview(b"cde")])
        link.outbox.post(("second",))
        link.outbox.post(("third",), [bytearray(b"f")])
        got = await link.receive(3)
        assert got == [(("first",), b"abcde"), (("second",), b""), (("third",), b"f")]
        assert len(link.messages) == 1 and link.messages[0].head[0] == BATCH
        link.close()

    _run(test)


def test_a_message_that_does_not_pickle_is_lost_alone_and_its_poster_told_why() -> None:
    """Before, the batch's pickling raised in the flush: every message of the loop turn was lost, and the requests
    they answered waited for ever."""

    async def test() -> None:
        link = _Link(asyncio.get_running_loop())
        told: List[Tuple[Any, Exception]] = []

        def unsent(head: Any, error: Exception) -> None:
            told.append((head, error))

        link.outbox.post(("before",), [b"12", b"3"])
        link.outbox.post(("lock", threading.Lock()), [b"45"], unsent)
        link.outbox.post(("empty",), [b""])
        link.outbox.post(("after",), [memoryview(b"6789")[1:]])
        got = await link.receive(3)
        assert got == [(("before",), b"123"), (("empty",), b""), (("after",), b"789")]
        assert len(told) == 1 and told[0][0][0] == "lock" and "lock" in str(told[0][1])
        link.close()

    _run(test)


def test_what_unsent_answers_goes_in_the_place_of_the_message_that_did_not_pickle() -> None:
    """A stream's messages keep their order: the replacement (the request's error) is sent where the message was."""

    async def test() -> None:
        link = _Link(asyncio.get_running_loop())
        tries: List[str] = []

        def unsent(head: Any, error: Exception) -> Optional[Tuple[Any, Sequence[bytes]]]:
            tries.append(f"{head[0]}: {type(error).__name__}")
            if len(tries) == 1:
                return ("still", threading.Lock()), [b"x"]  # does not pickle either: told again
            return ("error", str(error)), [b"why"]

        link.outbox.post(("one",), [b"1"])
        link.outbox.post(("two", threading.Lock()), [b"2"], unsent)
        link.outbox.post(("three",), [b"3"])
        got = await link.receive(3)
        assert [head[0] for head, _ in got] == ["one", "error", "three"]
        assert got[1][1] == b"why" and [body for _, body in got[::2]] == [b"1", b"3"]
        assert tries == ["two: TypeError", "two: TypeError"]
        link.close()

    _run(test)


def test_a_message_no_one_is_told_of_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def test() -> None:
        link = _Link(asyncio.get_running_loop())
        link.outbox.post(("lock", threading.Lock()))
        link.outbox.post(("after",), [b"ok"])
        assert await link.receive(1) == [(("after",), b"ok")]
        link.close()

    with caplog.at_level(logging.ERROR, logger="pytriton.ipc.outbox"):
        _run(test)
    assert any("could not be sent" in record.getMessage() for record in caplog.records)


def test_a_call_or_reply_that_does_not_pickle_fails_that_call_not_the_channel() -> None:
    """Before, the caller of a call whose arguments (or whose reply) did not pickle waited for ever."""

    async def test() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        async def lock() -> Any:
            return threading.Lock()

        async def echo(value: Any) -> Any:
            return value

        sides: List[Calls] = []

        def on_message(index: int) -> Any:
            def handle(message: Message) -> None:
                for head, _ in items(message):
                    (sides[index].on_call if head[0] == CALL else sides[index].on_reply)(head)

            return handle

        channels = [
            LoopChannel(sock, loop, on_message(index), lambda: None) for index, sock in enumerate([ours, theirs])
        ]
        sides.extend(Calls(Outbox(channel, loop), {"lock": lock, "echo": echo}) for channel in channels)
        unsent = sides[0].call("echo", threading.Lock())
        unreplied = sides[0].call("lock")
        answered = sides[0].call("echo", "fine")
        assert await asyncio.wait_for(answered, 10) == "fine"
        with pytest.raises(CallFailed, match="could not be sent: TypeError"):
            await asyncio.wait_for(unsent, 10)
        with pytest.raises(CallFailed, match="reply could not be sent: TypeError"):
            await asyncio.wait_for(unreplied, 10)
        for channel in channels:
            channel.close()

    _run(test)


def test_a_reserved_place_keeps_its_message_s_order_whatever_is_sent_meanwhile() -> None:
    """A process instance's JOB with long object inputs is sent once their pieces are pickled in a thread: the
    CANCEL or STOP of its requests sent meanwhile must follow it (LoopChannel.reserve)."""

    async def test() -> None:
        link = _Link(asyncio.get_running_loop())
        big = bytes(4 << 20)  # more than the socket takes at once: what follows is queued behind it
        link.sender.send(("big",), [big])
        first = link.sender.reserve()
        link.sender.send(("after first",), [b"1"])
        second = link.sender.reserve()
        link.sender.send(("after second",))
        with pytest.raises(Exception):  # noqa: B017 - whatever pickling a lock raises
            second.fill(("lock", threading.Lock()))
        second.drop()  # the message that did not pickle: no message, the rest goes on
        first.fill(("first",), [b"x" * 20_000, b"y"])
        got = await link.receive(4)
        assert [head for head, _ in got] == [("big",), ("first",), ("after first",), ("after second",)]
        assert got[0][1] == big and got[1][1] == b"x" * 20_000 + b"y"
        link.close()

    _run(test)
