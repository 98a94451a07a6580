"""Calls between two processes over one channel, either way: an awaitable answer to each, by id.

For what is not the request path: forwarded API requests, state one process mirrors into another, the
lifecycle. Each call is a task on the side that answers it, so a call may itself wait (for the models to drain,
for other processes to answer calls of their own).

An answer may come in parts ahead of the reply (`progress`); the caller says when it has taken each (`took`), and
the handler's next part waits while too much is in flight (ipc/credit.py), as a server's send waits for its
client's socket.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple

from pytriton.ipc.channel import ChannelClosed
from pytriton.ipc.credit import Credit
from pytriton.ipc.outbox import Outbox

LOGGER = logging.getLogger(__name__)

# Tags of the messages (negative: the protocols that share the channel use positive ones, BATCH is 0):
# (CALL, id, what, args), (REPLY, id, ok, value or error text), (ABANDON, id) when the caller no longer waits,
# (PROGRESS, id, value): a part of the answer its handler sent before the reply (see `progress`), (CREDIT, id) when
# the caller has taken the oldest part it had not (see Calls.took).
CALL, REPLY, ABANDON, PROGRESS, CREDIT = -1, -2, -3, -4, -5

# In the task that answers a call: a future done once the caller has abandoned the call (see Calls.abandon).
_ABANDONED: contextvars.ContextVar[Optional[asyncio.Future[None]]] = contextvars.ContextVar(
    "pytriton_call_abandoned", default=None
)

# In the task that answers a call: sends a part of the answer ahead of the reply (see Calls.call's on_progress).
Progress = Callable[[Any, int], Awaitable[None]]
_PROGRESS: contextvars.ContextVar[Optional[Progress]] = contextvars.ContextVar("pytriton_call_progress", default=None)

Handler = Callable[..., Awaitable[Any]]


class CallFailed(RuntimeError):
    """The other side raised while answering a call (its exception's type and message), or went away."""


class Calls:
    """Makes calls to the other side and answers its calls with `handlers` (what: async function of the args)."""

    def __init__(self, outbox: Outbox, handlers: Dict[str, Handler]) -> None:
        """Send through `outbox`; answer calls by name with `handlers`."""
        self._outbox = outbox
        self._handlers = handlers
        self._waiting: Dict[int, asyncio.Future[Any]] = {}
        self._on_progress: Dict[int, Callable[[Any], None]] = {}  # by the id of a call made here that takes parts
        self._parts_of: Dict[Awaitable[Any], int] = {}  # the id of a call made here that takes parts
        self._answering: Set[asyncio.Task[None]] = set()
        self._abandoned: Dict[int, asyncio.Future[None]] = {}  # by the id of a call being answered here
        self._credits: Dict[int, Credit] = {}  # by the id of a call being answered here in parts
        self._next_id = 0
        self.closed = False
        self._call_unsent = self._unsent  # one bound method for every call posted

    def call(
        self,
        what: str,
        *args: Any,
        fds: Sequence[int] = (),
        on_progress: Optional[Callable[[Any], None]] = None,
    ) -> Awaitable[Any]:
        """Ask the other side to run `what(*args)`; the future ends with its value, or CallFailed.

        `fds` (taken, closed here once sent) go with the call, sent at once: its handler gets them as `fds=`.
        `on_progress(value)` takes each part its handler sends ahead of the reply (`progress()` there), in order;
        `took(future)` says once each has been taken (the handler waits while too many have not).
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed:
            for fd in fds:
                os.close(fd)
            future.set_exception(CallFailed(f"cannot call '{what}': the other process is gone"))
            return future
        self._next_id += 1
        self._waiting[self._next_id] = future
        if on_progress is not None:
            self._on_progress[self._next_id] = on_progress
            self._parts_of[future] = self._next_id
        if not fds:
            self._outbox.post((CALL, self._next_id, what, args), unsent=self._call_unsent)
            return future
        try:
            self._outbox.send_now((CALL, self._next_id, what, args), fds=fds, give=True)
        except ChannelClosed:
            del self._waiting[self._next_id]
            self._on_progress.pop(self._next_id, None)
            self._parts_of.pop(future, None)
            future.set_exception(CallFailed(f"cannot call '{what}': the other process is gone"))
        return future

    def _unsent(self, head: Any, error: Exception) -> None:
        """A call whose arguments did not pickle (Outbox.post's `unsent`): it fails here, the other side never heard."""
        future = self._waiting.pop(head[1], None)
        if future is not None and not future.done():
            future.set_exception(CallFailed(f"the call could not be sent: {type(error).__name__}: {error}"))

    def abandon(self, future: Awaitable[Any]) -> None:
        """Stop waiting for a call `call` made (its client left): the other side is told, its late reply dropped."""
        for call_id, waiting in self._waiting.items():
            if waiting is future:
                del self._waiting[call_id]
                self._on_progress.pop(call_id, None)
                self._parts_of.pop(future, None)
                waiting.cancel()
                if not self.closed:
                    self._outbox.post((ABANDON, call_id))
                return

    def took(self, future: Awaitable[Any]) -> None:
        """The oldest part of a call's answer that `call` gave its `on_progress` has been taken (written on)."""
        call_id = self._parts_of.get(future)
        if call_id is not None and not self.closed:
            self._outbox.post((CREDIT, call_id))

    def on_call(self, head: Any, fds: Sequence[int] = ()) -> None:
        """A CALL message came (with the descriptors its message carried): answer it in a task of its own."""
        _, call_id, what, args = head
        loop = asyncio.get_running_loop()
        abandoned = self._abandoned[call_id] = loop.create_future()
        task = loop.create_task(self._answer(call_id, what, args, abandoned, list(fds)))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    def on_abandon(self, head: Any) -> None:
        """An ABANDON message came: the handler answering that call learns it through `abandoned()`."""
        future = self._abandoned.get(head[1])
        if future is not None and not future.done():
            future.set_result(None)

    async def _answer(
        self, call_id: int, what: str, args: Any, abandoned: asyncio.Future[None], fds: List[int]
    ) -> None:
        """Run a handler and send its value, or what it raised, back."""
        _ABANDONED.set(abandoned)  # this task's own context
        _PROGRESS.set(lambda value, size: self._progress(call_id, abandoned, value, size))
        try:
            handler = self._handlers[what]
            value = await (handler(*args, fds=fds) if fds else handler(*args))
        except Exception as error:
            if not isinstance(error, KeyError):
                LOGGER.debug("call '%s' failed", what, exc_info=True)
            reply = (REPLY, call_id, False, f"{type(error).__name__}: {error}")
        else:
            reply = (REPLY, call_id, True, value)
        finally:
            del self._abandoned[call_id]
            self._credits.pop(call_id, None)
        if not self.closed and not abandoned.done():
            self._outbox.post(reply, unsent=_unsent_reply)

    async def _progress(self, call_id: int, abandoned: asyncio.Future[None], value: Any, size: int) -> None:
        """Send a part of a call's answer ahead of its reply, then wait while too much is in flight.

        Dropped once the caller abandoned the call, and then nothing waits (as a send to a client that left).
        """
        if self.closed or abandoned.done():
            return
        self._outbox.post((PROGRESS, call_id, value))
        credit = self._credits.get(call_id)
        if credit is None:
            credit = self._credits[call_id] = Credit()
        await credit.sent(size, abandoned)

    def on_credit(self, head: Any) -> None:
        """A CREDIT message came: the caller took the oldest part in flight of a call answered here."""
        credit = self._credits.get(head[1])
        if credit is not None:
            credit.taken()

    def on_progress(self, head: Any) -> None:
        """A PROGRESS message came: a part of the answer to a call made here, for its `on_progress`."""
        on_progress = self._on_progress.get(head[1])
        if on_progress is not None:
            on_progress(head[2])

    def on_reply(self, head: Any) -> None:
        """A REPLY message came: end the call it answers."""
        _, call_id, ok, value = head
        self._on_progress.pop(call_id, None)
        future = self._waiting.pop(call_id, None)
        if future is None:
            return
        self._parts_of.pop(future, None)
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(CallFailed(value))

    def close(self) -> None:
        """The other side is gone: calls waiting for it fail, and calls it made are not answered."""
        self.closed = True
        waiting, self._waiting = self._waiting, {}
        self._on_progress.clear()
        self._parts_of.clear()
        for future in waiting.values():
            if not future.done():
                future.set_exception(CallFailed("the other process is gone"))
        for task in list(self._answering):
            task.cancel()


def _unsent_reply(head: Any, error: Exception) -> Tuple[Any, Sequence[Any]]:
    """What goes in place of a reply whose value did not pickle (Outbox.post's `unsent`): the call fails."""
    return (REPLY, head[1], False, f"the reply could not be sent: {type(error).__name__}: {error}"), ()


def abandoned() -> Optional[asyncio.Future[None]]:
    """In a handler answering a call: a future done once its caller abandons the call (None outside one)."""
    return _ABANDONED.get()


def progress() -> Optional[Progress]:
    """In a handler answering a call: sends a part of its answer ahead of the reply (None outside one).

    `await send(part, size)` returns once no more than a window of the answer's parts (`size` bytes each) is in
    flight: the caller has taken the rest (`Calls.took`).
    """
    return _PROGRESS.get()
