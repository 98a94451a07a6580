"""A model instance whose callable runs in another process: spawned (and restarted) here, or attached by RemoteTriton.

To the scheduler it is an instance like a thread one (`start`, `steps`, `when_idle`); behind it, each
batch is one Job message and its outputs one Result, tensors through the two processes' arenas.
If the process dies (a segfault, `os._exit`, the OOM killer), only the batch it held fails, with an
error that names the instance, and a spawned instance is started again; while it is down the
scheduler does not give it work, and the model stays ready as long as another instance is up.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import subprocess
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Deque, List, Optional, Set, Tuple

import numpy as np

from pytriton.core.composition.path import CURRENT, CallPath, PathSource
from pytriton.core.custom_metrics import REGISTRY
from pytriton.core.errors import BatchNotRun, OutputsNotTaken, exception_text
from pytriton.core.instances import CallableKind, Step, StreamStop
from pytriton.core.process_instances.input_arena import InputArena
from pytriton.core.process_instances.long_outputs import (
    TakenOut,
    long_arrays,
    pickled_off_loop,
    placed,
    put_back_off_loop,
    without,
)
from pytriton.core.process_instances.model_calls import CalleeArenas, serve_call
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
    MODEL_CALL,
    RESULT,
    RESULT_ARENA_REFUSED,
    SEGMENT,
    SEQUENCES_ENDED,
    STEPS_ACK,
    STEPS_TAKEN,
    STOP,
    rebuild_error,
    unpack_result,
)
from pytriton.core.process_instances.result_arena import lease_result
from pytriton.core.process_instances.spawn import ProcessPlan, Started, StartError, spawn
from pytriton.core.sequences.states import SequenceStates
from pytriton.ipc.channel import ChannelClosed, LoopChannel, Message, Reserved
from pytriton.ipc.regions import COPY_BYTES
from pytriton.ipc.segment_index import SHARED_SEGMENTS
from pytriton.ipc.segments import SharedMemoryUnavailable
from pytriton.ipc.spawn import exit_status, kill_group, stop_process
from pytriton.ipc.tensors import ArenaReader, Buffer, SharedPlaces
from pytriton.proxy.types import Request, mark_cancelled

LOGGER = logging.getLogger(__name__)

# A process that dies sooner than this after it started counts towards the restart backoff.
_STABLE_S = 10.0
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 10.0

Process = Optional["subprocess.Popen[bytes]"]
# A process serving an instance: the process (None: RemoteTriton's), its channel, its READY message.
Link = Tuple[Process, LoopChannel, Tuple[int, str, int]]
Restart = Callable[[], Awaitable[Started]]


class InstanceDied(RuntimeError):
    """The process of an instance ended while it held a batch."""


class BatchNotSent(BatchNotRun):
    """A batch could not be handed to the process of an instance (it fails alone; the instance serves on)."""


class InstanceState(enum.Enum):
    """Where a process instance is in its life."""

    UP = "up"  # its process serves jobs
    RESTARTING = "restarting"  # its process died; a new one is being started
    GONE = "gone"  # its process died and none will replace it (RemoteTriton)
    CLOSED = "closed"  # the server stopped it


def _result(head: Any) -> bool:
    return bool(head[0] == RESULT)


class _Link:
    """One process serving the instance: its channel and the two arenas between it and the server."""

    def __init__(self, process: Process, channel: LoopChannel, ready: Tuple[int, str, int], arena_budget: int) -> None:
        self.process = process
        self.channel = channel
        _, kind, self.pid = ready
        self.kind = CallableKind(kind)
        self.started = time.monotonic()
        self.inputs = InputArena(arena_budget)
        self.outputs = ArenaReader()
        self.calls = CalleeArenas(arena_budget)  # the callable's calls to other models
        # Jobs whose results the server no longer reads, to say in the next JOB (finalizers append, in any thread).
        self.done_with: Deque[int] = deque()
        self.segments: Set[int] = set()  # the frontend buffers (SHARED_SEGMENTS' ids) the process maps
        # A result or step the server has no memory for fails its batch (stream) alone (ProcessInstance._on_message).
        channel.drop_bodies(_result)

    def release(self, job_id: int) -> None:
        """The server no longer reads a job's result (a finalizer calls it, whenever the last array goes)."""
        self.done_with.append(job_id)

    def take_done_with(self) -> List[int]:
        """The jobs released since the last call."""
        done_with = self.done_with
        taken = []
        while done_with:
            taken.append(done_with.popleft())
        return taken

    def close(self) -> None:
        """Close the channel and release both arenas."""
        self.channel.close()
        self.inputs.close()
        self.outputs.close()
        self.calls.close()


class _Job:
    """The batch an instance holds: a future for a plain call, a queue of steps for a streaming one."""

    def __init__(
        self,
        job_id: int,
        future: Optional[asyncio.Future[Step]],
        steps: Optional[asyncio.Queue[Any]],
        requests: List[Request],
        source: Optional[PathSource],
    ):
        self.job_id = job_id
        self.future = future
        self.steps = steps
        self.requests = requests  # what the scheduler knows them by: a cancel names one by its index here
        self.refused = False  # a step of it could not be taken: it failed, and the process is told to stop it
        # The batch's call path: its callable's calls to other models.
        self.path: Optional[CallPath] = None if source is None else source.call_path()

    def fail(self, error: BaseException) -> None:
        """End the job with an error."""
        if self.future is not None:
            if not self.future.done():
                self.future.set_exception(error)
        elif self.steps is not None:
            self.steps.put_nowait(("error", error))


class ProcessInstance:
    """One instance of a model served by another process; everything here runs on the engine's loop."""

    def __init__(
        self,
        model_name: str,
        index: int,
        link: Link,
        arena_budget: int,
        restart: Optional[Restart] = None,
        on_gone: Optional[Callable[[ProcessInstance], None]] = None,
    ) -> None:
        """Serve through a process that is ready; `restart` starts a replacement (none: it stays gone)."""
        self.model_name = model_name
        self.index = index
        self.name = f"{model_name}-{index}"
        self.call_started_ns = 0  # set by the scheduler
        self.reported_call_ns = 0
        self.sequence_states: Optional[SequenceStates] = None  # the process keeps its sequences' state
        self._ended_sequences: List[int] = []  # sequences whose state the process drops, sent at the turn's end
        self._arena_budget = arena_budget
        self._restart = restart
        self._on_gone = on_gone
        self._job: Optional[_Job] = None
        self._next_job_id = 0
        self._on_idle: List[Tuple[Callable[..., None], Tuple[Any, ...]]] = []
        self._restarting: Optional[asyncio.Task[None]] = None
        self.state = InstanceState.UP
        self._link = self._adopt(link)
        SHARED_SEGMENTS.watch(self._forgotten)

    @property
    def kind(self) -> CallableKind:
        """The kind of the callable in the process."""
        return self._link.kind

    @property
    def alive(self) -> bool:
        """Whether a process serves this instance now."""
        return self.state is InstanceState.UP

    @property
    def label(self) -> str:
        """How logs name the instance."""
        return f"process {self._link.pid}"

    def _adopt(self, link: Link) -> _Link:
        """Serve through a new process."""
        process, channel, ready = link
        adopted = _Link(process, channel, ready, self._arena_budget)
        channel.handle(lambda message: self._on_message(adopted, message), lambda: self._on_closed(adopted))
        if channel.closed:  # it died between its Ready and now
            asyncio.get_running_loop().call_soon(self._on_closed, adopted)
        return adopted

    # -- jobs -----------------------------------------------------------------------------------

    def start(
        self, requests: List[Request], hand_over: bool = False, source: Optional[PathSource] = None
    ) -> Awaitable[Step]:
        """Send a batch to the process; await its outputs (copied out of the process's arena)."""
        future: asyncio.Future[Step] = asyncio.get_running_loop().create_future()
        self._send_job(requests, _Job(self._new_job_id(), future, None, requests, source), streaming=False)
        return future

    async def steps(self, requests: List[Request], stop: StreamStop) -> AsyncIterator[Step]:
        """Yield each step of the callable's results (a plain callable yields once); `stop` ends it early (`cut`)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        job = _Job(self._new_job_id(), None, queue, requests, CURRENT.get())
        self._send_job(requests, job, streaming=True)
        ended = stop_sent = False
        taken = 0
        try:
            while True:
                kind, value = await queue.get()
                if kind == "later":  # a step whose long outputs are being rebuilt (long_outputs.py)
                    value = await value
                elif kind == "end":
                    ended = True
                    stop.cut = value  # the process closed the generator at a step (END's flag)
                    return
                if kind == "error":
                    ended = True
                    try:
                        raise value
                    finally:
                        # The error's traceback holds this frame: not the error too. That reference cycle kept the
                        # frames it passed (the batch's requests and their inputs) until a full collection.
                        value = None
                taken += 1
                if taken % STEPS_ACK == 0:
                    self._send_steps_taken(job, taken)
                yield value
                if stop.is_set() and not stop_sent:
                    stop_sent = self._send_stop(job)
        finally:
            if not ended and not stop_sent:
                self._send_stop(job)

    def _new_job_id(self) -> int:
        self._next_job_id += 1
        return self._next_job_id

    def _send_job(self, requests: List[Request], job: _Job, streaming: bool) -> None:
        """Pack a batch's inputs into the arena and send it; a dead process fails the job at once.

        A batch that cannot be packed or sent (say, an input that does not pickle) fails alone, and
        the instance is free for the next one. Long object inputs (long_outputs.py) are pickled in a thread: the JOB
        goes once they are, in the place kept for it in the channel (a CANCEL or STOP sent meanwhile follows it).
        """
        link = self._link
        if self.state is not InstanceState.UP:
            job.fail(self._died_error(link, "is not running"))
            return
        self._job = job
        done_with: List[int] = []
        try:
            dicts = [request.data for request in requests]
            found = long_arrays(dicts)
            if found:
                dicts = without(dicts, found)
            in_shared = self._shared_inputs(link, dicts) if SHARED_SEGMENTS else None
            packed, body, arena = link.inputs.pack(dicts, job.job_id, in_shared)
            batch = [
                (data, request.parameters, request.requested_output_names, _sequence_of(request))
                for data, request in zip(packed, requests)
            ]
            fds = [link.inputs.segment.fileno()] if arena and link.inputs.segment is not None else []
            done_with = link.take_done_with()
            calls_read = link.calls.take_read()
            if calls_read:  # the last model calls' inputs, let go of after their answers went
                link.channel.send((CALLS_READ, calls_read))
            if not found:
                link.channel.send((JOB, job.job_id, streaming, batch, arena, done_with, None), body, fds)
                return
            head = (JOB, job.job_id, streaming, batch, arena, done_with)
            place = link.channel.reserve()
            pickled_off_loop(found).add_done_callback(
                functools.partial(self._send_long_job, link, job, place, head, body, fds)
            )
        except ChannelClosed:
            pass  # _on_closed fails the job
        except Exception as error:  # noqa: BLE001 - the batch fails alone; the instance must not stay busy with it
            self._not_sent(link, job, done_with, error)

    def _send_long_job(
        self,
        link: _Link,
        job: _Job,
        place: Reserved,
        head: Tuple[Any, ...],
        body: List[Buffer],
        fds: List[int],
        pickled: asyncio.Future[List[TakenOut]],
    ) -> None:
        """A job's long inputs are pickled: its JOB goes in its place, their pieces after its body."""
        try:
            longs, pieces = placed(pickled.result(), body)
            place.fill((*head, longs), [*body, *pieces], fds)
        except ChannelClosed:
            pass  # _on_closed fails the job
        except Exception as error:  # noqa: BLE001 - as _send_job's
            place.drop()
            if self._job is job and link is self._link:
                self._not_sent(link, job, head[5], error)

    def _not_sent(self, link: _Link, job: _Job, done_with: List[int], error: Exception) -> None:
        """A batch could not be sent: it fails alone, and the instance is free."""
        link.done_with.extendleft(reversed(done_with))  # said with the next job instead
        link.inputs.close()  # the process may not have the arena this batch was packed in: the next job sends one
        self._finish_job()
        job.fail(BatchNotSent(f"model '{self.model_name}' instance {self.index} could not take the batch: {error}"))

    def _shared_inputs(self, link: _Link, dicts: List[Any]) -> Optional[SharedPlaces]:
        """Inputs that lie in a frontend's buffer, which the process reads in place (mapped first where it is not)."""
        found: Optional[SharedPlaces] = None
        for data in dicts:
            for array in data.values():
                if type(array) is np.ndarray and array.nbytes > COPY_BYTES:
                    place = SHARED_SEGMENTS.locate(array)
                    if place is None:
                        continue
                    if place[0] not in link.segments:
                        fd, size = SHARED_SEGMENTS.descriptor(place[0])
                        link.channel.send((SEGMENT, place[0], size), fds=[fd])
                        link.segments.add(place[0])
                    if found is None:
                        found = {}
                    found[id(array)] = place
        return found

    def _forgotten(self, segment_id: int) -> None:
        """A frontend let go of a buffer: the process unmaps it once none of its inputs views it."""
        link = self._link
        if segment_id in link.segments:
            link.segments.discard(segment_id)
            if self.state is InstanceState.UP:
                try:
                    link.channel.send((FORGET, segment_id))
                except ChannelClosed:
                    pass

    def cancel(self, request: Request) -> None:
        """A request of the running job was cancelled: its `is_cancelled()` in the process says so before long.

        The process reads the cancel when the callable asks `is_cancelled()`, and between a generator's steps.
        """
        mark_cancelled(request)
        job = self._job
        if job is None or self.state is not InstanceState.UP:
            return
        for index, held in enumerate(job.requests):
            if held is request:
                try:
                    self._link.channel.send((CANCEL, job.job_id, index))
                except ChannelClosed:
                    pass
                return

    def _send_steps_taken(self, job: _Job, taken: int) -> None:
        """Tell the process how many steps of a streaming job the server took (it runs STEPS_AHEAD ahead at most)."""
        if self._job is job and self.state is InstanceState.UP:
            try:
                self._link.channel.send((STEPS_TAKEN, job.job_id, taken))
            except ChannelClosed:
                pass

    def _send_stop(self, job: _Job) -> bool:
        """Ask the process to stop a streaming job after its current step."""
        if self._job is job and self.state is InstanceState.UP:
            try:
                self._link.channel.send((STOP, job.job_id))
            except ChannelClosed:
                pass
        return True

    def _on_message(self, link: _Link, message: Message) -> None:
        """A result, a step, an error or the end of a job; or the callable's call to another model."""
        head = message.head
        tag = head[0]
        if tag == METRICS:  # what the job about to be answered changed in custom metrics: counted before its answer
            REGISTRY.apply_updates(head[1])
            return
        if tag == ANSWERS_READ:
            link.calls.answers_read(head[1])
            return
        job = self._job
        if tag == MODEL_CALL:
            self._model_call(link, job, message)
            return
        if job is None or head[1] != job.job_id:
            self._let_go(link, message)
            return
        if job.refused:  # its stream failed; the process ends it at its next step (STOP): what comes is let go of
            self._let_go(link, message)
            if tag in (FAILURE, END):
                self._finish_job()
            return
        if tag == RESULT:
            _, _, packed, arena, final, longs, released = head
            if arena or message.lost:
                # At the server's memory limit: a new arena it cannot map, a body it had no room for (dropped by the
                # channel). This batch (a stream: this request's stream) fails, not the process.
                reason = f"the server had no memory for its {message.lost} bytes of outputs" if message.lost else ""
                if arena:
                    try:
                        link.outputs.adopt(arena, message.fds)
                    except SharedMemoryUnavailable as error:
                        link.done_with.append(RESULT_ARENA_REFUSED)
                        reason = f"the server could not map its outputs: {exception_text(error)}"
                if reason:
                    if released:
                        link.inputs.released(released)
                    if final:
                        link.release(job.job_id)  # its region in the process's arena, unread here
                        self._finish_job()
                    else:  # a step: the instance is busy until the process has stopped the stream
                        job.refused = True
                        self._send_stop(job)
                    job.fail(OutputsNotTaken(f"model '{self.model_name}' instance {self.index}: {reason}"))
                    return
            if final:  # outputs in the job's inputs hold its region before the process's release is counted
                inputs = functools.partial(link.inputs.lease, job.job_id)
                release = functools.partial(link.release, job.job_id)
                value = lease_result(link.outputs, packed, message.body, release, inputs)
            else:
                value = unpack_result(link.outputs, packed, message.body)
            if released:
                link.inputs.released(released)
            if longs:  # rebuilt off the loop; a step's place in its stream is kept (steps() awaits it)
                later = put_back_off_loop(value, longs, message.body)
                if final:
                    self._finish_job()
                    if job.future is not None:
                        later.add_done_callback(functools.partial(_settle, job.future))
                elif job.steps is not None:
                    job.steps.put_nowait(("later", later))
            elif final:
                self._finish_job()
                if job.future is not None and not job.future.done():
                    job.future.set_result(value)
            elif job.steps is not None:
                job.steps.put_nowait(("step", value))
        elif tag == FAILURE:
            link.inputs.released(head[3])
            self._finish_job()
            info = head[2]
            if info.type_name == INPUTS_NOT_MAPPED and info.module == INPUTS_NOT_MAPPED_BY:
                link.inputs.close()  # the process has no arena now: the next job sends one
                reason = f"could not take the batch's inputs: {info.message}"
                job.fail(BatchNotSent(f"model '{self.model_name}' instance {self.index} {reason}"))
            else:
                job.fail(rebuild_error(head[2]))
        elif tag == END:
            link.inputs.released(head[3])
            self._finish_job()
            if job.steps is not None:
                job.steps.put_nowait(("end", head[2]))

    @staticmethod
    def _let_go(link: _Link, message: Message) -> None:
        """A job's message the server does not read (of no job held, or of a stream that failed): what it frees."""
        head = message.head
        tag = head[0]
        if tag == RESULT:  # its arena is still the process's from now on, its region free
            _, job_id, _, arena, final, _, _ = head
            if arena:
                link.outputs.adopt(arena, message.fds)
            if final:
                link.release(job_id)
        else:
            for fd in message.fds:
                os.close(fd)
        if tag in (RESULT, FAILURE, END):
            link.inputs.released(head[-1])

    def _model_call(self, link: _Link, job: Optional[_Job], message: Message) -> None:
        """Run the callable's call to another model on the job's call path (model_calls.serve_call)."""
        path = job.path if job is not None and job.job_id == message.head[1] else None
        serve_call(link.calls, message, path, functools.partial(self._live_channel, link))

    def _live_channel(self, link: _Link) -> Optional[LoopChannel]:
        """The channel of `link` while its process serves this instance, else None."""
        return link.channel if link is self._link and self.state is InstanceState.UP else None

    def _finish_job(self) -> None:
        """The process is free: run the idle callbacks."""
        self._job = None
        if self.state is InstanceState.UP and self._on_idle:
            callbacks, self._on_idle = self._on_idle, []
            for callback, args in callbacks:
                callback(*args)

    def forget_sequences(self, serials: List[int]) -> None:
        """Sequences whose state the process drops now (they ended without an END run here).

        Said at the end of this loop turn, not with the next job: a sequence that ended idle may be the last the
        instance saw, and its state (a model's cache, say) must not stay until a request comes. Those of one turn
        go in one message (a thousand sequences idle at once: not a thousand writes). A process restarting has no
        state to drop.
        """
        if self.state is not InstanceState.UP:
            return
        if not self._ended_sequences:
            asyncio.get_running_loop().call_soon(self._send_ended_sequences)
        self._ended_sequences.extend(serials)

    def _send_ended_sequences(self) -> None:
        ended, self._ended_sequences = self._ended_sequences, []
        if ended and self.state is InstanceState.UP:
            try:
                self._link.channel.send((SEQUENCES_ENDED, ended))
            except ChannelClosed:
                pass

    def when_idle(self, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(*args)` once no job is in progress and a process serves the instance."""
        if self._job is None and self.state is InstanceState.UP:
            callback(*args)
        else:
            self._on_idle.append((callback, args))

    # -- death and restart ----------------------------------------------------------------------

    def _on_closed(self, link: _Link) -> None:
        """The process's channel closed: unless the server closed it, the process died."""
        if link is not self._link or self.state is not InstanceState.UP:
            return
        self.state = InstanceState.RESTARTING if self._restart is not None else InstanceState.GONE
        self._restarting = asyncio.get_running_loop().create_task(self._after_death(link))

    async def _after_death(self, link: _Link) -> None:
        """Fail the batch it held with its exit status, then start a new process (or report it gone)."""
        code = None
        if link.process is not None:
            code = await stop_process(link.process, kill=False, grace_s=1.0)
            kill_group(link.process)  # what it forked lived on beside its replacement, holding what it held
        link.close()
        how = exit_status(code) if code is not None else "closed its connection"
        job, self._job = self._job, None
        held = "; the requests of its batch failed" if job is not None else ""
        if job is not None:
            job.fail(self._died_error(link, how))
        if self._restart is None:
            LOGGER.error("model '%s' instance %d (pid %d) %s%s", self.model_name, self.index, link.pid, how, held)
            if self._on_gone is not None:
                self._on_gone(self)
            return
        LOGGER.error(
            "model '%s' instance %d (pid %d) %s%s; starting it again", self.model_name, self.index, link.pid, how, held
        )
        delay = _FIRST_BACKOFF_S if time.monotonic() - link.started < _STABLE_S else 0.0
        while self.state is InstanceState.RESTARTING:
            if delay:
                await asyncio.sleep(delay)
            started = time.monotonic()
            try:
                new_link = await self._restart()
            except StartError as error:
                delay = min(max(delay * 2, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
                LOGGER.error(
                    "model '%s' instance %d did not start again (%s); next try in %.1f s",
                    self.model_name,
                    self.index,
                    error,
                    delay,
                )
                continue
            if self.state is not InstanceState.RESTARTING:  # stopped meanwhile
                await _discard(new_link)
                return
            self._link = self._adopt(new_link)
            self.state = InstanceState.UP
            LOGGER.info(
                "model '%s' instance %d is serving again (pid %d, started in %.2f s)",
                self.model_name,
                self.index,
                self._link.pid,
                time.monotonic() - started,
            )
            self._finish_job()
            return

    def _died_error(self, link: _Link, how: str) -> InstanceDied:
        """The error a batch gets when the instance's process ends under it."""
        return InstanceDied(f"model '{self.model_name}' instance {self.index} (pid {link.pid}) {how}")

    # -- stopping -------------------------------------------------------------------------------

    async def close(self, deadline: Optional[float] = None) -> None:
        """Stop the process: at once if it still runs a call (the drain is over), else once it has exited.

        An idle process is told to exit and killed if it has not after EXIT_GRACE_S, or at `deadline`
        (time.monotonic(): the end of the server's stop) when that comes sooner.
        """
        previous, self.state = self.state, InstanceState.CLOSED
        SHARED_SEGMENTS.unwatch(self._forgotten)
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()
        link = self._link
        if previous is InstanceState.UP:
            busy = self._job is not None
            if not busy:
                try:
                    link.channel.send((EXIT,))
                except ChannelClosed:
                    pass
            if link.process is not None:
                await stop_process(link.process, kill=busy, deadline=deadline)
                kill_group(link.process)  # processes the model forked (they would outlive the server)
        link.close()
        job, self._job = self._job, None
        if job is not None:
            job.fail(self._died_error(link, "was stopped with the server"))


async def _discard(link: Link) -> None:
    """Stop a process that came up after its instance was closed."""
    process, channel, _ = link
    channel.close()
    if process is not None:
        await stop_process(process, kill=True)
        kill_group(process)


async def start_instances(plan: ProcessPlan) -> List[ProcessInstance]:
    """Start every process instance of a model at once; all are up, or StartError names the one that failed."""
    processes = f"{plan.count} instance process{'' if plan.count == 1 else 'es'}"
    LOGGER.info("model '%s': starting %s", plan.model_name, processes)
    began = time.monotonic()

    async def start(index: int) -> ProcessInstance:
        try:
            link = await spawn(plan, index)
        except StartError as error:
            raise StartError(f"instance {index} did not start: {error}") from None
        LOGGER.info(
            "model '%s': instance %d is up (pid %d) after %.2f s",
            plan.model_name,
            index,
            link[2][2],
            time.monotonic() - began,
        )
        return ProcessInstance(plan.model_name, index, link, plan.arena_budget, restart=lambda: spawn(plan, index))

    results = await asyncio.gather(*(start(index) for index in range(plan.count)), return_exceptions=True)
    started = [result for result in results if isinstance(result, ProcessInstance)]
    failed = [result for result in results if isinstance(result, BaseException)]
    if failed:
        await asyncio.gather(*(instance.close() for instance in started))
        raise failed[0]
    LOGGER.info("model '%s': %s ready in %.2f s", plan.model_name, processes, time.monotonic() - began)
    return started


def _settle(future: asyncio.Future[Any], rebuilt: asyncio.Future[Any]) -> None:
    """A job's future gets its result once its long outputs are rebuilt (or what rebuilding them raised)."""
    if future.done():
        if not rebuilt.cancelled():
            rebuilt.exception()  # retrieved: nobody waits for it any more
        return
    if rebuilt.cancelled():
        future.cancel()
        return
    error = rebuilt.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(rebuilt.result())


def _sequence_of(request: Request) -> Optional[Tuple[int, Any, bool, bool]]:
    """What a job says of a request's sequence: (serial, id, start, end), None when it belongs to none."""
    if not request.sequence_serial:
        return None
    return (request.sequence_serial, request.sequence_id, request.sequence_start, request.sequence_end)
