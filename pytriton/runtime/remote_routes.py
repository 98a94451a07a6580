"""Custom routes whose handlers run in a RemoteTriton's process: the server's end and the RemoteTriton's end.

Each route is one connection to the server's attach socket (runtime/attach.py): (ATTACH_ROUTE, AttachRoute),
answered (ACCEPTED, 0) once the route is in the server's table, or (BIND_FAILED, message, kind). Then:

- server to RemoteTriton: (ROUTE_REQUEST, request id, method, path, path parameters, query, headers) with the
  body in the message's body; (ROUTE_CANCEL, request id) once the request's HTTP client has left.
- RemoteTriton to server: (ROUTE_ANSWER, request id, status, headers, media type) with the response's body;
  (MODEL_CALL, request id, ...) for a handler's call to a bound model, answered (MODEL_ANSWER, ...) on the
  request's own call path. Model calls are a process instance's (core/process_instances/model_calls.py): tensors
  over COPY_BYTES through shared memory, lent both ways, and the regions let go of said back (CALLS_READ, also
  before a ROUTE_REQUEST; ANSWERS_READ, also before a ROUTE_ANSWER).

The route leaves the table when its connection closes (the RemoteTriton closed, or its process died): requests
then waiting are answered 503, later ones 404.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
import itertools
import logging
import os
import queue
import threading
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import orjson

from pytriton.core.composition.async_callers import use_async_caller_here
from pytriton.core.composition.path import CURRENT, CallArguments, CallPath, ModelCallError
from pytriton.core.composition.process_callers import use_caller_here
from pytriton.core.daemon_threads import DaemonThreads
from pytriton.core.errors import InferenceError, Status, exception_text
from pytriton.core.process_instances.model_calls import Answer, CalleeArenas, CallerArenas, answered, serve_call
from pytriton.core.process_instances.protocol import ANSWERS_READ, CALLS_READ, MODEL_ANSWER, MODEL_CALL
from pytriton.ipc.channel import BlockingChannel, ChannelClosed, LoopChannel, Message, encode
from pytriton.ipc.tensors import Buffer
from pytriton.options.routes import CustomRoutes, Route
from pytriton.transport.http.custom import RouteRequest, RouteResponse, response_of

LOGGER = logging.getLogger("pytriton")

ROUTE_REQUEST, ROUTE_ANSWER, ROUTE_CANCEL = 31, 32, 33
# How many sync handlers of one route run at once in the RemoteTriton's process.
_SYNC_WORKERS = 8


@dataclasses.dataclass(frozen=True)
class AttachRoute:
    """A route a RemoteTriton adds to the server."""

    version: str
    path: str
    methods: Tuple[str, ...]
    token: Optional[str]
    arena_budget: int  # the most shared memory each side's arena for the handlers' model calls may take


# -- the server's end ---------------------------------------------------------------------------------------


class ServedRoute:
    """On the server: the handler of a route whose own handler runs in a RemoteTriton's process."""

    def __init__(self, channel: LoopChannel, path: str, routes: CustomRoutes, arena_budget: int) -> None:
        """Serve `path` through `channel`; `routes`: the table the route is added to (and leaves).

        `arena_budget`: the most the answer arena of the handlers' model calls takes (0: their tensors in the body).
        """
        self._channel = channel
        self._path = path
        self._routes = routes
        self.route: Optional[Route] = None
        self._ids = itertools.count(1)
        self._waiting: Dict[int, Tuple[asyncio.Future[RouteResponse], Optional[CallPath]]] = {}
        self._calls = CalleeArenas(arena_budget)

    async def __call__(self, request: RouteRequest) -> RouteResponse:
        """Have the RemoteTriton answer one request; its client's leaving cancels it there too."""
        if self._channel.closed:
            raise self._gone()
        request_id = next(self._ids)
        future: asyncio.Future[RouteResponse] = asyncio.get_running_loop().create_future()
        source = CURRENT.get()  # the handler's call path, which its model calls run on
        self._waiting[request_id] = (future, None if source is None else source.call_path())
        head = (ROUTE_REQUEST, request_id, request.method, request.path, request.path_params, request.query)
        try:
            calls_read = self._calls.take_read()
            if calls_read:  # the last model calls' inputs, let go of after their answers went
                self._channel.send((CALLS_READ, calls_read))
            self._channel.send((*head, request.headers), [request.body] if request.body else ())
            return await future
        except ChannelClosed:
            raise self._gone() from None
        except asyncio.CancelledError:
            if not self._channel.closed:
                with contextlib.suppress(ChannelClosed):
                    self._channel.send((ROUTE_CANCEL, request_id))
            raise
        finally:
            self._waiting.pop(request_id, None)

    def close(self) -> None:
        """Drop the route (the server stops)."""
        self._channel.close()

    def _gone(self) -> InferenceError:
        return InferenceError.unavailable(f"the RemoteTriton that served route '{self._path}' is gone")

    def on_message(self, message: Message) -> None:
        """An answer, a handler's model call, or the model calls' answers it no longer views."""
        head = message.head
        tag = head[0]
        if tag == MODEL_CALL:  # its descriptor, if any, is the caller's new call arena
            waiting = self._waiting.get(head[1])
            serve_call(self._calls, message, waiting[1] if waiting is not None else None, self._live_channel)
            return
        for fd in message.fds:
            os.close(fd)
        if tag == ROUTE_ANSWER:
            _, request_id, status, headers, media_type = head
            waiting = self._waiting.get(request_id)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result(RouteResponse(bytes(message.body), status, headers, media_type))
        elif tag == ANSWERS_READ:
            self._calls.answers_read(head[1])

    def _live_channel(self) -> Optional[LoopChannel]:
        """The route's connection while it is open (model calls' answers go there), else None."""
        return None if self._channel.closed else self._channel

    def on_closed(self) -> None:
        """The RemoteTriton closed the route (or died): it leaves the table; requests waiting get 503."""
        self._calls.close()  # what inner requests still view stays mapped until they are gone
        if self.route is not None:
            self._routes.remove_route(self.route)
            LOGGER.info("RemoteTriton closed: route '%s' removed", self._path)
        waiting, self._waiting = self._waiting, {}
        for future, _ in waiting.values():
            if not future.done():
                future.set_exception(self._gone())


# -- the RemoteTriton's end ---------------------------------------------------------------------------------


class _Running:
    """A request whose handler runs here: its cancel, and the answers to its model calls in flight."""

    __slots__ = ("calls", "cancelled", "future", "request_id")

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.cancelled = False
        self.calls: Dict[int, Callable[[Optional[Answer]], None]] = {}
        self.future: Optional[concurrent.futures.Future[Any]] = None


class RouteHost:
    """In a RemoteTriton's process: answers one route's requests with its handler, over the route's connection.

    A thread reads the connection. An `async def` handler runs on an event loop of the route's own, a plain one
    in a pool of worker threads. Each may call bound models (pytriton.compose): the call goes to the server
    over this connection, on the request's call path there.
    """

    def __init__(self, channel: BlockingChannel, handler: Callable[..., Any], arena_budget: int) -> None:
        """Answer with `handler` what comes over `channel` (the route is in the server's table already).

        `arena_budget`: the most the call arena of the handler's model calls takes (0: their tensors in the body).
        """
        self.channel = channel
        self._handler = handler
        self._async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)
        self._sending = threading.Lock()  # also packs a model call's inputs: see CallerArenas
        self._calls = CallerArenas(arena_budget)
        self._closed = False  # under _sending: the call arena is released, no call is packed any more
        self._lock = threading.Lock()
        self._running: Dict[int, _Running] = {}
        self._call_ids = itertools.count(1)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._pool: Optional[DaemonThreads] = None
        if self._async:
            loop = self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=loop.run_forever, name="pytriton-remote-route", daemon=True)
            self._loop_thread.start()
        else:
            self._pool = DaemonThreads(_SYNC_WORKERS, "pytriton-route")
        self.gone = threading.Event()  # the server closed the route (it stopped)

    def serve(self) -> None:
        """Answer requests until the connection closes; then give up the requests still running."""
        try:
            while True:
                self._take(self.channel.receive())
        except (ChannelClosed, OSError):
            pass
        finally:
            self.gone.set()
            with self._lock:
                running = list(self._running.values())
            for item in running:
                self._cancel(item)
            self.channel.close()
            with self._sending:
                self._closed = True
                self._calls.close()
            if self._pool is not None:
                self._pool.shutdown()
            if self._loop is not None:
                asyncio.run_coroutine_threadsafe(_stop_loop(), self._loop)

    def _take(self, message: Message) -> None:
        head = message.head
        tag = head[0]
        if tag == ROUTE_REQUEST:
            _, request_id, method, path, params, query, headers = head
            request = RouteRequest(method, path, params, query, headers, bytes(message.body))
            item = _Running(request_id)
            with self._lock:
                self._running[request_id] = item
            if self._loop is not None:
                item.future = asyncio.run_coroutine_threadsafe(self._run_async(item, request), self._loop)
            else:
                assert self._pool is not None
                self._pool.submit(functools.partial(self._run_sync, item, request))
        elif tag == ROUTE_CANCEL:
            with self._lock:
                found = self._running.get(head[1])
            if found is not None:
                self._cancel(found)
        elif tag == MODEL_ANSWER:  # every one, wanted or not, in order: one may bring the arena that others name
            with self._lock:
                deliver = next(
                    (item.calls.get(head[1]) for item in self._running.values() if head[1] in item.calls), None
                )
            answer = self._calls.take_answer(message, deliver is not None)
            if deliver is not None:
                deliver(answer)
        elif tag == CALLS_READ:
            self._calls.calls_read(head[1])

    def _cancel(self, item: _Running) -> None:
        """The request's client left: an async handler is cancelled; a sync one's model calls fail from now on."""
        item.cancelled = True
        if self._loop is not None:
            if item.future is not None:
                item.future.cancel()  # its model calls in flight end with it
            return
        with self._lock:
            delivers = list(item.calls.values())
        for deliver in delivers:
            deliver(None)

    async def _run_async(self, item: _Running, request: RouteRequest) -> None:
        use_caller_here(lambda arguments: self._call_sync(item, arguments))
        use_async_caller_here(lambda arguments: self._call_async(item, arguments))
        try:
            value = await self._handler(request)
        except asyncio.CancelledError as error:
            if not item.cancelled:  # the handler's own: its client waits for an answer
                self._answer(item, None, error)
                return
            self._forget(item)
            return  # the server answers nobody: its client left
        except BaseException as error:  # noqa: BLE001 - the client gets it as an error answer
            self._answer(item, None, error)
            return
        self._answer(item, value, None)

    def _run_sync(self, item: _Running, request: RouteRequest) -> None:
        use_caller_here(lambda arguments: self._call_sync(item, arguments))  # a worker thread's: reset below
        try:
            value = self._handler(request)
        except BaseException as error:  # noqa: BLE001 - the client gets it as an error answer
            self._answer(item, None, error)
            return
        finally:
            use_caller_here(None)
        self._answer(item, value, None)

    def _forget(self, item: _Running) -> None:
        with self._lock:
            self._running.pop(item.request_id, None)

    def _answer(self, item: _Running, value: Any, error: Optional[BaseException]) -> None:
        """Send the handler's answer (an error as {"error": ...} with its status); nothing once its client left."""
        self._forget(item)
        if item.cancelled:
            return
        if error is None:
            try:
                response = response_of(value)
            except Exception as failure:  # noqa: BLE001 - not JSON-able: the client gets a 500
                error = failure
        if error is not None:
            if isinstance(error, InferenceError):
                status, message = error.status.http_status, error.message
            else:
                LOGGER.error("custom route handler failed", exc_info=error)
                text = exception_text(error)
                status, message = 500, f"{type(error).__name__}: {text}" if text else type(error).__name__
            response = RouteResponse(orjson.dumps({"error": message}), status, media_type="application/json")
        head = (ROUTE_ANSWER, item.request_id, response.status, response.headers, response.media_type)
        sent: List[Buffer] = encode(head, [response.body] if response.body else [])
        with self._sending, contextlib.suppress(ChannelClosed, OSError):
            read = self._calls.take_answers_read()  # the model calls' answers nothing here views any more
            if read:
                sent = [*encode((ANSWERS_READ, read)), *sent]
            self.channel.send_encoded(sent)

    def _open_call(self, item: _Running, deliver: Callable[[Optional[Answer]], None], arguments: CallArguments) -> int:
        """Send a model call of the request's handler; its answers go to `deliver` (None: the request ended)."""
        call_id = next(self._call_ids)
        with self._lock:  # a cancel either sees the call (`deliver` gets None) or was seen here
            if item.cancelled:
                raise ModelCallError(Status.CANCELLED, "the route's request was cancelled: its client left")
            item.calls[call_id] = deliver
        try:
            with self._sending:
                if self._closed:
                    raise ModelCallError(Status.UNAVAILABLE, "the server closed the route")
                message, fds = self._calls.call_message(item.request_id, call_id, arguments)
                try:
                    self.channel.send_encoded(message, fds)
                except (ChannelClosed, OSError):
                    raise ModelCallError(Status.UNAVAILABLE, "the server closed the route") from None
        except BaseException:
            self._close_call(item, call_id)
            raise
        return call_id

    def _close_call(self, item: _Running, call_id: int) -> None:
        with self._lock:
            item.calls.pop(call_id, None)

    def _call_sync(self, item: _Running, arguments: CallArguments) -> Iterator[Dict[str, np.ndarray]]:
        """A sync handler's model call (pytriton.compose.call_model, stream_model): each response's outputs."""
        if self._loop is not None and threading.current_thread() is self._loop_thread:
            raise ModelCallError(
                Status.INVALID_ARGUMENT,
                "call_model would block the event loop: an async route handler awaits call_model_async",
            )
        answers: queue.SimpleQueue[Optional[Answer]] = queue.SimpleQueue()
        call_id = self._open_call(item, answers.put, arguments)
        try:
            while True:
                outputs = _outputs(answers.get())
                if outputs is None:
                    return
                yield outputs
        finally:
            self._close_call(item, call_id)

    async def _call_async(self, item: _Running, arguments: CallArguments) -> AsyncIterator[Dict[str, np.ndarray]]:
        """An async handler's model call (call_model_async, async for over stream_model), awaited on the loop."""
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[Optional[Answer]] = asyncio.Queue()

        def deliver(answer: Optional[Answer]) -> None:
            loop.call_soon_threadsafe(answers.put_nowait, answer)

        call_id = self._open_call(item, deliver, arguments)
        try:
            while True:
                outputs = _outputs(await answers.get())
                if outputs is None:
                    return
                yield outputs
        finally:
            self._close_call(item, call_id)


def _outputs(answer: Optional[Answer]) -> Optional[Dict[str, np.ndarray]]:
    """A response's outputs (views of the server's answer arena or of the message body); None at the end.

    The call's error raised; CANCELLED when the request ended (None came instead of an answer).
    """
    if answer is None:
        raise ModelCallError(Status.CANCELLED, "the route's request was cancelled: its client left")
    return answered(answer)


async def _stop_loop() -> None:
    """End the tasks of a route's loop (its handlers, cancelled already), then the loop."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    asyncio.get_running_loop().stop()
