"""The hub's side of one frontend process: its requests into the models' schedulers, their answers back.

Everything here runs on the hub's loop. A request costs no task of its own: it goes to its model's scheduler
with a sink (`RemoteSink`) that posts each answer to the frontend's outbox, which sends them a batch per loop
turn.

Large tensors cross without a copy here. Inputs the frontend read into its shared buffers are viewed in place
(ipc/segment_index.py), and the frontend is told when nothing here views a request's inputs any more
(RELEASED), so that it reuses the buffer only then: a model may keep an input. Outputs that lie in those
buffers (an identity's) are named there; other large outputs are copied once into a region of this link's
arena (ipc/regions.py), which the frontend views until its response is out (RETURNED).

A request with a long object (BYTES) input, which crosses in pickled pieces (protocol.py), has it rebuilt in a
thread (core/process_instances/long_outputs.off_loop), not on the loop; until then it and every request the frontend
sent after it wait here, in order (a sequence's requests must reach its model in the order they were sent).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import os
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from pytriton.core.backlog import Backlog
from pytriton.core.engine import Engine
from pytriton.core.errors import InferenceError
from pytriton.core.logs.log_budget import LogBudget
from pytriton.core.model import ModelState, ServedModel
from pytriton.core.process_instances.long_outputs import off_loop
from pytriton.core.request import InferenceResponse
from pytriton.core.request_spans import FrontendTrace, TracedResponse
from pytriton.core.scheduling.scheduler import Scheduler
from pytriton.core.sinks import ResponseSink
from pytriton.core.waiters import Room
from pytriton.ipc.calls import ABANDON, CALL, CREDIT, PROGRESS, REPLY, Calls, Handler
from pytriton.ipc.channel import LoopChannel, Message
from pytriton.ipc.outbox import BATCH, Outbox, items
from pytriton.ipc.regions import LendingArena
from pytriton.ipc.segment_index import SHARED_SEGMENTS
from pytriton.ipc.tensors import IN_ARENA, Buffer
from pytriton.runtime.frontends.log_records import handle_frontend_record
from pytriton.runtime.frontends.protocol import (
    ARENA,
    ARENA_PLACE,
    CANCEL,
    CLOSED,
    END,
    FORGET,
    INFER,
    INFER_PIECES,
    LOG,
    REFUSED,
    RELEASED,
    RETURNED,
    SEGMENT,
    SENT,
    SHARED_BYTES,
    STREAM_AHEAD,
    STREAM_AHEAD_BYTES,
    TAKEN,
    TOKENS,
    TRACED_RESPONSE,
    Pickled,
    failed,
    long_items,
    long_outputs,
    pack_response,
    pack_small_response,
    pickle_ahead,
    rebuild_long,
    unpack_request,
)

# The most of its arena a frontend's responses hold at once; past it, outputs are copied into the messages.
ARENA_BUDGET_BYTES = 256 * 2**20
# After a frontend could not map an arena (out of descriptors), its large outputs are copied for so long.
NO_LENDING_S = 1.0

_CLIENT_GONE = "the client disconnected before its response was ready"
_UNSENT = "the model's response could not be passed from the server's process to its frontend process"
_UNMAPPED = "the server could not map the buffer this request was read into (out of file descriptors?): send it again"
LOGGER = logging.getLogger("pytriton")


def _held_back_refusals(count: int, last: str) -> None:
    LOGGER.warning(
        "... and more receive buffers of frontend processes could not be mapped (%d); the last: %s", count, last
    )


class RemoteSink(ResponseSink):
    """Where a frontend's request answers: its outbox, under the request's key."""

    __slots__ = ("_ahead", "_done", "_later", "_link", "_room", "key", "model", "queued", "streaming", "taken")

    def __init__(self, link: FrontendLink, key: int, streaming: bool) -> None:
        self._link = link
        self.key = key
        self.streaming = streaming
        self.model: Optional[ServedModel] = None
        self.queued: Optional[ResponseSink] = None  # the sink the scheduler holds (one that fills the cache)
        self._done = False
        self._ahead: Optional[Backlog] = Backlog(STREAM_AHEAD, STREAM_AHEAD_BYTES) if streaming else None
        self.taken = 0  # responses of a stream the frontend said it took (TAKEN)
        self._room = Room()  # the model's stream waits there while it is far ahead
        # While a response's long object outputs are pickled off the loop: it and what the request posts after it,
        # in order (the future of each response's pickled pieces; None: ready).
        self._later: Optional[Deque[Tuple[Optional[asyncio.Future[Pickled]], Any, Sequence[Buffer], bool]]] = None

    def has_room(self) -> bool:
        """Whether the stream's responses the frontend has not taken leave room (core/backlog.py)."""
        return self._done or self._ahead is None or not self._ahead.full()

    async def room(self) -> None:
        """Wait until the frontend took responses enough (has_room), or the request ended."""
        await self._room.until(self.has_room)

    def overrun(self) -> bool:
        """Whether the responses the frontend has not taken passed the backlog's hard bound (Backlog.overrun)."""
        return not self._done and self._ahead is not None and self._ahead.overrun()

    def took(self, responses: int) -> None:
        """The frontend took so many of the stream's responses."""
        if responses > self.taken and self._ahead is not None:
            self._ahead.take(responses - self.taken)
            self.taken = responses
            if self._ahead.drained():
                self._room.wake()

    def done(self) -> bool:
        """Whether the request ended, or its client left."""
        return self._done

    def deliver(self, response: InferenceResponse) -> None:
        """Post a response (the last one of a plain request ends it)."""
        if self._done:
            return
        link = self._link
        packed = pack_small_response(self.key, response)  # the usual response; else FrontendLink's placing
        if packed is None and (self._later is not None or long_outputs(response)):
            self._pickle_off_loop(response)
        else:
            head, body = packed or link.pack_response(self.key, response)
            if type(response) is TracedResponse and not self.streaming and response.trace.claim():
                link.traces[self.key] = response.trace  # its record waits for the frontend's timestamps (SENT)
                head = (TRACED_RESPONSE, *head[1:])
            if self._later is None:
                link.outbox.post(head, body, link.response_unsent)
            else:  # after a response of this stream pickled off the loop
                self._later.append((None, head, body, True))
        if self._ahead is not None:
            self._ahead.add(response.nbytes())
        if not self.streaming:
            self._done = True
            link.sinks.pop(self.key, None)

    def fail(self, error: InferenceError, answered: bool = True) -> None:
        """Post the error that ends the request (`answered`: as its answer, not refused at its submission)."""
        if not self._done:
            self._post(failed(self.key, error, answered))
            self.end()

    def finish(self) -> None:
        """End the request: a stream's end, or (a plain request that got no response) an error."""
        if self._done:
            return
        if self.streaming:
            self._post((END, self.key))
            self.end()
        else:
            self.fail(InferenceError.internal("model returned no response"))

    def cancel(self) -> None:
        """The client left: out of the queue if it waits there (CANCELLED), its answers dropped if it runs."""
        if self._done:
            return
        self.fail(InferenceError.cancelled(_CLIENT_GONE))  # first: the scheduler then sees this request done
        if self.model is not None and self.queued is not None:
            # Counts it as cancelled when it was still queued; when it runs, its callable sees `is_cancelled()`,
            # and the inner calls of a batch whose every request is done are cancelled.
            self.model.scheduler.withdraw(self.queued)

    def _post(self, head: Any, body: Sequence[Buffer] = (), response: bool = False) -> None:
        """Post a message of the request (a `response`'s) now, or after the responses being pickled off the loop."""
        if self._later is None:
            self._link.outbox.post(head, body, self._link.response_unsent if response else None)
        else:
            self._later.append((None, head, body, response))

    def _pickle_off_loop(self, response: InferenceResponse) -> None:
        """Pickle a response's long object outputs in a thread; it is packed and posted then, in its turn."""
        if self._later is None:
            self._later = deque()
        future = off_loop(lambda: pickle_ahead(response))
        self._later.append((future, response, (), True))
        future.add_done_callback(self._pickled)

    def _pickled(self, _: object) -> None:
        """Post what is ready, in order, up to the first response still pickled."""
        later = self._later
        link = self._link
        while later:
            future, head, body, response_message = later[0]
            if future is not None:
                if not future.done():
                    return
                response = head
                try:
                    head, body = link.pack_response(self.key, response, future.result())
                except Exception as error:  # noqa: BLE001 - the request fails alone; what waits behind it goes on
                    head, body = failed(self.key, InferenceError.internal(f"{_UNSENT}: {error!r}"), True), ()
                    self.end()
                else:
                    if type(response) is TracedResponse and not self.streaming and response.trace.claim():
                        link.traces[self.key] = response.trace
                        head = (TRACED_RESPONSE, *head[1:])
            later.popleft()
            link.outbox.post(head, body, link.response_unsent if response_message else None)
        self._later = None

    def end(self) -> None:
        """The request ended here (its error is on its way): later responses are dropped."""
        self._done = True
        self._link.sinks.pop(self.key, None)
        self._room.wake()


class FrontendLink:
    """The hub's end of one frontend process's channel."""

    def __init__(
        self, engine: Engine, channel: LoopChannel, loop: asyncio.AbstractEventLoop, handlers: Dict[str, Handler]
    ) -> None:
        """Serve the frontend's requests on `engine`; answer its calls with `handlers`."""
        self._engine = engine
        self.channel = channel
        self.outbox = Outbox(channel, loop)
        self.calls = Calls(self.outbox, handlers)
        self.response_unsent = self._response_unsent  # one bound method for every response posted
        self.sinks: Dict[int, RemoteSink] = {}
        self.traces: Dict[int, FrontendTrace] = {}  # key: the trace file record of a TRACED_RESPONSE, until SENT
        self.closed = False
        self.open = {"http": 0, "grpc": 0}  # connections handed to the frontend that it has not said closed
        self._loop = loop
        # The frontend's buffers, mapped in the hub's registry (process instances read them too): its ids, ours.
        self._segments: Dict[int, int] = {}
        self._theirs: Dict[int, int] = {}  # ours: its
        self._arena = LendingArena(ARENA_BUDGET_BYTES)
        self._no_lending_until = 0.0  # the frontend could not map an arena: outputs are copied until then
        # Requests whose inputs are viewed in the frontend's buffers: key -> the regions viewed, their weak refs.
        self._viewed: Dict[int, Dict[int, weakref.ref[np.ndarray]]] = {}
        # Regions no longer viewed (weak references' callbacks append, on whichever thread let go last).
        self._let_go: Deque[Tuple[int, int]] = deque()
        self._releasing = False
        self._loans = itertools.count(1)
        self._unpacking = 0  # the key of the request being unpacked (_view_unpacking)
        # The model version each (name, version) named last, while it is ready: the engine's lookup costs a
        # microsecond a request. A version the engine stops serving leaves READY at once (unloaded, retired for
        # its replacement, removed), on this loop, so a ready one found here is still the one it serves.
        self._ready: Dict[Tuple[str, str], ServedModel] = {}
        self._view_unpacking_input = self._view_unpacking
        self._held: List[Scheduler] = []  # the schedulers held while a message's requests are queued
        self._refused: Set[int] = set()  # the frontend's buffers that could not be mapped here (REFUSED)
        self._refusals = LogBudget(_held_back_refusals)
        # INFER messages waiting for their long object inputs to be rebuilt (the future; None: none to rebuild), and
        # every one after them, in order; the keys of those among them whose clients left.
        self._rebuilding: Deque[Tuple[Any, memoryview, Optional[asyncio.Future[Dict[str, np.ndarray]]]]] = deque()
        self._left_while_rebuilding: Set[int] = set()
        # An INFER's way: `_behind` while requests wait for their rebuilt inputs.
        self._take: Callable[[Any, memoryview, Optional[List[Scheduler]]], None] = self._infer

    def on_message(self, message: Message) -> None:
        """Requests, cancels and calls from the frontend."""
        if message.head[0] == SEGMENT:
            self._adopt(message)
            return
        # A batch's requests start together (Scheduler.hold): the first would start alone on an idle instance.
        held = self._held if message.head[0] == BATCH and len(message.head[1]) > 1 else None
        try:
            self._on_items(message, held)
        finally:
            if held:
                for scheduler in held:
                    scheduler.release()
                held.clear()

    def _on_items(self, message: Message, held: Optional[List[Scheduler]]) -> None:
        """Each message of a batch (or the one message)."""
        for head, body in items(message):
            tag = head[0]
            if tag == INFER:
                self._take(head, body, held)
            elif tag == CANCEL:
                sink = self.sinks.get(head[1])
                if sink is not None:
                    sink.cancel()
                elif self._rebuilding:
                    self._left_while_rebuilding.add(head[1])
            elif tag == RETURNED:
                for loan in head[1]:
                    self._arena.give_back(loan)
            elif tag == FORGET:
                self._forget(head[1])
            elif tag == CLOSED:
                self.open[head[1]] -= 1
            elif tag == TOKENS:
                self._tokens(head)
            elif tag == REFUSED:  # the frontend could not map the arena (head[1] is ARENA_PLACE)
                self._arena.close()
                self._no_lending_until = time.monotonic() + NO_LENDING_S
            elif tag == TAKEN:
                sink = self.sinks.get(head[1])
                if sink is not None:
                    sink.took(head[2])
            elif tag == SENT:
                trace = self.traces.pop(head[1], None)
                if trace is not None:
                    if head[2]:
                        trace.sent(head[2], head[3])
                    else:
                        trace.abandon()
            elif tag == LOG:
                handle_frontend_record(head[1])
            elif tag == INFER_PIECES:
                self._rebuild(head, body)
            elif tag == CALL:
                self.calls.on_call(head)
            elif tag == REPLY:
                self.calls.on_reply(head)
            elif tag == ABANDON:
                self.calls.on_abandon(head)
            elif tag == PROGRESS:
                self.calls.on_progress(head)
            elif tag == CREDIT:
                self.calls.on_credit(head)

    def _rebuild(self, head: Any, body: memoryview) -> None:
        """Rebuild an INFER_PIECES's long object inputs off the loop; the request waits, in order, until then."""
        pieces = long_items(head[5])
        future = off_loop(lambda: rebuild_long(pieces, body))
        future.add_done_callback(self._rebuilt)
        self._rebuilding.append((head, body, future))
        self._take = self._behind

    def _behind(self, head: Any, body: memoryview, _: Optional[List[Scheduler]]) -> None:
        """An INFER that came while requests wait for their rebuilt inputs: it waits after them."""
        self._rebuilding.append((head, body, None))

    def _rebuilt(self, _: object) -> None:
        """Queue the requests whose inputs are ready, in the order they came, up to the first still rebuilt."""
        waiting = self._rebuilding
        while waiting and (waiting[0][2] is None or waiting[0][2].done()):
            head, body, future = waiting.popleft()
            if self.closed:
                continue
            key = head[1]
            if key in self._left_while_rebuilding:
                self._left_while_rebuilding.discard(key)
                self.outbox.post(failed(key, InferenceError.cancelled(_CLIENT_GONE), True))
                self.outbox.post((RELEASED, [key]))
                continue
            long_arrays = None
            if future is not None:
                try:
                    long_arrays = future.result()
                except Exception as error:  # noqa: BLE001 - a message of pieces that do not make the array
                    self.outbox.post(failed(key, InferenceError.invalid(f"{error}"), False))
                    self.outbox.post((RELEASED, [key]))
                    continue
            try:
                self._infer(head, body, None, long_arrays)
            except Exception:
                LOGGER.exception("a request of a frontend process could not be queued")
                self.outbox.post(failed(key, InferenceError.internal("the request could not be queued"), False))
        if not waiting:
            self._left_while_rebuilding.clear()
            self._take = self._infer

    def _infer(
        self,
        head: Any,
        body: memoryview,
        held: Optional[List[Scheduler]],
        long_arrays: Optional[Dict[str, np.ndarray]] = None,
    ) -> None:
        """Queue one request on its model (or answer at once: an error, a cached response).

        With `held`, the model's scheduler is held (added there), so that the message's requests start together.
        `long_arrays`: its long object inputs, rebuilt (`_rebuild`).
        """
        key, name, version, streaming = head[1], head[2], head[3], head[12]
        sink = RemoteSink(self, key, streaming)
        self.sinks[key] = sink
        try:
            model = self._ready.get((name, version))
            if model is None or model.state is not ModelState.READY:
                model = self._model(name, version, head[14])
                if model.state is ModelState.READY:
                    self._ready[(name, version)] = model
            sink.model = model
            if held is not None:
                scheduler = model.scheduler
                if scheduler not in held:
                    scheduler.hold()
                    held.append(scheduler)
            self._unpacking = key
            try:
                request = unpack_request(head, body, self._view_unpacking_input, long_arrays)
            except ValueError as error:
                raise InferenceError.invalid(str(error)) from None
            try:  # the frontend checked it against the spec it knew, maybe one a load's override replaced since
                model.admit(request)
            except InferenceError as error:
                raise error.for_request(request.id) from None  # as the frontend's decode names its errors
            sink.queued = model.submit(request, sink, streaming)
            if sink.queued is None and streaming:
                sink.finish()  # the response cache answered: that response is the stream's only one
        except InferenceError as error:
            sink.fail(error, answered=False)
            if key not in self._viewed:  # nothing here views its inputs: the frontend may use its buffers again
                self.outbox.post((RELEASED, [key]))

    def _model(self, name: str, version: str, named: bool) -> ServedModel:
        """The version the frontend found for a request; out of service, the error one process gives its request.

        The frontend may not have heard yet that the version went out of service (unloaded). A request that named
        no version gets the answer to one naming none when no version is in service (404, not the named one's 503).
        """
        try:
            return self._engine.model(name, version)
        except InferenceError:
            if not named:
                self._engine.model(name)  # raises Triton's words for a request naming none, unless one is in service
            raise

    def _adopt(self, message: Message) -> None:
        """Map a receive buffer the frontend made; one that cannot be mapped here is refused, not fatal.

        Out of descriptors, the kernel drops the one a message carries (or `dup` and `mmap` fail): the frontend
        is told (REFUSED), and its requests in that buffer travel in their messages from then on. Those it sent
        before it heard are answered 503.
        """
        _, segment_id, size = message.head
        try:
            if len(message.fds) != 1:
                raise OSError(errno.EMFILE, f"its descriptor did not arrive ({len(message.fds)} of 1)")
            ours = SHARED_SEGMENTS.adopt(message.fds[0], size)
        except OSError as error:
            for fd in message.fds:
                os.close(fd)
            self._refused.add(segment_id)
            self.outbox.post((REFUSED, segment_id))
            line = f"a receive buffer of a frontend process could not be mapped ({error}): its requests are copied"
            if self._refusals.admit(line):
                LOGGER.warning("%s", line)
            return
        self._segments[segment_id] = ours
        self._theirs[ours] = segment_id

    def _tokens(self, head: Any) -> None:
        """A generation the frontend served through the OpenAI API: counted here, once."""
        _, name, version, first_token_ns, gaps_ns, output_tokens, prompt_tokens = head
        try:
            model = self._engine.model(name, version)
        except InferenceError:
            return  # unloaded meanwhile: nothing counts it any more
        model.record_tokens(first_token_ns, gaps_ns, output_tokens, prompt_tokens)

    def _view_unpacking(self, where: int, offset: int, nbytes: int, dtype: np.dtype, shape: Any) -> np.ndarray:
        """`_view_input` for the request being unpacked (one bound method for all: no partial per request)."""
        return self._view_input(self._unpacking, where, offset, nbytes, dtype, shape)

    def _view_input(self, key: int, where: int, offset: int, nbytes: int, dtype: np.dtype, shape: Any) -> np.ndarray:
        """An input in the frontend's buffer, viewed where it lies until every view of it is gone."""
        ours = self._segments.get(where)
        if ours is None:
            if where in self._refused:
                raise InferenceError.unavailable(_UNMAPPED)
            raise ValueError(f"a tensor in shared memory segment {where}, which was never sent")
        region = SHARED_SEGMENTS.region(ours, offset, nbytes)
        regions = self._viewed.setdefault(key, {})
        regions[id(region)] = weakref.ref(region, functools.partial(self._gone, (key, id(region))))
        return region.view(dtype).reshape(shape)

    def _gone(self, token: Tuple[int, int], _: object) -> None:
        """A region of a request's inputs is no longer viewed (any thread): say so on the loop."""
        if self.closed:
            return
        self._let_go.append(token)
        if not self._releasing:
            self._releasing = True
            try:
                self._loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop has closed: the frontend is gone with it
                pass

    def _release(self) -> None:
        """Tell the frontend which requests' inputs nothing here views any more."""
        self._releasing = False
        released = []
        while self._let_go:
            key, region = self._let_go.popleft()
            regions = self._viewed.get(key)
            if regions is not None:
                regions.pop(region, None)
                if not regions:
                    del self._viewed[key]
                    released.append(key)
        if released and not self.closed:
            self.outbox.post((RELEASED, released))

    def _forget(self, segment_id: int) -> None:
        """The frontend let go of a buffer."""
        self._refused.discard(segment_id)
        ours = self._segments.pop(segment_id, None)
        if ours is not None:
            del self._theirs[ours]
            SHARED_SEGMENTS.forget(ours)

    def _response_unsent(self, head: Any, error: Exception) -> Tuple[Any, Sequence[Buffer]]:
        """What goes in place of a response whose message did not pickle (Outbox.post's `unsent`): its error.

        An object output's elements are bytes or str by then (protocol.plain_objects), unless one's str raised. Only
        that request fails (a stream ends): the batch's other messages go on. The region of the arena the message
        named, which the frontend never saw, is free again.
        """
        key, loan = head[1], head[5]
        if loan:
            self._arena.give_back(loan)
        trace = self.traces.pop(key, None)
        if trace is not None:
            trace.abandon()  # the frontend says nothing of a failed request's send
        sink = self.sinks.get(key)  # a stream's, still going
        if sink is not None:
            sink.end()
        reason = f"{type(error).__name__}: {error}"
        return failed(key, InferenceError.internal(f"{_UNSENT}: {reason}"), True), ()

    def pack_response(
        self, key: int, response: InferenceResponse, pickled: Optional[Pickled] = None
    ) -> Tuple[Any, Any]:
        """A response's message: large outputs named where they lie, or lent a region of the arena.

        `pickled`: its long object outputs' pieces, pickled ahead off the loop (protocol.pickle_ahead).
        """
        small = pack_small_response(key, response)
        if small is not None:  # the usual small response: every output in the message
            return small
        placed: Dict[int, Tuple[int, int]] = {}
        lend = {}
        loan = 0
        for output in response.outputs:
            array = output.array
            if type(array) is np.ndarray and array.nbytes >= SHARED_BYTES and not array.dtype.hasobject:
                found = SHARED_SEGMENTS.locate(array)
                theirs = self._theirs.get(found[0]) if found is not None else None
                if found is not None and theirs is not None:  # in this frontend's buffer (not another's: cached)
                    placed[id(array)] = (theirs, found[1])
                else:
                    lend[output.name] = array
        if lend and time.monotonic() >= self._no_lending_until:
            loan = next(self._loans)
            packed, _, new_arena, lent = self._arena.lend([lend], loan)
            if new_arena and self._arena.segment is not None:
                self.outbox.send_now((ARENA, new_arena), fds=[self._arena.segment.fileno()])
            if lent:
                for name, ref in packed[0][0].items():
                    if ref[0] == IN_ARENA:
                        placed[id(lend[name])] = (ARENA_PLACE, ref[1])
            else:
                loan = 0  # no room: copied into the message
        return pack_response(key, response, lambda array: placed.get(id(array)), loan, pickled)

    def close(self) -> None:
        """The frontend is gone: its requests leave the queues, and what runs for it is answered to no one."""
        self.closed = True
        self.calls.close()
        self._rebuilding.clear()
        for sink in list(self.sinks.values()):
            sink.cancel()
        self.sinks.clear()
        traces, self.traces = self.traces, {}
        for trace in traces.values():  # responses the frontend never said it sent: their records are written
            trace.abandon()
        for segment_id in list(self._segments):
            self._forget(segment_id)  # unmapped once the requests that view them are gone
        self._arena.close()
