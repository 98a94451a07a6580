"""Messages posted during one turn of the event loop leave together: one pickled head, one system call.

Why: a frontend process and the process that holds the batcher exchange a message per request and per
response. Sent one by one, each costs a `sendmsg` on one side and a wake-up, a `recvmsg` and a `pickle.loads`
on the other (about 6 us of the receiver's CPU for a small request). Posted to an outbox, every message of a
loop turn goes in one batch at the start of the next turn, and the receiver reads them with one system call
and one `loads` of their heads: under load a wake-up handles tens of requests.

A batch is one channel message: its head is `(BATCH, [(head, body start, body length), ...])` and its body
the items' bodies one after the other. `items` cuts it up again; a message sent without an outbox is one item.

A head that does not pickle (an object output the callable filled with something unpicklable) would lose the whole
batch: every request in it would wait for an answer that never comes. Then the batch goes out item by item instead,
and each item that does not pickle is said unsent to whoever posted it (`post`'s `unsent`), alone, which may name a
message to send in its place (the request's error): in the same place, so a stream's messages keep their order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from pytriton.ipc.channel import ChannelClosed, LoopChannel, Message
from pytriton.ipc.tensors import Buffer

BATCH = 0  # the tag of a batch's head; other tags belong to the protocol that uses the outbox
LOGGER = logging.getLogger(__name__)

# Told which posted message (its head) could not be sent and why (it did not pickle): the message (head, body) to send
# in its place, or None. A replacement that does not pickle either is said unsent again (a few times at most). One
# function serves every message of a kind (it reads what it needs from the head): no closure per message posted.
Unsent = Callable[[Any, Exception], Optional[Tuple[Any, Sequence[Buffer]]]]
_REPLACEMENTS = 3


class Outbox:
    """Posts messages to a channel, a batch per loop turn; `send_now` for one that carries descriptors."""

    def __init__(self, channel: LoopChannel, loop: asyncio.AbstractEventLoop) -> None:
        """Batch messages for `channel`, flushed on `loop`."""
        self._channel = channel
        self._loop = loop
        self._heads: List[Tuple[Any, int, int]] = []
        self._parts: List[Buffer] = []
        self._size = 0
        self._unsent: List[Tuple[int, Unsent]] = []  # (index in _heads, who is told its message was not sent)
        self._scheduled = False

    def post(self, head: Any, body: Sequence[Buffer] = (), unsent: Optional[Unsent] = None) -> None:
        """Send `head` and `body` with the rest of this loop turn's messages.

        The body's buffers are sent as they are at the flush: they must not change before the next turn. A head that
        does not pickle is dropped alone, and `unsent` (else the log) is told why, during the flush: what it answers
        is sent in its place.
        """
        size = 0
        for part in body:
            size += len(part) if type(part) is bytes else memoryview(part).nbytes
            self._parts.append(part)
        if unsent is not None:
            self._unsent.append((len(self._heads), unsent))
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
        """Send what was posted in one message (ChannelClosed: it cannot); one by one if a head does not pickle."""
        self._scheduled = False
        heads = self._heads
        if not heads:
            return
        parts, size, unsent = self._parts, self._size, self._unsent
        self._heads, self._parts, self._size = [], [], 0
        if unsent:
            self._unsent = []
        if not self._channel.closed:
            try:
                self._channel.send((BATCH, heads), parts, body_size=size)
            except ChannelClosed:
                pass  # the channel's on_closed says what becomes of what was waiting for answers
            except Exception:  # noqa: BLE001 - whatever pickling raises (nothing was sent): the others go on
                self._send_each(heads, parts, dict(unsent))

    def _send_each(self, heads: List[Tuple[Any, int, int]], parts: List[Buffer], unsent: Dict[int, Unsent]) -> None:
        """Send a batch's items one by one (each a message of its own); tell those that do not pickle."""
        for index, ((head, _, _), body) in enumerate(zip(heads, _cut(parts, heads))):
            tell = unsent.get(index)
            message: Optional[Tuple[Any, Sequence[Buffer]]] = (head, body)
            tries = 0
            while message is not None:
                try:
                    self._channel.send(message[0], message[1])
                    break
                except ChannelClosed:
                    return
                except Exception as error:  # noqa: BLE001 - whatever pickling raises
                    if tell is None or tries == _REPLACEMENTS:
                        LOGGER.error("a message could not be sent to another process of the server: %r", error)
                        break
                    tries += 1
                    try:
                        message = tell(head, error)
                    except Exception:
                        LOGGER.exception("replacing a message that could not be sent failed")
                        break


def _cut(parts: List[Buffer], heads: List[Tuple[Any, int, int]]) -> Iterator[List[Buffer]]:
    """The body of each item of a batch, as views of its parts (posted one after the other)."""
    index = offset = 0
    for _, _, size in heads:
        pieces: List[Buffer] = []
        while size:
            part = memoryview(parts[index]).cast("B")
            take = min(part.nbytes - offset, size)
            if take:
                pieces.append(part[offset : offset + take])
            size -= take
            offset += take
            if offset == part.nbytes:
                index, offset = index + 1, 0
        yield pieces


def items(message: Message) -> Iterator[Tuple[Any, memoryview]]:
    """The messages in a message: each head of a batch with its part of the body, or the message itself."""
    head = message.head
    if head[0] != BATCH:
        yield head, message.body
        return
    body = message.body
    for item, start, size in head[1]:
        yield item, body[start : start + size]
