"""The engine as a frontend process sees it: models mirrored from the hub, requests sent there to run.

A frontend decodes and checks each request itself (it has every model's spec), then sends it to the hub
(the process that holds the models) and awaits its answer: the hub's batcher takes requests from every
frontend. What the transports ask beyond running requests is forwarded to the hub as whole API requests
(forwarding.py), so this engine answers only what the request path needs.

Large bodies are read into shared buffers (`OwnSegments`, the receive buffers' allocator here), so that the
hub views their tensors in place; a request's buffer is kept until the hub says it views it no more
(RELEASED). Large outputs come back as views of the hub's arena (or of this process's own buffer, for an
identity), which go out to the client without a copy and are returned to the hub once gone (RETURNED).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections import deque
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    List,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from pytriton.core.engine import SpecChange, find_available
from pytriton.core.errors import InferenceError
from pytriton.core.logs.log_budget import LogBudget
from pytriton.core.model import RepositoryEntry, ServedModel
from pytriton.core.process_instances.long_outputs import off_loop
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.request_spans import TracedResponse
from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.raw_tensors import mark_leased
from pytriton.core.watch import WATCH_AFTER_S, Disconnect
from pytriton.ipc.calls import ABANDON, CALL, CREDIT, PROGRESS, REPLY, Calls, Handler
from pytriton.ipc.channel import ChannelClosed, LoopChannel, Message
from pytriton.ipc.outbox import Outbox, items
from pytriton.ipc.segment_index import OwnSegments
from pytriton.ipc.tensors import ArenaReader
from pytriton.runtime.frontends.protocol import (
    ARENA,
    ARENA_PLACE,
    CANCEL,
    CONNECTION,
    END,
    FAILED,
    FORGET,
    PICKLE_FIRST,
    REFUSED,
    RELEASED,
    RESPONSE,
    RETURNED,
    SEGMENT,
    SENT,
    STREAM_ACK,
    TAKEN,
    TOKENS,
    TRACED_RESPONSE,
    LongInputs,
    Pickled,
    error_of,
    pack_request,
    pickle_inputs_ahead,
    put_back_long,
    rebuild_long,
    unpack_response,
)

_WATCH_AFTER_NS = int(WATCH_AFTER_S * 1e9)
LOGGER = logging.getLogger("pytriton")


def _held_back_refusals(count: int, last: str) -> None:
    LOGGER.warning("... and more of the server's arenas could not be mapped (%d); the last: %s", count, last)


_END = object()
_GONE = "the client disconnected before its response was ready"
_UNSENT = "the request could not be passed from the frontend process to the server's process"


class _Stream:
    """The responses of one streaming request as they come from the hub."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()


Waiting = Union["asyncio.Future[InferenceResponse]", _Stream]


class _HubTrace:
    """The hub's trace file record of a request (a TRACED_RESPONSE's), which the transport's timestamps go to.

    A transport claims it when it times the response's send (core/request_spans.FrontendTrace); one that does not
    (a stream's, the OpenAI API's, an encoding that failed) leaves the record to the hub without them.
    """

    __slots__ = ("_claimed", "_key", "_link")

    def __init__(self, link: HubLink, key: int) -> None:
        self._link = link
        self._key = key
        self._claimed = False

    def claim(self) -> bool:
        """The transport will send the timestamps (`sent`)."""
        self._claimed = True
        return True

    def sent(self, protocol: str, stamps: Tuple[int, int, int, int]) -> None:
        """The transport's timestamps, to the hub."""
        self._link.sent(self._key, protocol, stamps)

    def abandon(self) -> None:
        """The hub writes the record without the transport's timestamps."""
        self._link.sent(self._key, "", ())

    def unclaimed(self) -> None:
        """The transport that took the response did not claim the record: the hub writes it without them."""
        if not self._claimed:
            self.abandon()


class HubLink:
    """A frontend's side of its channel to the hub: requests out, their answers back, calls either way."""

    def __init__(
        self,
        channel: LoopChannel,
        loop: asyncio.AbstractEventLoop,
        handlers: Dict[str, Handler],
        on_connection: Callable[[str, int, bool], None],
        on_closed: Callable[[], None],
    ) -> None:
        """Talk to the hub over `channel`; answer its calls with `handlers`.

        `on_connection(kind, fd, over the cap)` serves a connection the hub accepted; `on_closed()` runs once the
        hub is gone.
        """
        self.loop = loop
        self._on_connection = on_connection
        self._on_hub_gone = on_closed
        self.outbox = Outbox(channel, loop)
        self.calls = Calls(self.outbox, handlers)
        self._request_unsent = self._unsent  # one bound method for every request posted
        self._waiting: Dict[int, Waiting] = {}
        # Requests whose clients are watched once they wait WATCH_AFTER_S: key -> (gone, since ns, watcher).
        self._watched: Dict[int, Tuple[Disconnect, int, Optional[asyncio.Future[Any]]]] = {}
        self._sweep: Optional[asyncio.TimerHandle] = None
        self._next_key = 0
        self.closed = False
        # The receive buffers of this process (made shared when it starts serving) and the hub's arena.
        self.buffers = OwnSegments(self._announce, self._forget)
        self._arena = ArenaReader()
        self._lent: Dict[int, Any] = {}  # key: the inputs of a request the hub views in our buffers
        self._returned: Deque[int] = deque()  # loans of the hub's arena no longer viewed here
        self._returning = False
        self._refusals = LogBudget(_held_back_refusals)
        # While a response's long object outputs are rebuilt off the loop: it and the messages of its request that
        # came after it, in order, by key: (the rebuild's future, or None: ready; the message's tag; the response,
        # error or _END it brings). `_pieces`: the long outputs of the response being unpacked (`unpack_response`).
        self._behind: Dict[int, Deque[Tuple[Optional[asyncio.Future[Dict[str, np.ndarray]]], int, Any]]] = {}
        self._pieces: List[Any] = []
        channel.handle(self._on_message, self._on_closed)

    def send(
        self,
        spec: ModelSpec,
        request: InferenceRequest,
        waiting: Waiting,
        gone: Optional[Disconnect],
        named: bool = True,
        pickled: Optional[Pickled] = None,
    ) -> int:
        """Send a request to the hub; its answers go to `waiting`. Its key. `named`: its client named the version.

        `pickled`: its long object inputs' pieces, pickled off the loop (`pickled_inputs`); PICKLE_FIRST: raises
        LongInputs (sending nothing) at a long one, None: they are pickled now.
        """
        if self.closed:
            raise InferenceError.unavailable("the server is stopping")
        self._next_key += 1
        key = self._next_key
        streaming = isinstance(waiting, _Stream)
        head, body, shared = pack_request(
            key, spec.name, spec.version_str, request, streaming, self.buffers.locate, named, pickled
        )
        self.outbox.post(head, body, self._request_unsent)
        if shared:
            self._lent[key] = request.inputs
        self._waiting[key] = waiting
        if gone is not None:
            self._watched[key] = (gone, time.monotonic_ns(), None)
            if self._sweep is None:
                self._sweep = self.loop.call_later(WATCH_AFTER_S, self._watch)
        return key

    def _unsent(self, head: Any, error: Exception) -> None:
        """A request's message did not pickle (Outbox.post's `unsent`): it fails alone, the hub never heard of it."""
        key = head[1]
        self._lent.pop(key, None)
        self._unwatch(key)
        target = self._waiting.pop(key, None)
        if target is None:
            return None
        item = InferenceError.internal(f"{_UNSENT}: {type(error).__name__}: {error}")
        if isinstance(target, _Stream):
            target.queue.put_nowait(item)
        elif not target.done():
            target.set_exception(item)
        return None

    def cancel(self, key: int) -> None:
        """The request's caller went away: the hub takes it out of its queue, or drops its answers."""
        if self._waiting.pop(key, None) is not None and not self.closed:
            self.outbox.post((CANCEL, key))
        self._unwatch(key)

    def sent(self, key: int, protocol: str, stamps: Tuple[int, ...]) -> None:
        """The transport's timestamps of a TRACED_RESPONSE's request (none: protocol ""), for the hub's record."""
        if not self.closed:
            self.outbox.post((SENT, key, protocol, stamps))

    def _on_message(self, message: Message) -> None:
        """Answers and calls from the hub."""
        tag = message.head[0]
        if tag == CONNECTION:
            # -1: the kernel dropped its descriptor (this process has none left): the connection is lost
            fd = message.fds[0] if len(message.fds) == 1 else -1
            if fd < 0:
                for extra in message.fds:
                    os.close(extra)
            self._on_connection(message.head[1], fd, message.head[2])
            return
        if tag == ARENA:
            self._adopt_arena(message)
            return
        waiting = self._waiting
        behind = self._behind
        pieces = self._pieces
        for head, body in items(message):
            tag = head[0]
            if tag == RESPONSE or tag == TRACED_RESPONSE:
                key = head[1]
                target = waiting.get(key)
                if target is None:
                    if head[5]:
                        self._returned.append(head[5])  # nobody waits for it: its region goes back at once
                        self._return_soon()
                    if tag == TRACED_RESPONSE:
                        self.sent(key, "", ())
                    continue
                try:
                    response = unpack_response(head, body, self._resolver(head[5]) if head[5] else self._own, pieces)
                except ValueError as error:  # names a buffer of ours that is gone, or an arena not mapped here
                    pieces.clear()
                    if head[5]:
                        self._returned.append(head[5])  # viewed by no one: its region goes back at once
                        self._return_soon()
                    item: Any = InferenceError.internal(f"the server lost a response: {error}")
                    if behind and key in behind:
                        behind[key].append((None, tag, item))
                    else:
                        self._hand_end(key, tag, item)
                    continue
                if pieces:
                    self._rebuild(key, tag, response, body)
                elif behind and key in behind:
                    behind[key].append((None, tag, response))
                elif isinstance(target, _Stream):  # `_hand`'s work, inline: this runs for every response
                    target.queue.put_nowait(response)
                else:
                    del waiting[key]
                    self._unwatch(key)
                    if tag == RESPONSE:
                        if not target.done():
                            target.set_result(response)
                        continue
                    trace = _HubTrace(self, key)
                    if not target.done():
                        target.set_result(TracedResponse(response, trace))
                    self.loop.call_soon(trace.unclaimed)  # see `_hand`
            elif tag == FAILED or tag == END:
                key = head[1]
                if behind and key in behind:
                    behind[key].append((None, tag, error_of(head) if tag == FAILED else _END))
                elif key in waiting:
                    self._hand_end(key, tag, error_of(head) if tag == FAILED else _END)
            elif tag == RELEASED:
                for key in head[1]:
                    self._lent.pop(key, None)
            elif tag == REFUSED:
                self.buffers.refused(head[1])
            elif tag == CALL:
                self.calls.on_call(head, message.fds)  # a call that carries descriptors is a message of its own
            elif tag == REPLY:
                self.calls.on_reply(head)
            elif tag == ABANDON:
                self.calls.on_abandon(head)
            elif tag == PROGRESS:
                self.calls.on_progress(head)
            elif tag == CREDIT:
                self.calls.on_credit(head)

    def _hand(self, key: int, tag: int, target: Waiting, response: InferenceResponse) -> None:
        """A response to the request that waits for it (a RESPONSE's or TRACED_RESPONSE's `tag`)."""
        if isinstance(target, _Stream):
            target.queue.put_nowait(response)
            return
        del self._waiting[key]
        self._unwatch(key)
        if tag == RESPONSE:
            if not target.done():
                target.set_result(response)
            return
        trace = _HubTrace(self, key)
        if not target.done():
            target.set_result(TracedResponse(response, trace))
        # After the awaiting task's next step (set_result scheduled it first), in which a transport that times the
        # send claims the record.
        self.loop.call_soon(trace.unclaimed)

    def _hand_end(self, key: int, tag: int, item: Any) -> None:
        """What ends a request (an error, or a stream's _END), to it if it still waits; `tag`: the message's.

        A response that could not be made (an error of a RESPONSE's `tag`) tells the hub its trace record is done.
        """
        if tag == TRACED_RESPONSE:
            self.sent(key, "", ())
        target = self._waiting.pop(key, None)
        if target is None:
            return
        self._unwatch(key)
        if isinstance(target, _Stream):
            target.queue.put_nowait(item)
        elif not target.done():
            target.set_exception(item if isinstance(item, InferenceError) else _no_response())

    def _rebuild(self, key: int, tag: int, response: InferenceResponse, body: memoryview) -> None:
        """Rebuild a response's long object outputs (in `_pieces`) off the loop.

        The messages of its request that come after it wait behind it, in order.
        """
        pieces = list(self._pieces)
        self._pieces.clear()
        future = off_loop(lambda: rebuild_long(pieces, body))
        queue = self._behind.get(key)
        if queue is None:
            queue = self._behind[key] = deque()
        queue.append((future, tag, response))
        future.add_done_callback(functools.partial(self._rebuilt, key))

    def _rebuilt(self, key: int, _: object) -> None:
        """Hand a request what is ready of its messages, in order, up to the first response still rebuilt.

        A response nobody waits for any more is dropped: its views of the hub's arena go back as it is collected.
        """
        queue = self._behind.get(key)
        while queue:
            future, tag, item = queue[0]
            if future is not None:
                if not future.done():
                    return
                try:
                    put_back_long(item, future.result())
                except Exception as error:  # noqa: BLE001 - pieces that do not make the array: it fails alone
                    item = InferenceError.internal(f"the server lost a response: {error}")
            queue.popleft()
            if isinstance(item, InferenceResponse):
                target = self._waiting.get(key)
                if target is not None:
                    self._hand(key, tag, target, item)
                elif tag == TRACED_RESPONSE:
                    self.sent(key, "", ())
            else:
                self._hand_end(key, tag, item)
            del item
        self._behind.pop(key, None)

    def _adopt_arena(self, message: Message) -> None:
        """Map the hub's new arena; one that cannot be mapped (out of descriptors) is refused, not fatal.

        Its responses must then find no arena, not the one before: they fail (500), and the hub copies the next
        ones into their messages for a while (REFUSED).
        """
        try:
            self._arena.adopt(message.head[1], message.fds)
        except (OSError, ValueError) as error:
            self._arena.close()
            if not self.closed:
                self.outbox.post((REFUSED, ARENA_PLACE))
            line = f"the server's arena for responses could not be mapped ({error}): large responses are copied"
            if self._refusals.admit(line):
                LOGGER.warning("%s", line)

    def _own(self, where: int, offset: int, nbytes: int, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
        """An output that lies in a buffer of ours (an identity's output: a view of its input)."""
        return self.buffers.region(where, offset, nbytes).view(dtype).reshape(shape)

    def _resolver(self, loan: int) -> Callable[[int, int, int, np.dtype, Tuple[int, ...]], np.ndarray]:
        """How a response's arrays in shared memory are viewed: the hub's arena under one lease, or our buffers."""
        lease: List[np.ndarray] = []

        def resolve(where: int, offset: int, nbytes: int, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
            if where != ARENA_PLACE:
                return self.buffers.region(where, offset, nbytes).view(dtype).reshape(shape)
            if not lease:
                view = self._arena.view
                if view is None:
                    raise ValueError("an output in an arena that never arrived")
                lease.append(np.ndarray((len(view),), np.uint8, view))  # every output of the response views it
                # The response may go out as views of it: the hub writes there again only once it is returned.
                mark_leased(lease[0], functools.partial(self._return, loan))
            return lease[0][offset : offset + nbytes].view(dtype).reshape(shape)

        return resolve

    def _return(self, loan: int) -> None:
        """A response's views of the hub's arena are gone: return its region (a weak reference's callback)."""
        self._returned.append(loan)
        self._return_soon()

    def _return_soon(self) -> None:
        if not self._returning and not self.closed:
            self._returning = True
            self.loop.call_soon(self._send_returned)

    def _send_returned(self) -> None:
        self._returning = False
        loans = list(self._returned)
        self._returned.clear()
        if loans and not self.closed:
            self.outbox.post((RETURNED, loans))

    def _announce(self, segment_id: int, fd: int, size: int) -> None:
        """A receive buffer was made: the hub maps it before any request names it."""
        if self.closed:
            os.close(fd)
            return
        try:
            self.outbox.send_now((SEGMENT, segment_id, size), fds=[fd], give=True)
        except ChannelClosed:
            pass  # the hub is gone: this process ends

    def _forget(self, segment_id: int) -> None:
        """A receive buffer is gone: the hub lets go of its mapping."""
        if not self.closed:
            self.outbox.post((FORGET, segment_id))

    def _on_closed(self) -> None:
        """The hub is gone: every request waiting for it fails."""
        self.close()
        waiting, self._waiting = self._waiting, {}
        error = InferenceError.unavailable("the server is stopping")
        for target in waiting.values():
            if isinstance(target, _Stream):
                target.queue.put_nowait(error)
            elif not target.done():
                target.set_exception(error)
        for key in list(self._watched):
            self._unwatch(key)
        self._on_hub_gone()

    def close(self) -> None:
        """Send nothing more (this process ends): buffers let go of later are not the hub's concern."""
        self.closed = True
        self.calls.close()

    def _watch(self) -> None:
        """Start watching the clients of requests that have waited WATCH_AFTER_S; look again later while any wait."""
        self._sweep = None
        if not self._watched:
            return
        due_ns = time.monotonic_ns() - _WATCH_AFTER_NS
        for key, (gone, since_ns, watcher) in list(self._watched.items()):
            if watcher is None and since_ns <= due_ns:
                watcher = asyncio.ensure_future(gone())
                watcher.add_done_callback(functools.partial(self._gone, key))
                self._watched[key] = (gone, since_ns, watcher)
        self._sweep = self.loop.call_later(WATCH_AFTER_S, self._watch)

    def _gone(self, key: int, watcher: asyncio.Future[Any]) -> None:
        """A request's client disconnected: the hub takes it out of its queue (it answers CANCELLED) if it is there."""
        if watcher.cancelled():
            return
        watcher.exception()  # read, so that a failed watcher is not reported as never retrieved
        self._watched.pop(key, None)
        if key in self._waiting and not self.closed:
            self.outbox.post((CANCEL, key))

    def _unwatch(self, key: int) -> None:
        """Stop watching a request's client."""
        watched = self._watched.pop(key, None)
        if watched is not None and watched[2] is not None:
            watched[2].cancel()


def pickled_inputs(request: InferenceRequest) -> asyncio.Future[Pickled]:
    """A request's long object inputs pickled in a thread (the loop serves other clients meanwhile)."""
    return off_loop(lambda: pickle_inputs_ahead(request))


def _no_response() -> InferenceError:
    return InferenceError.internal("model returned no response")


class RemoteModel:
    """A model version served by the hub: this process checks its requests, the hub runs them."""

    def __init__(self, spec: ModelSpec, link: HubLink, named: bool = True) -> None:
        """A model of `spec`, run through `link`; `named`: as found by a request that named its version."""
        self.spec = spec
        self._link = link
        self._named = named
        self._latest: Optional[RemoteModel] = None

    @property
    def out_of_date(self) -> bool:
        """Never: the hub finds the model again for each request it runs."""
        return False

    @property
    def latest(self) -> RemoteModel:
        """This version as found by a request that named none (the latest).

        The hub answers such a request whose version went out of service (unloaded before this process heard) as
        one process answers a request naming none: 404, not the 503 of a request naming the version.
        """
        latest = self._latest
        if latest is None:
            latest = self._latest = RemoteModel(self.spec, self._link, named=False)
        return latest

    async def infer(self, request: InferenceRequest, gone: Optional[Disconnect] = None) -> InferenceResponse:
        """Run one request on the hub; its single response (a queued request whose client leaves is CANCELLED)."""
        # The link's loop, not asyncio.get_running_loop(): on Python 3.11 and older that costs a getpid() call.
        future: asyncio.Future[InferenceResponse] = self._link.loop.create_future()
        try:
            key = self._link.send(self.spec, request, future, gone, self._named, PICKLE_FIRST)
        except LongInputs:
            key = 0  # sent once its long object inputs are pickled off the loop (not awaited with the error held)
        if not key:
            pickled = await pickled_inputs(request)
            key = self._link.send(self.spec, request, future, gone, self._named, pickled)
        try:
            return await future
        except asyncio.CancelledError:
            self._link.cancel(key)
            raise
        except BaseException:
            # The error's traceback holds this frame, which held the future, which holds the error: a cycle that
            # kept the request, and the receive buffer its inputs view, until the collector ran (buffers of failed
            # requests piled up).
            del future
            raise

    def record_tokens(
        self, first_token_ns: int, gaps_ns: Sequence[int], output_tokens: int, prompt_tokens: int
    ) -> None:
        """Count one generation of the OpenAI API in the model's statistics, which the hub keeps."""
        if not self._link.closed:
            spec = self.spec
            message = (
                TOKENS,
                spec.name,
                spec.version_str,
                first_token_ns,
                tuple(gaps_ns),
                output_tokens,
                prompt_tokens,
            )
            self._link.outbox.post(message)

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Run one request on the hub and iterate over its responses; leaving early stops it there.

        A request with long object inputs is sent once they are pickled off the loop, as the iteration begins.
        """
        stream = _Stream()
        try:
            key = self._link.send(self.spec, request, stream, None, self._named, PICKLE_FIRST)
        except LongInputs:
            return self._pickled_then_sent(request)
        return self._responses(key, stream)

    async def _pickled_then_sent(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """`stream`'s responses of a request with long object inputs: sent once they are pickled off the loop."""
        pickled = await pickled_inputs(request)
        stream = _Stream()
        key = self._link.send(self.spec, request, stream, None, self._named, pickled)
        responses = self._responses(key, stream)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()  # now, not when collected: leaving early cancels the request at once

    async def _responses(self, key: int, stream: _Stream) -> AsyncGenerator[InferenceResponse, None]:
        ended = False
        taken = 0
        try:
            while True:
                item = await stream.queue.get()
                if item is _END:
                    ended = True
                    return
                if isinstance(item, InferenceError):
                    ended = True
                    try:
                        raise item
                    finally:
                        del item  # its traceback holds this frame: not the error too (as sinks.StreamSink's)
                taken += 1
                if taken % STREAM_ACK == 0 and not self._link.closed:
                    self._link.outbox.post((TAKEN, key, taken))
                yield item
        finally:
            if not ended:
                self._link.cancel(key)


class RemoteEngine:
    """The engine in a frontend process: the hub's models (mirrored) and the client regions it registered."""

    def __init__(self, link: HubLink, server_name: str) -> None:
        """No models until the hub says which it serves."""
        self._link = link
        self.server_name = server_name
        self._models: Dict[str, Dict[int, RemoteModel]] = {}
        self._unloaded: FrozenSet[Tuple[str, int]] = frozenset()
        self._unloaded_names: FrozenSet[str] = frozenset()
        self.system_memory = SystemSharedMemory()
        self.cuda_memory = CudaSharedMemory()

    def set_models(self, specs: List[ModelSpec], unloaded: Sequence[Tuple[str, int]] = ()) -> None:
        """Serve these model versions from now on (the hub's table, whole); unchanged ones keep their object.

        `unloaded` names the versions out of service (a request for them gets Triton's words here).
        """
        self._unloaded = frozenset((name, version) for name, version in unloaded)
        self._unloaded_names = frozenset(name for name, _ in unloaded)
        table: Dict[str, Dict[int, RemoteModel]] = {}
        for spec in specs:
            old = self._models.get(spec.name, {}).get(spec.version)
            table.setdefault(spec.name, {})[spec.version] = (
                old if old is not None and old.spec == spec else (RemoteModel(spec, self._link))
            )
        self._models = table

    def change_models(
        self, changed: List[ModelSpec], removed: Sequence[Tuple[str, int]], unloaded: Sequence[Tuple[str, int]]
    ) -> None:
        """Serve `changed` (new versions, or new specs of ones served) and no longer `removed`; the rest stay.

        What the hub sends when its table changed: only what changed travels, so a change costs the same with 10
        models as with 10,000. `unloaded` names every version out of service, as in `set_models`.
        """
        self._unloaded = frozenset((name, version) for name, version in unloaded)
        self._unloaded_names = frozenset(name for name, _ in unloaded)
        for name, version in removed:
            versions = self._models.get(name)
            if versions is not None:
                versions.pop(version, None)
                if not versions:
                    del self._models[name]
        for spec in changed:
            versions = self._models.setdefault(spec.name, {})
            old = versions.get(spec.version)
            if old is None or old.spec != spec:
                versions[spec.version] = RemoteModel(spec, self._link)

    def model(self, name: str, version: str = "") -> RemoteModel:
        """The model version a request names (latest when the version is empty), or NOT_FOUND as the hub says it."""
        model = find_available(
            self._models,
            name,
            version,
            self._in_service,
            lambda: name in self._unloaded_names,
        )
        return model if version else model.latest

    def _in_service(self, model: RemoteModel) -> bool:
        """Whether the hub serves a model version (not unloaded)."""
        return not self._unloaded or (model.spec.name, model.spec.version) not in self._unloaded

    # What follows is the hub's to answer: the routes that need it are forwarded there (forwarding.py).

    @property
    def live(self) -> bool:
        """Forwarded: never asked here."""
        _forwarded()

    @property
    def ready(self) -> bool:
        """Forwarded: never asked here."""
        _forwarded()

    @property
    def has_cache(self) -> bool:
        """Forwarded: never asked here."""
        _forwarded()

    def models(self) -> List[ServedModel]:
        """Forwarded: never asked here."""
        _forwarded()

    def model_ready(self, name: str, version: str = "") -> bool:
        """Forwarded: never asked here."""
        _forwarded()

    def statistics_of(self, name: str = "", version: str = "") -> List[ServedModel]:
        """Forwarded: never asked here."""
        _forwarded()

    def repository(self) -> List[RepositoryEntry]:
        """Forwarded: never asked here."""
        _forwarded()

    async def load(self, name: str, change: Optional[SpecChange] = None) -> None:
        """Forwarded: never asked here."""
        _forwarded()

    async def unload(self, name: str) -> None:
        """Forwarded: never asked here."""
        _forwarded()


def _forwarded() -> NoReturn:
    raise InferenceError.internal("a frontend process answered what the hub answers")
