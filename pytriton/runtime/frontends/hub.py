"""The hub's side of one frontend process: its requests into the models' schedulers, their answers back.

Everything here runs on the hub's loop. A request costs no task of its own: it goes to its model's scheduler
with a sink (`RemoteSink`) that posts each answer to the frontend's outbox, which sends them a batch per loop
turn.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional

from pytriton.core.engine import Engine
from pytriton.core.errors import InferenceError
from pytriton.core.model import ServedModel
from pytriton.core.request import InferenceResponse
from pytriton.core.sinks import ResponseSink
from pytriton.ipc.calls import CALL, REPLY, Calls, Handler
from pytriton.ipc.channel import LoopChannel, Message
from pytriton.ipc.outbox import Outbox, items
from pytriton.runtime.frontends.protocol import (
    CANCEL,
    END,
    INFER,
    failed,
    pack_response,
    unpack_request,
)

_CLIENT_GONE = "the client disconnected before its response was ready"


class RemoteSink(ResponseSink):
    """Where a frontend's request answers: its outbox, under the request's key."""

    __slots__ = ("_done", "_link", "key", "model", "queued", "streaming")

    def __init__(self, link: FrontendLink, key: int, streaming: bool) -> None:
        self._link = link
        self.key = key
        self.streaming = streaming
        self.model: Optional[ServedModel] = None
        self.queued: Optional[ResponseSink] = None  # the sink the scheduler holds (one that fills the cache)
        self._done = False

    def done(self) -> bool:
        """Whether the request ended, or its client left."""
        return self._done

    def deliver(self, response: InferenceResponse) -> None:
        """Post a response (the last one of a plain request ends it)."""
        if self._done:
            return
        head, body = pack_response(self.key, response)
        self._link.outbox.post(head, body)
        if not self.streaming:
            self._end()

    def fail(self, error: InferenceError) -> None:
        """Post the error that ends the request."""
        if not self._done:
            self._link.outbox.post(failed(self.key, error))
            self._end()

    def finish(self) -> None:
        """End the request: a stream's end, or (a plain request that got no response) an error."""
        if self._done:
            return
        if self.streaming:
            self._link.outbox.post((END, self.key))
            self._end()
        else:
            self.fail(InferenceError.internal("model returned no response"))

    def cancel(self) -> None:
        """The client left: out of the queue if it waits there (CANCELLED), its answers dropped if it runs."""
        if self._done:
            return
        if self.model is not None and self.queued is not None:
            self.model.scheduler.withdraw(self.queued)  # counts it as cancelled when it was still queued
        self.fail(InferenceError.cancelled(_CLIENT_GONE))

    def _end(self) -> None:
        self._done = True
        self._link.sinks.pop(self.key, None)


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
        self.sinks: Dict[int, RemoteSink] = {}
        self.closed = False

    def on_message(self, message: Message) -> None:
        """Requests, cancels and calls from the frontend."""
        for head, body in items(message):
            tag = head[0]
            if tag == INFER:
                self._infer(head, body)
            elif tag == CANCEL:
                sink = self.sinks.get(head[1])
                if sink is not None:
                    sink.cancel()
            elif tag == CALL:
                self.calls.on_call(head)
            elif tag == REPLY:
                self.calls.on_reply(head)

    def _infer(self, head: Any, body: memoryview) -> None:
        """Queue one request on its model (or answer at once: an error, a cached response)."""
        key, name, version, streaming = head[1], head[2], head[3], head[12]
        sink = RemoteSink(self, key, streaming)
        self.sinks[key] = sink
        try:
            model = self._engine.model(name, version)
            sink.model = model
            sink.queued = model.submit(unpack_request(head, body), sink, streaming)
        except InferenceError as error:
            sink.fail(error)

    def close(self) -> None:
        """The frontend is gone: its requests leave the queues, and what runs for it is answered to no one."""
        self.closed = True
        self.calls.close()
        for sink in list(self.sinks.values()):
            sink.cancel()
        self.sinks.clear()
