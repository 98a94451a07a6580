"""ModelStreamInfer: the requests of a stream run concurrently, up to a bound; one writer sends the responses.

As tritonserver's stream, the answers of requests to models that are not decoupled leave in the order the
requests came (a fast request's answer waits for a slow one's before it, tritonserver 2.51 asked); a decoupled
model's responses leave as they come. At the bound (requests running, or answered and waiting for their turn)
the session reads no further request until one is sent: the unread requests wait in the call (holding its
HTTP/2 window), so a client cannot start more work on one stream than the bound. Answers wait for the writer
in a queue of at most OUTBOX_RESPONSES: past it a request takes no further response from its model (whose
generator then waits) and the reader no further request, so a client that reads none of its answers holds the
work of its stream, not a growing queue of answers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Any, AsyncIterator, Deque, List, Mapping, Optional, Set

from pytriton.core.errors import FailureReason, InferenceError
from pytriton.core.serving import ServingEngine
from pytriton.core.shared_memory.off_loop import read_off_loop, write_off_loop
from pytriton.core.shared_memory.system import Read, WriteRun
from pytriton.core.spec import ModelSpec
from pytriton.core.waiters import Room, wake
from pytriton.protocol import grpc_codec
from pytriton.protocol.codec_place import ON_LOOP, OffLoop
from pytriton.transport.grpc import coding
from pytriton.transport.grpc.errors import status_of
from pytriton.transport.grpc.wire import InferRequestFrame

_END = object()
# Requests of one stream in progress at once, unless the server's limits say otherwise.
DEFAULT_STREAM_REQUESTS = 128
# Answers that wait for the stream's writer before its requests stop taking more from their models.
OUTBOX_RESPONSES = 32


class _Turn:
    """One request's place in the stream's answer order, and its answers held until those before it are sent."""

    __slots__ = ("done", "held", "in_order")

    def __init__(self) -> None:
        self.done = False  # its answers are all in `held` (or it left the order): they may be sent
        self.held: List[Any] = []
        self.in_order = True  # a decoupled model's request leaves the order: its responses go as they come


class StreamSession:
    """One ModelStreamInfer call: requests run concurrently, their answers leave in request order."""

    def __init__(
        self,
        engine: ServingEngine,
        forwarded_headers: Optional[Mapping[str, str]],
        max_requests: int = DEFAULT_STREAM_REQUESTS,
    ) -> None:
        """Create a session for a stream whose metadata forwarded `forwarded_headers`."""
        self._engine = engine
        self._forwarded = forwarded_headers
        self._max_requests = max_requests
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: Set[asyncio.Task[None]] = set()
        self._order: Deque[_Turn] = deque()  # the requests whose answers are not sent yet, oldest first
        self._slot: Optional[asyncio.Future[None]] = None  # the reader waits on it while at the bound
        self._room = Room()  # requests wait there while the outbox is full
        self._reading = True
        self._broken: Optional[Exception] = None  # why the request stream broke: the call's status once all answered

    async def serve(self, requests: AsyncIterator[InferRequestFrame], context: Any) -> None:
        """Read requests, start each one, write responses until the client is done and every request ended."""
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(requests, loop))
        try:
            while True:
                item = await self._outbox.get()
                if self._outbox.qsize() < OUTBOX_RESPONSES:
                    self._room.wake()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                await context.write(item)
        finally:
            item = None  # a cancelled write's traceback holds this frame: not the answer too
            reader.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(reader, *self._tasks, return_exceptions=True)
            self._drop_answers()

    def _drop_answers(self) -> None:
        """Let go of the answers never written (the client left), now rather than when the session is collected.

        A cancelled handler's traceback holds the session in a reference cycle, which only the cycle collector
        frees, maybe minutes later: a stream whose client left with its answers of 8 MiB queued (up to the bound
        of requests, and OUTBOX_RESPONSES more) held 1.3 GB until a full collection.
        """
        while not self._outbox.empty():
            self._outbox.get_nowait()
        for turn in self._order:
            turn.held.clear()  # each is still a local of its request's finished task
        self._order.clear()

    async def _read(self, requests: AsyncIterator[InferRequestFrame], loop: asyncio.AbstractEventLoop) -> None:
        """Start a task per request until the client half-closes the stream."""
        try:
            async for frame in requests:
                turn = _Turn()
                self._order.append(turn)
                if isinstance(frame, InferenceError):  # a message that failed to parse: the stream stays open
                    turn.held.append(grpc_codec.stream_error("", frame.message))
                    turn.done = True
                    self._send_ready()
                    await self._outbox_room()  # its errors wait for the writer as answers do: read no more meanwhile
                    continue
                task = loop.create_task(self._serve_one(frame, turn))
                self._tasks.add(task)
                task.add_done_callback(self._request_done)
                del frame
                while len(self._tasks) >= self._max_requests or len(self._order) >= self._max_requests:
                    self._slot = loop.create_future()
                    await self._slot
        except Exception as error:  # noqa: BLE001 - a broken request stream ends the call with its error
            # once the requests before it are answered: tritonserver 2.51 answers those (probed)
            self._broken = error
        self._reading = False
        self._end_if_idle()

    async def _outbox_room(self) -> None:
        """Wait while OUTBOX_RESPONSES answers wait for the writer."""
        if not self._outbox_has_room():
            await self._room.until(self._outbox_has_room)

    def _outbox_has_room(self) -> bool:
        return self._outbox.qsize() < OUTBOX_RESPONSES

    def _request_done(self, task: asyncio.Task[None]) -> None:
        """Forget a finished request; the reader may take the next one."""
        self._tasks.discard(task)
        wake(self._slot)
        self._end_if_idle()

    def _end_if_idle(self) -> None:
        """End the call once the client stopped sending and every request has been answered."""
        if not self._reading and not self._tasks and not self._order:
            self._outbox.put_nowait(_END if self._broken is None else self._broken)

    def _answer(self, turn: _Turn, item: Any) -> None:
        """Send an answer of a request now, or hold it for its turn."""
        if turn.in_order:
            turn.held.append(item)
        else:
            self._outbox.put_nowait(item)

    def _send_ready(self) -> None:
        """Send the held answers of the oldest requests that are done, up to the first one still running."""
        order = self._order
        sent = False
        while order and order[0].done:
            held = order.popleft().held
            for item in held:
                self._outbox.put_nowait(item)
            held.clear()  # the turn may outlive its answers (a cancelled task's traceback holds it)
            sent = True
        if sent:
            wake(self._slot)

    async def _serve_one(self, frame: InferRequestFrame, turn: _Turn) -> None:
        """Run one request and queue its responses (or its error) for the writer."""
        put = partial(self._answer, turn)
        message = frame.message
        request_id = message.id
        asked_version = message.model_version
        reached: Optional[ModelSpec] = None  # the model, once the request is in its hands
        found: Optional[ModelSpec] = None  # the model, once looked up
        try:
            model = self._engine.model(message.model_name, message.model_version)
            spec = found = model.spec
            if spec.decoupled:  # its responses leave as they come, as tritonserver's do
                turn.in_order = False
                turn.done = True
                self._send_ready()
            memory = self._engine.system_memory
            deferred: List[Read] = []
            try:
                decoded = grpc_codec.decode_infer_request(
                    spec, message, frame.raw_inputs, self._forwarded, memory, frame.data, deferred, ON_LOOP
                )
            except OffLoop:  # many strings: read in a worker thread, the other clients served meanwhile
                decoded = await coding.decoded(
                    spec, message, frame.raw_inputs, self._forwarded, memory, frame.data, deferred
                )
            del frame, message  # the inputs live in the engine request now; do not hold the wire message too
            held = decoded.regions and [where.region for where in decoded.regions.values()]
            if held:  # its output regions stay registered until they are written, as Triton keeps them
                memory.hold(held)
            try:
                if deferred:  # inputs too large to copy on the loop
                    await read_off_loop(deferred)
                responses = model.stream(decoded.request)
            except BaseException:
                if held:
                    memory.release(held)
                raise
            reached = spec
            final_sent = False
            try:
                async for response in responses:
                    final_sent = response.final
                    writes: List[WriteRun] = []
                    try:
                        encoded = grpc_codec.encode_infer_response(
                            spec, request_id, response, response.final, decoded, memory, writes, ON_LOOP
                        )
                    except OffLoop:
                        encoded = await coding.encoded(
                            spec, request_id, response, response.final, decoded, memory, writes
                        )
                    if writes:  # outputs too large to copy on the loop
                        await write_off_loop(writes)
                    put(encoded)
                    del response
                    await self._outbox_room()
            finally:
                if held:
                    memory.release(held)
                await _aclose(responses)
            if decoded.options.empty_final_response and not final_sent:
                put(grpc_codec.empty_final_response(spec, request_id, asked_version))
        except Exception as error:  # noqa: BLE001 - an error is a stream message; the stream stays open
            _, text = status_of(error)
            # Triton's response callback answers these: the model failed, or its answer did (`in_response`: a
            # string the model could not read, a class count of an output without order).
            model_failed = None
            if isinstance(error, InferenceError):
                if error.reason is FailureReason.BACKEND:
                    model_failed = reached
                elif error.in_response:
                    model_failed = found
            put(grpc_codec.stream_error(request_id, text, model_failed, asked_version))
        finally:
            turn.done = True
            self._send_ready()
        await self._outbox_room()  # the request keeps its slot while too many answers wait for the writer


async def _aclose(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator so its producer stops (a no-op for other iterators)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
