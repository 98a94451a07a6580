"""The far side of a process instance: runs the callable for each job the server sends, one at a time.

A spawned instance process runs `main` (`python -m pytriton.core.process_instances.host FD PARENT_PID`); a
`RemoteTriton` process serves its own callables with `InstanceHost` over its attach connection.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from pytriton.core.composition import ModelCallError, set_process_caller
from pytriton.core.errors import Status
from pytriton.core.host_arrays import host_step
from pytriton.core.instances import CallableKind, callable_kind
from pytriton.core.process_instances.input_arena import InputViews, outputs_in_inputs
from pytriton.core.process_instances.protocol import (
    END,
    EXIT,
    FAILURE,
    FORGET,
    JOB,
    MODEL_ANSWER,
    MODEL_CALL,
    READY,
    RESULT,
    SEGMENT,
    START_FAILED,
    STOP,
    Init,
    error_info,
    pack_result,
)
from pytriton.core.process_instances.result_arena import ResultArena
from pytriton.core.sequence_states import SequenceStates
from pytriton.ipc.channel import BlockingChannel, ChannelClosed, Message, encode
from pytriton.ipc.spawn import die_with_parent
from pytriton.ipc.tensors import ArenaReader, ArenaWriter, Buffer
from pytriton.proxy.types import Request


class Unsendable:
    """Stands in for a result that cannot leave the process (a generator, a lock...): the server's checks see it."""

    def __init__(self, value: Any) -> None:
        """Remember how the value looked."""
        self._repr = repr(value)

    def __repr__(self) -> str:
        return self._repr


class InstanceHost:
    """Serves jobs from one channel with one callable until the server says Exit or goes away."""

    def __init__(self, channel: BlockingChannel, fn: Callable[..., Any], arena_budget: int) -> None:
        """Serve `fn` over `channel`; outputs use an arena of at most `arena_budget` bytes."""
        self.channel = channel
        self.fn = fn
        self.kind = callable_kind(fn)
        self._inputs = InputViews()
        self._states = SequenceStates()  # the state of the sequences whose slots this instance holds
        self._outputs = ResultArena(arena_budget)
        self._steps = ArenaWriter(0)  # a step may still be read when the next is written: body only
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._exiting = False
        self._job_id = 0  # the job running now
        self._stops: Set[int] = set()  # jobs the server said STOP to while their callable waited on a model call
        self._next_call_id = 0
        self._calling = threading.Lock()  # one model call on the channel at a time
        set_process_caller(self.call_model)

    def serve(self) -> None:
        """Answer jobs until Exit (after the job in progress) or the end of the channel."""
        try:
            while not self._exiting:
                message = self.channel.receive()
                tag = message.head[0]
                if tag == JOB:
                    self._run(message)
                elif tag == EXIT:
                    return
                else:
                    self._control(message)  # a STOP for a job that has ended already needs nothing
        except ChannelClosed:
            return
        finally:
            self.channel.close()
            self._inputs.close()
            self._outputs.close()
            if self._loop is not None:
                self._loop.close()

    def _run(self, message: Message) -> None:
        """Run one job and send its result(s) or its error.

        The answer goes once the job's requests are gone here, so that it can say the job's inputs are free
        (unless the model kept them): the server may then write the next batch where they were.
        """
        _, job_id, streaming, batch, arena, given_back, forgotten = message.head
        self._job_id = job_id
        self._stops.clear()
        if forgotten:
            self._states.forget(forgotten)
        for done in given_back:
            self._outputs.give_back(done)
        if arena:
            self._inputs.reader.adopt(arena, message.fds)
        failure = None
        try:
            if streaming:
                self._stream(job_id, batch, message.body)
            else:
                packed, body, new_arena, value = self._answer(job_id, batch, message.body)
        except ChannelClosed:
            raise
        except BaseException as error:  # noqa: BLE001 - sent to the server, as a thread instance reports it
            failure = error_info(error)
        if failure is not None:
            self.channel.send((FAILURE, job_id, failure, self._inputs.take_released()))
        elif streaming:
            self.channel.send((END, job_id, self._inputs.take_released()))
        else:
            self._send_result(job_id, packed, body, new_arena, self._outputs, True, value)

    def _requests(self, job_id: int, batch: List[Any], body: memoryview) -> Tuple[List[Request], Optional[np.ndarray]]:
        """The requests of a job (inputs: views of the server's arena or of the message body), and what they view.

        What they view is the array over the job's input region (None: its inputs were copied, or are in the body).
        """
        inputs, lease = self._inputs.unpack(job_id, [request[0] for request in batch], body)
        requests = [
            Request(data=data, parameters=parameters, requested_output_names=names)
            for data, (_, parameters, names, _) in zip(inputs, batch)
        ]
        if any(request[3] is not None for request in batch):
            for request, (_, _, _, sequence) in zip(requests, batch):
                if sequence is not None:
                    serial, sequence_id, start, end = sequence
                    request.sequence_serial, request.sequence_id = serial, sequence_id
                    request.sequence_start, request.sequence_end = start, end
            self._states.attach(requests)
        return requests, lease

    def _answer(self, job_id: int, batch: List[Any], body: memoryview) -> Tuple[Any, List[Buffer], int, Any]:
        """Call a plain callable: its result packed in a region leased to the server, and the result itself.

        The result itself is returned only when packing kept something that may not pickle (it then stands in for
        it); nothing else here outlives the call, so the job's inputs are free on return unless the model kept them.
        """
        requests, lease = self._requests(job_id, batch, body)
        value = host_step(self._call(requests))  # framework arrays travel as numpy
        del requests
        in_inputs = outputs_in_inputs(value, lease) if lease is not None else None
        packed, parts, new_arena = self._outputs.pack_result(value, job_id, in_inputs)
        plain = packed[0] is not None and all(len(item) == 3 and item[2] is None for item in packed[1])
        return packed, parts, new_arena, None if plain else value

    def _stream(self, job_id: int, batch: List[Any], body: memoryview) -> None:
        """Send each step of any callable (a plain one makes one step) as it comes, through the message body."""
        for step in self._steps_of(self._requests(job_id, batch, body)[0], job_id):
            step = host_step(step)
            packed, parts, new_arena = pack_result(self._steps, step)
            self._send_result(job_id, packed, parts, new_arena, self._steps, False, step)

    def _call(self, requests: List[Request]) -> Any:
        """Call a plain (sync or async) callable."""
        if self.kind is CallableKind.ASYNC:
            return self._event_loop().run_until_complete(self.fn(requests))
        return self.fn(requests)

    def _steps_of(self, requests: List[Request], job_id: int) -> Iterator[Any]:
        """Each step of any callable (a plain one yields once); stops after a step when the server says Stop."""
        if self.kind is CallableKind.SYNC_GENERATOR:
            generator = self.fn(requests)
            try:
                for step in generator:
                    yield step
                    if self._stopped(job_id):
                        return
            finally:
                generator.close()
        elif self.kind is CallableKind.ASYNC_GENERATOR:
            loop = self._event_loop()
            agen = self.fn(requests)
            try:
                while True:
                    try:
                        step = loop.run_until_complete(agen.__anext__())
                    except StopAsyncIteration:
                        return
                    yield step
                    if self._stopped(job_id):
                        return
            finally:
                loop.run_until_complete(agen.aclose())
        else:
            yield self._call(requests)

    def _stopped(self, job_id: int) -> bool:
        """Whether the server asked to stop this job (or to exit) since its last step."""
        if job_id in self._stops or self._exiting:
            return True
        while self.channel.readable():
            message = self.channel.receive()
            head = message.head
            if head[0] == EXIT:
                self._exiting = True
                return True
            if head[0] == STOP and head[1] == job_id:
                return True
            self._control(message)
        return False

    def call_model(
        self,
        name: str,
        inputs: Dict[str, Any],
        version: Optional[str],
        parameters: Optional[Dict[str, Any]],
        requested_outputs: Optional[Sequence[str]],
        timeout_s: Optional[float],
        streaming: bool,
    ) -> Iterator[Dict[str, np.ndarray]]:
        """The running job's call to a model of the server (pytriton.compose): each response's outputs, as they come.

        The channel is read here until the call ends: what else comes meanwhile (STOP, EXIT, buffers) is kept for
        later. A call left before its end is not told to the server: its late answers are dropped.
        """
        with self._calling:
            self._next_call_id += 1
            call_id = self._next_call_id
            arrays = {
                key: value if isinstance(value, np.ndarray) else np.asarray(value) for key, value in inputs.items()
            }
            packed, body, _ = ArenaWriter(0).pack([arrays])
            head = (MODEL_CALL, self._job_id, call_id, name, packed, version, parameters, requested_outputs)
            self.channel.send((*head, timeout_s, streaming), body)
        reader = ArenaReader()
        while True:
            with self._calling:
                message = self.channel.receive()
            head = message.head
            if head[0] == MODEL_ANSWER:
                if head[1] != call_id:
                    continue  # an answer to a call left before its end
                if head[2] == "response":
                    outputs = reader.unpack(head[3], message.body, copy=True)[0]
                    yield {key: np.array(value, copy=True) for key, value in outputs.items()}
                elif head[2] == "end":
                    return
                else:
                    raise ModelCallError(Status[head[3]], head[4])
            elif head[0] == STOP:
                self._stops.add(head[1])
            elif head[0] == EXIT:
                self._exiting = True
            else:
                self._control(message)

    def _control(self, message: Message) -> None:
        """The frontend buffers the server passes on (SEGMENT) and lets go of (FORGET)."""
        head = message.head
        if head[0] == SEGMENT:
            self._inputs.adopt_segment(head[1], message.fds[0], head[2])
        elif head[0] == FORGET:
            self._inputs.forget_segment(head[1])

    def _send_result(
        self, job_id: int, packed: Any, body: List[Buffer], new_arena: int, writer: ArenaWriter, final: bool, value: Any
    ) -> None:
        """Send a packed result (or step) with the jobs whose inputs are free; `value` stands in if it cannot travel."""
        fds = [writer.segment.fileno()] if new_arena and writer.segment is not None else []
        released = self._inputs.take_released()
        try:
            message = encode((RESULT, job_id, packed, new_arena, final, released), body, fds)
        except Exception:  # noqa: BLE001 - it cannot be pickled (a generator...): the server's checks say so
            unsendable = (None, Unsendable(value))
            message = encode((RESULT, job_id, unsendable, new_arena, final, released), (), fds)
        self.channel.send_encoded(message, fds)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop async callables run on, made at their first call."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop


def load_callable(init: Init, payload: memoryview) -> Callable[..., Any]:
    """The callable an Init message describes, loaded here, and prepared as the binding asked (`Init.prepare`)."""
    import cloudpickle

    sys.path[:] = init.sys_path
    loaded = cloudpickle.loads(payload)
    fn: Callable[..., Any] = loaded() if init.factory else loaded
    if not callable(fn):
        made = "the instance factory returned" if init.factory else "the server sent"
        raise TypeError(f"{made} {fn!r}, which is not callable")
    if init.prepare is not None:
        init.prepare(fn, init.model_config)
    return fn


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of a spawned instance process: FD (its end of the channel) and the server's pid."""
    fd, parent_pid = (int(arg) for arg in (argv or sys.argv[1:])[:2])
    die_with_parent(parent_pid)
    # The server stops its instances itself (after draining); a Ctrl-C in the terminal reaches the whole
    # process group, and must not kill a call that the server would let finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = BlockingChannel(socket.socket(fileno=fd))
    try:
        message = channel.receive()
    except ChannelClosed:
        return 1
    init: Init = message.head[1]
    try:
        fn = load_callable(init, message.body)
    except BaseException:  # noqa: BLE001 - the server reports it, with this traceback
        channel.send((START_FAILED, traceback.format_exc()))
        return 1
    host = InstanceHost(channel, fn, init.arena_budget)
    channel.send((READY, host.kind.value, os.getpid()))
    host.serve()
    _exit_past_threads(f"model '{init.model_name}' instance {init.instance_index}")
    return 0


def _exit_past_threads(name: str) -> None:
    """End the process now if threads the model started would hold its exit (atexit handlers still run).

    The server asked it to exit (or is gone): a model's non-daemon thread must not keep an idle instance,
    and with it the server's stop, waiting until the server kills it. As for a thread instance, whose
    model's threads never hold the server's stop.
    """
    others = [
        thread.name
        for thread in threading.enumerate()
        if not thread.daemon and thread is not threading.current_thread()
    ]
    if not others:
        return
    sys.stderr.write(f"pytriton: {name} exits without waiting for threads of its model: {', '.join(others)}\n")
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s: classes sent to the server (Unsendable) must be found there by name.
    from pytriton.core.process_instances.host import main as module_main

    sys.exit(module_main())
