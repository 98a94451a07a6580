"""Call another bound model from inside an inference callable or a custom route's handler, in-process.

The call is a request like a client's, without the network: it joins the model's queue, batches with
the requests of clients (and of other models), and the model's statistics count it. Tensors are passed
by reference, not copied. Examples:

    from pytriton.compose import call_model

    @batch
    def pipeline(text):
        tokens = tokenize(text)
        return call_model("encoder", {"tokens": tokens})  # outputs by name

In an `async def` callable or route handler, `await call_model_async(...)`; `stream_model(...)` iterates
(`for`, or `async for` on the event loop) over a decoupled model's responses.

A call made while the outer request is cancelled or past its deadline fails; a call to a model already on
the call path (A calls B calls A) is refused. A failed call raises `ModelCallError`, whose `message` is
the inner model's (Triton's) message and `status` its status; not caught, it fails the outer request
with both.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Sequence, Union

import numpy as np

from pytriton.core.composition.async_callers import async_process_caller
from pytriton.core.composition.direct import call_here, call_here_async
from pytriton.core.composition.inner_call import InnerCall, outputs_of, thread_doorbell
from pytriton.core.composition.path import CURRENT, CallArguments, CallPath, ModelCallError
from pytriton.core.composition.process_callers import process_caller
from pytriton.core.errors import Status

__all__ = ["ModelCallError", "call_model", "call_model_async", "stream_model"]

Outputs = Dict[str, np.ndarray]
Version = Union[int, str, None]


def _path() -> CallPath:
    """The call path of the callable or route handler running now."""
    source = CURRENT.get()
    if source is None:
        raise ModelCallError(
            Status.INVALID_ARGUMENT,
            "call_model, call_model_async and stream_model work inside an inference callable or a custom route's "
            "handler",
        )
    return source.call_path()


def _on_loop(path: CallPath) -> bool:
    """Whether this thread runs the engine's event loop (where waiting would block the loop)."""
    return asyncio._get_running_loop() is path.loop  # None in a thread (get_running_loop raises: 1 us)


def call_model(
    name: str,
    inputs: Dict[str, Any],
    *,
    version: Version = None,
    parameters: Optional[Dict[str, Any]] = None,
    requested_outputs: Optional[Sequence[str]] = None,
    timeout_s: Optional[float] = None,
) -> Outputs:
    """Run one request on model `name` (its latest version unless `version`) and return its outputs by name.

    From a sync callable: it blocks only the callable's own thread. `inputs` are checked against the model
    as a client's are; a batching model's inputs have the batch dimension first. `timeout_s` bounds the call
    (as does the outer request's deadline, whichever comes first).

    Raises:
        ModelCallError: the call failed or was refused; `message` is the inner model's message.
    """
    source = CURRENT.get()
    if source is not None:
        # A batch's path once made (RunningBatch.path, core/scheduling/running.py) without a call to ask for it.
        path = getattr(source, "path", None) or source.call_path()
        if asyncio._get_running_loop() is not path.loop:  # as _on_loop, a call less on this path
            outputs = call_here(path, name, inputs, version, parameters, requested_outputs, timeout_s)
            if outputs is not None:  # the model was idle: it ran on this thread
                return outputs
    arguments = CallArguments(name, inputs, _version(version), parameters, requested_outputs, timeout_s, False)
    last: Optional[Outputs] = None
    for outputs in ModelStream(arguments):
        last = outputs
    return _single(last)


async def call_model_async(
    name: str,
    inputs: Dict[str, Any],
    *,
    version: Version = None,
    parameters: Optional[Dict[str, Any]] = None,
    requested_outputs: Optional[Sequence[str]] = None,
    timeout_s: Optional[float] = None,
) -> Outputs:
    """`call_model` for an `async def` callable or route handler: awaited on the engine's loop.

    Cancelling the awaiting task cancels the call (it leaves the model's queue if it still waits there).
    """
    source = CURRENT.get()
    if source is not None:
        path = getattr(source, "path", None) or source.call_path()  # as call_model
        if asyncio._get_running_loop() is path.loop:  # as _on_loop, a call less on this path
            here = call_here_async(path, name, inputs, version, parameters, requested_outputs, timeout_s)
            if here is not None:  # the model was idle: its instance thread answers straight to this call
                return await here
    arguments = CallArguments(name, inputs, _version(version), parameters, requested_outputs, timeout_s, False)
    last: Optional[Outputs] = None
    async for outputs in ModelStream(arguments):
        last = outputs
    return _single(last)


def stream_model(
    name: str,
    inputs: Dict[str, Any],
    *,
    version: Version = None,
    parameters: Optional[Dict[str, Any]] = None,
    requested_outputs: Optional[Sequence[str]] = None,
    timeout_s: Optional[float] = None,
) -> ModelStream:
    """Run one request on model `name` and iterate over its responses' outputs, as they come.

    A decoupled model gives any number of responses; any other model one. Iterate with `for` in a sync
    callable's thread, with `async for` on the event loop. Leaving the loop early cancels the call.
    """
    return ModelStream(CallArguments(name, inputs, _version(version), parameters, requested_outputs, timeout_s, True))


class ModelStream:
    """The responses of one call to a model, as `stream_model` returns them: iterate once, sync or async.

    `call_model` and `call_model_async` iterate one too (not streaming: a decoupled model is refused), and keep its
    single response.
    """

    def __init__(self, arguments: CallArguments) -> None:
        """Remember the call; it starts when iterated."""
        self._remote = process_caller() if CURRENT.get() is None else None
        self._awaited = async_process_caller() if CURRENT.get() is None else None
        self._path = _path() if self._remote is None and self._awaited is None else None
        self._arguments = arguments

    def __iter__(self) -> Iterator[Outputs]:
        """The responses, in this (non-loop) thread."""
        if self._remote is None and self._awaited is not None:
            raise ModelCallError(
                Status.INVALID_ARGUMENT, "a stream on the event loop is read with 'async for', which never blocks it"
            )
        if self._remote is not None:
            yield from self._remote(self._arguments)
            return
        path = self._path
        assert path is not None
        if _on_loop(path):
            raise ModelCallError(
                Status.INVALID_ARGUMENT,
                "a stream on the event loop is read with 'async for', which never blocks it"
                if self._arguments.streaming
                else "call_model would block the event loop: an async callable or route handler awaits "
                "call_model_async",
            )
        doorbell = thread_doorbell()
        call = InnerCall(doorbell.ring)
        path.inbox.post(call.start, path, self._arguments)
        try:
            while True:
                ended = call.ended  # read before the responses: one delivered before the end is never missed
                while call.items:
                    yield outputs_of(call.items.popleft())
                if ended:
                    if call.error is not None:
                        raise call.error
                    return
                doorbell.take()
        finally:
            if not call.ended:
                path.inbox.post(call.cancel, "the caller stopped reading the stream")

    async def __aiter__(self) -> AsyncIterator[Outputs]:
        """The responses, on the event loop (cancelling the task that reads them cancels the call)."""
        if self._awaited is not None:  # a RemoteTriton's async route handler: awaited on its own loop
            async for outputs in self._awaited(self._arguments):
                yield outputs
            return
        if self._remote is not None:  # an instance process's loop runs this callable alone: waiting blocks nothing else
            for outputs in self._remote(self._arguments):
                yield outputs
            return
        path = self._path
        assert path is not None
        if not _on_loop(path):
            raise ModelCallError(
                Status.INVALID_ARGUMENT,
                "'async for' over a stream runs on the server's event loop"
                if self._arguments.streaming
                else "call_model_async runs on the server's event loop: use call_model",
            )
        wake = _Wake(path.loop)
        call = InnerCall(wake.set)
        call.start(path, self._arguments)
        try:
            while True:
                while call.items:
                    yield outputs_of(call.items.popleft())
                if call.ended:
                    if call.error is not None:
                        raise call.error
                    return
                await wake.wait()
        finally:
            call.cancel("the caller stopped reading the stream")


class _Wake:
    """A one-waiter event on the loop, cheaper than asyncio.Event."""

    __slots__ = ("_future", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: Optional[asyncio.Future[None]] = None

    def set(self) -> None:
        """Wake the waiter, if one waits."""
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self) -> None:
        """Wait for the next `set`."""
        self._future = self._loop.create_future()
        await self._future


def _single(last: Optional[Outputs]) -> Outputs:
    """The outputs of a call's single response (its last, were there more)."""
    if last is None:
        raise ModelCallError(Status.INTERNAL, "the model returned no response")
    return last


def _version(version: Version) -> Optional[str]:
    """A version as the engine names it."""
    return None if version is None else str(version)
