"""The far side of a process instance: runs the callable for each job the server sends, one at a time.

A spawned instance process runs `main` (`python -m pytriton.core.process_instances.host FD PARENT_PID`); a
`RemoteTriton` process serves its own callables with `InstanceHost` over its attach connection.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import pickle
import select
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.composition.path import CallArguments, ModelCallError
from pytriton.core.composition.process_callers import set_process_caller
from pytriton.core.custom_metrics import REGISTRY, stay_in_model_scope
from pytriton.core.errors import Status, exception_text
from pytriton.core.instances import CallableKind, callable_kind
from pytriton.core.outputs import UnsentResponse
from pytriton.core.process_instances.input_arena import InputViews, outputs_in_inputs
from pytriton.core.process_instances.long_outputs import Long, TakenOut, placed, put_back, take_out
from pytriton.core.process_instances.model_calls import CallerArenas, answered
from pytriton.core.process_instances.protocol import (
    ANSWERS_READ,
    CALLS_READ,
    CANCEL,
    END,
    EXIT,
    FAILURE,
    FORGET,
    INPUTS_NOT_MAPPED,
    INPUTS_NOT_MAPPED_BY,
    JOB,
    METRICS,
    MODEL_ANSWER,
    READY,
    RESULT,
    RESULT_ARENA_REFUSED,
    SEGMENT,
    SEQUENCES_ENDED,
    START_FAILED,
    STEPS_AHEAD,
    STEPS_TAKEN,
    STOP,
    ErrorInfo,
    Init,
    error_info,
    pack_result,
)
from pytriton.core.process_instances.result_arena import ResultArena
from pytriton.core.sequences.states import SequenceStates
from pytriton.core.tensors.host_arrays import host_step
from pytriton.core.tensors.raw_tensors import plain_elements
from pytriton.ipc.channel import BlockingChannel, ChannelClosed, Message, encode
from pytriton.ipc.segments import SharedMemoryUnavailable
from pytriton.ipc.spawn import die_with_parent
from pytriton.ipc.tensors import ArenaWriter, Buffer
from pytriton.proxy.types import Request, Response, mark_cancelled


class Unsendable:
    """Stands in for a result that cannot leave the process (a generator, a lock...): the server's checks see it."""

    def __init__(self, value: Any) -> None:
        """Remember how the value looked: its repr, and its str, which the server's messages write."""
        self._repr = repr(value)
        try:
            self._str = str(value)
        except Exception:  # noqa: BLE001 - a str that raises: its repr will do
            self._str = self._repr

    def __repr__(self) -> str:
        return self._repr

    def __str__(self) -> str:
        return self._str


def _portable(step: Any) -> Any:
    """A result whose object outputs hold only bytes and str past their first element (raw_tensors.plain_elements).

    The server may not import the classes of the others (a module the factory imported from a path of its own): their
    message was unreadable there, and the instance was taken for dead. The first element stays for the server's
    checks, which look at it. A Request or Response returned as a response goes as its `data`, which is what the
    server reads of it (a Request here holds the process's channel, which does not pickle: the request failed). The
    result itself when nothing changes; the callable's own dicts are never changed.
    """
    if not isinstance(step, (list, tuple)):
        return step
    converted: Optional[List[Any]] = None
    for index, response in enumerate(step):
        data = response.data if isinstance(response, (Request, Response)) else response
        if not isinstance(data, dict):
            continue
        changed: Optional[Dict[Any, Any]] = None
        for name, value in data.items():
            if type(value) is np.ndarray and value.dtype.hasobject and value.size:
                plain = _plain_past_first(value)
                if plain is not value:
                    if changed is None:
                        changed = dict(data)
                    changed[name] = plain
        if changed is not None or data is not response:
            if converted is None:
                converted = list(step)
            converted[index] = data if changed is None else changed
    if converted is None:
        return step
    return tuple(converted) if type(step) is tuple else converted


def _plain_past_first(array: np.ndarray) -> np.ndarray:
    """An object array as `_portable` sends it (a copy where that changes it): elements past its first plain.

    Its first stays for the server's checks, but for numpy's `bytes_`, which pickles without its trailing NULs (an
    `a` and a NUL arrived as `a`): it goes as the bytes a thread instance's codec sends of it.
    """
    try:
        plain = plain_elements(array, 1)
    except Exception:  # noqa: BLE001 - an element's str raised: the server's codec says so, as a thread's
        plain = array
    first = array.flat[0]
    if isinstance(first, np.bytes_):
        if plain is array:
            plain = array.copy()
        plain.flat[0] = bytes(first)
    return plain


def _sendable(packed: Any, model: Optional[Tuple[str, str]]) -> Any:
    """A packed result whose responses that do not pickle are UnsentResponse's naming why: only those requests fail.

    One that is no dict at all (a mappingproxy) goes as an Unsendable: the server refuses it in a thread's words.

    Raises what pickling raised when the result is no list (the caller sends an Unsendable then).
    """
    as_tuple, items = packed
    if as_tuple is None:
        raise TypeError("no list of responses")
    who = f"model '{model[0]}' " if model else ""
    sendable = []
    for index, item in enumerate(items):
        try:
            pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
        except Exception as failure:  # noqa: BLE001 - whatever pickling raises names the cause
            if len(item) == 1 and not isinstance(item[0], dict):  # the server's checks refuse it as a thread's
                sendable.append((Unsendable(item[0]),))
                continue
            what, cause = f"response {index} of the batch", failure
            if len(item) == 3 and type(item[1]) is dict:
                for name, value in item[1].items():
                    try:
                        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
                    except Exception as output_failure:  # noqa: BLE001 - as above
                        what, cause = f"output '{name}'", output_failure
                        break
            reason = f"{what} could not be sent from the {who}instance process: {type(cause).__name__}: {cause}"
            item = (UnsentResponse(reason),)
        sendable.append(item)
    return as_tuple, sendable


class _HostedRequest(Request):
    """A Request in the instance process: `is_cancelled()` first reads the cancels the server sent meanwhile."""

    host: InstanceHost

    def is_cancelled(self) -> bool:
        """Whether the request's client cancelled it (read from the server's messages when asked)."""
        if not self._cancelled and any(request is self for request in self.host.running_requests):
            self.host.read_messages()  # only while its call runs: the server's next job is not this thread's to read
        return self._cancelled


class InstanceHost:
    """Serves jobs from one channel with one callable until the server says Exit or goes away."""

    def __init__(
        self,
        channel: BlockingChannel,
        fn: Callable[..., Any],
        arena_budget: int,
        model: Optional[Tuple[str, str]] = None,
    ) -> None:
        """Serve `fn` over `channel`; outputs use an arena of at most `arena_budget` bytes.

        `model` (name, version): a RemoteTriton's instance, one of several in its process; its callable's model
        calls and custom metrics are this host's from its serving thread (else the process's, an instance process's).
        """
        self.channel = channel
        self._model = model
        self._pid = os.getpid()  # a child its callable forked is another (_end_if_forked)
        self.fn = fn
        self.kind = callable_kind(fn)
        self._inputs = InputViews()
        self._states = SequenceStates()  # the state of the sequences whose slots this instance holds
        self._outputs = ResultArena(arena_budget)
        self._steps = ArenaWriter(0)  # a step may still be read when the next is written: body only
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._exiting = False
        # The job whose call runs and its requests (a CANCEL names one by index), the job the server said STOP to.
        self._job_id = 0
        self._job_requests: List[Request] = []
        self._stop_job = 0
        self._steps_taken = 0  # steps of the streaming job the server took (STEPS_TAKEN)
        self._cut = False  # the streaming job's generator was closed at a step (told in its END)
        # A callable may ask is_cancelled() and call models from threads of its own: one reads the channel at a
        # time, and the answers to each open model call wait in `_answers` for the thread that made the call.
        self._reading = threading.Lock()
        self._answers: Dict[int, Deque[Any]] = {}
        self._next_call_id = 0
        self._sending = threading.Lock()  # also packs a model call's inputs: see CallerArenas
        self._calls = CallerArenas(arena_budget)
        _HOSTS.append(self)
        set_process_caller(_call_model)

    def serve(self) -> None:
        """Answer jobs until Exit (after the job in progress) or the end of the channel."""
        _SERVING.host = self
        if self._model is not None:  # a RemoteTriton's instance: its metrics are its model's, not the process's
            stay_in_model_scope(self._model)
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
                # A job's inputs past the arena's budget are its body: kept here, they stayed alive (1 GiB of them)
                # while the instance waited for its next message, however long.
                del message
        except (ChannelClosed, ConnectionError):  # the server closed the channel (an answer it cut off finds it gone)
            return
        finally:
            self.channel.close()
            self._inputs.close()
            self._outputs.close()
            self._calls.close()
            _SERVING.host = None
            if self in _HOSTS:
                _HOSTS.remove(self)
                if not _HOSTS:  # no callable of this process runs any more (RemoteTriton unbound them all)
                    set_process_caller(None)
            if self._loop is not None:
                self._loop.close()

    def _run(self, message: Message) -> None:
        """Run one job and send its result(s) or its error.

        The answer goes once the job's requests are gone here, so that it can say the job's inputs are free
        (unless the model kept them): the server may then write the next batch where they were.
        """
        _, job_id, streaming, batch, arena, given_back, longs = message.head
        self._job_id = job_id
        for done in given_back:
            if done == RESULT_ARENA_REFUSED:
                self._outputs.close()  # the next result brings a new arena
            else:
                self._outputs.give_back(done)
        # At the process's memory limit, this job fails and the process lives: a body there was no room for (read
        # and dropped by the channel), a new arena it cannot map.
        not_taken = f"no memory for its {message.lost} bytes" if message.lost else ""
        if message.lost:
            for fd in message.fds:
                os.close(fd)
        elif arena:
            try:
                self._inputs.reader.adopt(arena, message.fds)
            except SharedMemoryUnavailable as error:
                not_taken = exception_text(error)
        if not_taken:
            unmapped = ErrorInfo(INPUTS_NOT_MAPPED, INPUTS_NOT_MAPPED_BY, not_taken, "", None)
            self._send(encode((FAILURE, job_id, unmapped, self._inputs.take_released())))
            return
        failure = None
        cut = False
        try:
            if streaming:
                cut = self._stream(job_id, batch, message.body, longs)
            else:
                packed, body, new_arena, value, taken = self._answer(job_id, batch, message.body, longs)
        except ChannelClosed:
            raise
        except BaseException as error:  # noqa: BLE001 - sent to the server, as a thread instance reports it
            failure = error_info(error)
        if failure is not None:
            self._send(encode((FAILURE, job_id, failure, self._inputs.take_released())))
        elif streaming:
            self._send(encode((END, job_id, cut, self._inputs.take_released())))
        else:
            self._send_result(job_id, packed, body, new_arena, self._outputs, True, value, taken)

    def _requests(
        self, job_id: int, batch: List[Any], body: memoryview, longs: Optional[List[Long]]
    ) -> Tuple[List[Request], Optional[np.ndarray]]:
        """The requests of a job (inputs: views of the server's arena or of the message body), and what they view.

        What they view is the array over the job's input region (None: its inputs were copied, or are in the body).
        Long object inputs are rebuilt from their pickled pieces in the body (`longs` says where).
        """
        inputs, lease = self._inputs.unpack(job_id, [request[0] for request in batch], body)
        if longs:  # long object inputs, pickled in pieces after the body (long_outputs.py)
            inputs = put_back(inputs, longs, body, count=False)
        requests: List[Request] = []
        for data, (_, parameters, names, _) in zip(inputs, batch):
            hosted = _HostedRequest(data=data, parameters=parameters, requested_output_names=names)
            hosted.host = self
            requests.append(hosted)
        if any(request[3] is not None for request in batch):
            for request, (_, _, _, sequence) in zip(requests, batch):
                if sequence is not None:
                    serial, sequence_id, start, end = sequence
                    request.sequence_serial, request.sequence_id = serial, sequence_id
                    request.sequence_start, request.sequence_end = start, end
            self._states.attach(requests)
        self._job_id = job_id
        self._job_requests = requests
        return requests, lease

    def _answer(
        self, job_id: int, batch: List[Any], body: memoryview, longs: Optional[List[Long]]
    ) -> Tuple[Any, List[Buffer], int, Any, List[TakenOut]]:
        """Call a plain callable: its result packed in a region leased to the server, the result, its long arrays.

        Its long object arrays are taken out of it (long_outputs.py). The result itself is returned only when packing
        kept something that may not pickle (it then stands in for it); nothing else here outlives the call, so the
        job's inputs are free on return unless the model kept them.
        """
        requests, lease = self._requests(job_id, batch, body, longs)
        try:
            value = _portable(host_step(self._call(requests)))  # framework arrays travel as numpy
        finally:
            self._end_job()
        del requests
        value, taken = take_out(value)
        in_inputs = outputs_in_inputs(value, lease) if lease is not None else None
        packed, parts, new_arena = self._outputs.pack_result(value, job_id, in_inputs)
        plain = packed[0] is not None and all(len(item) == 3 and item[2] is None for item in packed[1])
        return packed, parts, new_arena, None if plain else value, taken

    def _stream(self, job_id: int, batch: List[Any], body: memoryview, longs: Optional[List[Long]]) -> bool:
        """Send each step of any callable (a plain one makes one step) as it comes, through the message body.

        Returns whether its generator was closed at a step (a stop, its requests cancelled) rather than ended.
        """
        self._steps_taken = 0
        self._cut = False
        sent = 0
        try:
            for step in self._steps_of(self._requests(job_id, batch, body, longs)[0], job_id):
                _end_if_forked(self._pid)
                step, taken = take_out(_portable(host_step(step)))
                packed, parts, new_arena = pack_result(self._steps, step)
                self._send_result(job_id, packed, parts, new_arena, self._steps, False, step, taken)
                del step, packed, parts, taken
                sent += 1
                self._wait_for_steps_taken(job_id, sent)
        finally:
            _end_if_forked(self._pid)
            self._end_job()
        return self._cut

    def _wait_for_steps_taken(self, job_id: int, sent: int) -> None:
        """Wait while the server has STEPS_AHEAD steps of the job it has not taken, unless it says to stop."""
        while sent - self._steps_taken >= STEPS_AHEAD and not self._stopped(job_id):
            with self._reading:
                if sent - self._steps_taken < STEPS_AHEAD or self._exiting or self._stop_job == job_id:
                    return
                self._take(self.channel.receive())

    def _call(self, requests: List[Request]) -> Any:
        """Call a plain (sync or async) callable."""
        try:
            if self.kind is CallableKind.ASYNC:
                return self._event_loop().run_until_complete(self.fn(requests))
            return self.fn(requests)
        finally:
            _end_if_forked(self._pid)

    def _steps_of(self, requests: List[Request], job_id: int) -> Iterator[Any]:
        """Each step of any callable (a plain one yields once); stops after a step when the server says Stop."""
        if self.kind is CallableKind.SYNC_GENERATOR:
            generator = self.fn(requests)
            try:
                for step in generator:
                    yield step
                    if self._stopped(job_id):
                        self._cut = True
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
                        self._cut = True
                        return
            finally:
                loop.run_until_complete(agen.aclose())
        else:
            yield self._call(requests)

    def _stopped(self, job_id: int) -> bool:
        """Whether the server asked to stop this job (or to exit), or every request of it was cancelled."""
        self.read_messages()
        if self._exiting or self._stop_job == job_id:
            return True
        requests = self._job_requests
        return bool(requests) and all(request._cancelled for request in requests)

    @property
    def running_requests(self) -> List[Request]:
        """The requests of the job whose call runs (none between jobs)."""
        return self._job_requests

    def _end_job(self) -> None:
        """The job's call returned: from now on no thread reads the channel but this one (the next JOB is its)."""
        with self._reading:
            self._job_requests = []

    def read_messages(self) -> None:
        """Read what the server sent while a job runs (stops, cancels, answers, buffers), without waiting for more.

        Between jobs it reads nothing: a thread the callable left behind that asks is_cancelled() then must not
        take the server's next job.
        """
        with self._reading:
            while self._job_requests and not self._exiting and self.channel.readable():
                self._take(self.channel.receive())

    def _take(self, message: Message) -> None:
        """Act on a message that came while a job runs (the caller holds `_reading`)."""
        head = message.head
        if head[0] == EXIT:
            self._exiting = True
        elif head[0] == STOP:
            self._stop_job = head[1]
        elif head[0] == CANCEL:
            if head[1] == self._job_id and head[2] < len(self._job_requests):
                mark_cancelled(self._job_requests[head[2]])
        elif head[0] == STEPS_TAKEN:
            if head[1] == self._job_id:
                self._steps_taken = head[2]
        else:
            self._control(message)

    def _on_answer(self, message: Message) -> None:
        """Keep an answer for the thread that made the call (its outputs viewed); one to a call left: let go of.

        Every answer comes through here in order, under `_reading` or in the serving loop: one may bring the arena
        that the next ones name.
        """
        answers = self._answers.get(message.head[1])  # None: an answer to a call left before its end
        answer = self._calls.take_answer(message, answers is not None)
        if answers is not None:
            answers.append(answer)

    def _next_answer(self, call_id: int) -> Any:
        """The next answer to model call `call_id`, reading (and acting on) what else comes before it.

        The wait for the socket is outside the lock, so that another thread's is_cancelled() never waits for a
        model's answer; it is bounded, as that thread may take the bytes this one waited for.
        """
        while True:
            with self._reading:
                answers = self._answers[call_id]
                if answers:
                    return answers.popleft()
                if self._exiting or not self._job_requests:
                    raise ModelCallError(Status.UNAVAILABLE, "the request that made the call has ended")
                if self.channel.readable():
                    self._take(self.channel.receive())
                    continue
            select.select([self.channel.sock], [], [], 0.05)

    def call_model(self, arguments: CallArguments) -> Iterator[Dict[str, np.ndarray]]:
        """The running job's call to a model of the server (pytriton.compose): each response's outputs, as they come.

        The inputs go in shared memory the server reads in place, the outputs are views of the server's answer
        arena (model_calls.py). The channel is read here until the call ends, and what else comes meanwhile (STOP,
        CANCEL, EXIT, buffers) is acted on. A call left before its end is not told to the server: its late answers
        are let go of. Only a running job may call: between jobs the channel is the serving loop's to read.
        """
        with self._reading:
            if not self._job_requests:
                raise ModelCallError(
                    Status.INVALID_ARGUMENT, "a model is called only while a request of this instance runs"
                )
            self._next_call_id += 1
            call_id = self._next_call_id
            self._answers[call_id] = deque()
        try:
            with self._sending:
                message, fds = self._calls.call_message(self._job_id, call_id, arguments)
                self.channel.send_encoded(message, fds)
            del message
            while True:
                outputs = answered(self._next_answer(call_id))
                if outputs is None:
                    return
                yield outputs
        finally:
            with self._reading:
                del self._answers[call_id]

    def _control(self, message: Message) -> None:
        """Frontend buffers passed on (SEGMENT) and let go of (FORGET); what model calls are owed; ended sequences."""
        head = message.head
        if head[0] == SEGMENT:
            self._inputs.adopt_segment(head[1], message.fds[0], head[2])
        elif head[0] == FORGET:
            self._inputs.forget_segment(head[1])
        elif head[0] == MODEL_ANSWER:
            self._on_answer(message)
        elif head[0] == CALLS_READ:
            self._calls.calls_read(head[1])
        elif head[0] == SEQUENCES_ENDED:
            # No request of these sequences runs (they ended): the callable, maybe running now, never sees them.
            self._states.forget(head[1])

    def _send_result(
        self,
        job_id: int,
        packed: Any,
        body: List[Buffer],
        new_arena: int,
        writer: ArenaWriter,
        final: bool,
        value: Any,
        taken: List[TakenOut],
    ) -> None:
        """Send a packed result (or step) with the jobs whose inputs are free; `value` stands in if it cannot travel.

        The long object arrays `taken` out of it follow its body, in pieces.
        """
        fds = [writer.segment.fileno()] if new_arena and writer.segment is not None else []
        released = self._inputs.take_released()
        longs: Optional[List[Long]] = None
        if taken:
            longs, pieces = placed(taken, body)
            body = [*body, *pieces]
        try:
            message = encode((RESULT, job_id, packed, new_arena, final, longs, released), body, fds)
        except Exception:  # noqa: BLE001 - it cannot be pickled (a generator, a lock in an object output...)
            try:
                message = encode(
                    (RESULT, job_id, _sendable(packed, self._model), new_arena, final, longs, released), body, fds
                )
            except Exception:  # noqa: BLE001 - no list of dicts: the server's checks say what it is
                unsendable = (None, Unsendable(value))
                message = encode((RESULT, job_id, unsendable, new_arena, final, None, released), (), fds)
        self._send(message, fds)

    def _send(self, message: List[Buffer], fds: Sequence[int] = ()) -> None:
        """Send a job's message, after (in the same write) what the job changed in custom metrics, if anything.

        The server adds those before it answers the job, so a client that got its answer scrapes the counts.
        """
        updates = REGISTRY.take_updates()
        if updates:
            message = [*encode((METRICS, updates)), *message]
        read = self._calls.take_answers_read()
        if read:
            message = [*encode((ANSWERS_READ, read)), *message]
        with self._sending:  # a thread of the callable may be sending a model call
            self.channel.send_encoded(message, fds)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop async callables run on, made at their first call."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop


# Whether this process was forked since this module was imported: a child a callable forked, or a process that serves
# RemoteTriton's models started by fork (multiprocessing's default start on Linux) from one that imported it.
_forked = False


def _mark_forked() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_mark_forked)


def _end_if_forked(host_pid: int) -> None:
    """End a child the callable forked that returned (or raised) from it, as a model that forgets to end it does.

    `host_pid` is the process of the host that called it (getpid, a system call, only in forked processes). The
    child must not answer: the result arena is shared memory, mapped in the child as in the instance process and with
    the same allocator state, so packing its answer wrote over the instance's own answer (or a later job's) in place.
    """
    if _forked and os.getpid() != host_pid:
        _flush_and_exit()


def _flush_and_exit() -> None:
    """End the process at once, with what it printed written out (no atexit handler runs here)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


# The hosts of this process (a RemoteTriton process serves several), and the one whose serving loop runs in a thread.
_HOSTS: List[InstanceHost] = []
_SERVING = threading.local()


def _call_model(arguments: CallArguments) -> Iterator[Dict[str, np.ndarray]]:
    """This process's model calls (composition.set_process_caller): through the host whose job makes them.

    That is the host serving in this thread; from a thread the callable started, the one host running a job.
    """
    host: Optional[InstanceHost] = getattr(_SERVING, "host", None)
    if host is None:
        running = [each for each in _HOSTS if each.running_requests]
        if len(running) > 1:
            raise ModelCallError(
                Status.INVALID_ARGUMENT,
                "several instances of this process run requests: call models from the thread that runs the callable",
            )
        host = running[0] if running else _HOSTS[0] if _HOSTS else None
        if host is None:
            raise ModelCallError(
                Status.INVALID_ARGUMENT, "a model is called only while a request of this instance runs"
            )
    return host.call_model(arguments)


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
    # A job there is no memory for is failed alone (InstanceHost._run); the process lives.
    channel = BlockingChannel(socket.socket(fileno=fd), drops=lambda head: bool(head[0] == JOB))
    try:
        message = channel.receive()
    except ChannelClosed:
        return 1
    init: Init = message.head[1]
    REGISTRY.start_shipping((init.model_name, init.model_version))  # before the callable (or factory) loads
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
    _flush_and_exit()


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s: classes sent to the server (Unsendable) must be found there by name.
    from pytriton.core.process_instances.host import main as module_main

    sys.exit(module_main())
