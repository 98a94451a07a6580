"""Messages posted during one turn of the event loop leave together: one pickled head, one system call.

Why: a frontend process and the process that holds the batcher exchange a message per request and per
response. Sent one by one, each costs a `sendmsg` on one side and a wake-up, a `recvmsg` and a `pickle.loads`
on the other (about 6 us of the receiver's CPU for a small request). Posted to an outbox, every message of a
loop turn goes in one batch at the start of the next turn, and the receiver reads them with one system call
and one `loads` of their heads: under load a wake-up handles tens of requests.

A batch is one channel message: its head is `(BATCH, [(head, body start, body length), ...])` and its body
the items' bodies one after the other. `items` cuts it up again; a message sent without an outbox is one item.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, List, Sequence, Tuple

from pytriton.ipc.channel import ChannelClosed, LoopChannel, Message
from pytriton.ipc.tensors import Buffer

BATCH = 0  # the tag of a batch's head; other tags belong to the protocol that uses the outbox


class Outbox:
    """Posts messages to a channel, a batch per loop turn; `send_now` for one that carries descriptors."""

    def __init__(self, channel: LoopChannel, loop: asyncio.AbstractEventLoop) -> None:
        """Batch messages for `channel`, flushed on `loop`."""
        self._channel = channel
        self._loop = loop
        self._heads: List[Tuple[Any, int, int]] = []
        self._parts: List[Buffer] = []
        self._size = 0
        self._scheduled = False

    def post(self, head: Any, body: Sequence[Buffer] = ()) -> None:
        """Send `head` and `body` with the rest of this loop turn's messages.

        The body's buffers are sent as they are at the flush: they must not change before the next turn.
        """
        size = 0
        for part in body:
            size += len(part) if type(part) is bytes else memoryview(part).nbytes
            self._parts.append(part)
        self._heads.append((head, self._size, size))
        self._size += size
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_now(self, head: Any, body: Sequence[Buffer] = (), fds: Sequence[int] = (), give: bool = False) -> None:
        """Send one message at once, after what was posted before it (descriptors go with it: LoopChannel.send)."""
        self.flush()
        self._channel.send(head, body, fds, give)

    def flush(self) -> None:
        """Send what was posted, in one message (the channel says ChannelClosed if it cannot)."""
        self._scheduled = False
        heads = self._heads
        if not heads:
            return
        parts, size = self._parts, self._size
        self._heads, self._parts, self._size = [], [], 0
        if not self._channel.closed:
            try:
                self._channel.send((BATCH, heads), parts, body_size=size)
            except ChannelClosed:
                pass  # the channel's on_closed says what becomes of what was waiting for answers


def items(message: Message) -> Iterator[Tuple[Any, memoryview]]:
    """The messages in a message: each head of a batch with its part of the body, or the message itself."""
    head = message.head
    if head[0] != BATCH:
        yield head, message.body
        return
    body = message.body
    for item, start, size in head[1]:
        yield item, body[start : start + size]
