"""Calls to the server's models from another process: tensors through shared memory both ways, lent.

The one way across processes for `pytriton.compose`: a process instance's callable (host.py, instance.py) and a
RemoteTriton's route handler (runtime/remote_routes.py) call over their channel with the same messages (protocol.py:
MODEL_CALL, MODEL_ANSWER, CALLS_READ, ANSWERS_READ), packed and unpacked here: `CallerArenas` on the calling side,
`CalleeArenas` and `serve_call` on the server's.

The callable's inputs go into a region of the process's call arena lent for the call (`CallerArenas.pack_call`);
the server's inner request reads them in place, as views of that region (`CalleeArenas.arguments`), and the region
is the process's again once nothing in the server views it (the inner model may keep its inputs, or answer with
them). Each response's outputs go the other way, into a region of the server's answer arena lent under a key of
its own; the callable's outputs are views of it until the last of them is gone. An output that lies whole in the
call's inputs (an identity's, a slice) is not copied: the answer names where it lies, and the process's output is
a view of its own call arena, whose region it then holds until both sides let go. Each side says which regions it
let go of in its next message (protocol.py: "calls read", "answers read").

Unlike a job's, calls and answers cross: several threads of a callable may call at once, and the server answers
each call when its model does. So nothing is written in the arenas' copied-out start (ipc/regions.lend_apart):
what takes at most COPY_BYTES in all travels in the message body, and the receiver's arrays view the body.
"""

from __future__ import annotations

import functools
import os
import pickle
import threading
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from pytriton.core.composition.inner_call import InnerCall, outputs_of
from pytriton.core.composition.path import CallArguments, CallPath, ModelCallError
from pytriton.core.errors import InferenceError, Status
from pytriton.core.process_instances.input_arena import outputs_in_inputs
from pytriton.core.process_instances.protocol import MODEL_ANSWER, MODEL_CALL
from pytriton.core.tensors.raw_tensors import mark_leased
from pytriton.ipc.channel import ChannelClosed, LoopChannel, Message, encode
from pytriton.ipc.regions import LendingArena, copied_out
from pytriton.ipc.tensors import IN_INPUTS, ArenaReader, Buffer

Outputs = Dict[str, np.ndarray]
# What the calling side makes of one MODEL_ANSWER: ("response", outputs), ("end",) or ("error", status name, message).
Answer = Tuple[Any, ...]


class CalleeArenas:
    """The server's side, one per process: the process's call arena mapped, and the server's answer arena."""

    def __init__(self, budget_bytes: int) -> None:
        """An answer arena of at most `budget_bytes` (0: every answer travels in the message body)."""
        self.inputs = ArenaReader()
        self.answers = LendingArena(budget_bytes)
        self._read: Deque[int] = deque()  # call ids whose input region nothing here views (appended in any thread)
        self._next_key = 0

    def arguments(self, head: Any, message: Message) -> Tuple[CallArguments, Optional[np.ndarray]]:
        """The call a MODEL_CALL message makes, its inputs views of the process's call arena (or of the body).

        With it, the uint8 array over the process's arena that its inputs view (None: they are in the body): an
        answer's output that lies there is named, not copied (`pack_answer`).

        Raises:
            ValueError: the inputs did not arrive (the call's region, if any, is released already).
        """
        call_id, packed_arguments, new_arena = head[2], head[3], head[4]
        if new_arena:
            self.inputs.adopt(new_arena, message.fds)
        arguments = CallArguments._make(packed_arguments)
        packed: Any = arguments.inputs  # the packed items, one dict
        if copied_out(packed):  # nothing in the arena: in the body
            return arguments._replace(inputs=self.inputs.unpack(packed, message.body, copy=False)[0]), None
        view = self.inputs.view
        if view is None:
            self.release(call_id)
            raise ValueError("inputs in a call arena that never arrived")
        lease = np.ndarray((len(view),), np.uint8, view)
        # Nothing writes there while it lives: responses may send views of it as they are.
        mark_leased(lease, functools.partial(self._read.append, call_id))
        try:
            inputs = self.inputs.unpack(packed, message.body, copy=False, arena=lease)[0]
        except Exception:
            del lease  # its callback releases the region
            raise
        return arguments._replace(inputs=inputs), lease

    def release(self, call_id: int) -> None:
        """A call whose inputs were never viewed (it was refused before): its region is the process's again."""
        self._read.append(call_id)

    def take_read(self) -> Tuple[int, ...]:
        """The calls whose inputs nothing here views any more, since the last call."""
        return _taken(self._read)

    def pack_answer(
        self, outputs: Outputs, inputs: Optional[np.ndarray] = None
    ) -> Tuple[Any, List[Buffer], int, int, List[int]]:
        """A response's outputs: (packed, body parts, new arena size or 0, region key or 0, descriptors to give).

        Outputs that lie whole in the call's inputs (`inputs`, what `arguments` gave: an identity's, a slice) are
        named where they lie in the process's arena, not copied.
        """
        self._next_key += 1
        key = self._next_key
        in_inputs = outputs_in_inputs([outputs], inputs) if inputs is not None else None
        packed, body, new_arena, lent = self.answers.lend_apart([outputs], key, in_inputs)
        segment = self.answers.segment
        fds = [os.dup(segment.fileno())] if new_arena and segment is not None else []
        return packed, body, new_arena, key if lent else 0, fds

    def answers_read(self, keys: Tuple[int, ...]) -> None:
        """The process no longer views these answers' regions."""
        for key in keys:
            self.answers.give_back(key)

    def close(self) -> None:
        """Unmap the process's arena and release the answer arena (what views them keeps them mapped)."""
        self.inputs.close()
        self.answers.close()


def serve_call(
    calls: CalleeArenas,
    message: Message,
    path: Optional[CallPath],
    channel: Callable[[], Optional[LoopChannel]],
) -> None:
    """Run a MODEL_CALL on `path` (None: the request that makes it has ended); answer each response, then the end.

    Its inputs are views of the caller's call arena (or of the message body), its answers' outputs go in the
    server's answer arena. `channel()`: where the answers go, None once the caller is gone (its process died, its
    connection closed): nothing more is packed then, as `calls` may be closed.
    """
    head = message.head
    call_id = head[2]
    if head[5]:
        calls.answers_read(head[5])
    called = ""  # the model called
    refused = False  # the caller was told the call failed (an answer that could not reach it)

    def answer(head: Any, body: Any = (), fds: Any = ()) -> None:
        to = channel()
        if to is None:
            for fd in fds:
                os.close(fd)
            return
        try:
            to.send(head, body, fds, give=True)  # closes `fds`, sent or not
        except ChannelClosed:
            pass

    def wake() -> None:
        nonlocal refused
        if channel() is None or refused:  # the caller is gone, or was told the call failed: nothing to answer
            call.items.clear()
            return
        while call.items:
            outputs = outputs_of(call.items.popleft())
            unsendable = _unpicklable(outputs)
            if unsendable is not None:  # its message would fail: the caller would wait for ever, its instance stuck
                refused = True
                call.items.clear()
                why = f"model '{called}' answered what cannot reach the instance process: output {unsendable}"
                answer((MODEL_ANSWER, call_id, "error", Status.INTERNAL.name, why, calls.take_read()))
                call.refuse(InferenceError.internal(why))  # a stream's producer stops (an ended call: nothing)
                return
            inputs = None if inputs_of is None else inputs_of()
            packed, parts, new_arena, key, fds = calls.pack_answer(outputs, inputs)
            del outputs
            answer((MODEL_ANSWER, call_id, "response", packed, new_arena, key, calls.take_read()), parts, fds)
        if call.ended:
            error = call.error
            if error is None:
                answer((MODEL_ANSWER, call_id, "end", calls.take_read()))
            else:
                answer((MODEL_ANSWER, call_id, "error", error.status.name, error.message, calls.take_read()))

    call = InnerCall(wake)
    try:
        arguments, lease = calls.arguments(head, message)
    except Exception as error:  # noqa: BLE001 - the call fails alone
        why = f"the call's inputs did not arrive: {error}"
        answer((MODEL_ANSWER, call_id, "error", "INVALID_ARGUMENT", why, calls.take_read()))
        return
    inputs_of = weakref.ref(lease) if lease is not None else None  # the inner request holds it, not the call
    del lease
    called = arguments.name
    if path is None:
        why = f"the request that calls model '{arguments.name}' has ended"
        del arguments  # its inputs' region is the caller's again
        answer((MODEL_ANSWER, call_id, "error", "CANCELLED", why, calls.take_read()))
        return
    call.start(path, arguments, head[6])


def _sendable_call(packed_arguments: Any) -> Tuple[Any, str]:
    """A packed call whose object inputs, else parameters, that do not pickle are replaced; what did not pickle, why.

    An object input becomes an object array of its shape (of Nones), which the server checks as the input's dtype
    and shape; parameters that do not pickle go as none, then the requested outputs (a callable may pass anything).
    """
    name, packed, *rest = packed_arguments
    refs, others, order = packed[0]
    whys = []
    sendable = dict(others)
    for input_name, value in others.items():
        why = _pickling_error(value)
        if why is not None:
            sendable[input_name] = np.empty(np.shape(value), value.dtype if isinstance(value, np.ndarray) else object)
            whys.append(f"input '{input_name}' does not pickle ({why})")
    arguments = [name, [(refs, sendable, order)], *rest]
    # CallArguments: name, inputs, version, parameters, requested_outputs, timeout_s, streaming
    for index, what in ((3, "parameters"), (4, "requested outputs"), (2, "version")):
        if _pickling_error(tuple(arguments)) is None:
            break
        why = _pickling_error(arguments[index])
        if why is not None:
            arguments[index] = None
            whys.append(f"the {what} do not pickle ({why})")
    reason = "; ".join(whys) or "it does not pickle"
    return tuple(arguments), f"the call to model '{name}' cannot leave the instance process: {reason}"


def _pickling_error(value: Any) -> Optional[str]:
    """Why `value` does not pickle ("TypeError: ..."); None: it does."""
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - whatever pickling raises names the cause
        return f"{type(error).__name__}: {error}"
    return None


def _unpicklable(outputs: Outputs) -> Optional[str]:
    """The first output that would not pickle into an answer's message, with pickle's reason; None: all would.

    An object output's elements are pickled (PyTriton's checks look at the first one only: a lock may follow it).
    """
    for name, value in outputs.items():
        if type(value) is np.ndarray and not value.dtype.hasobject:
            continue  # raw bytes, in the arena or the body
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # noqa: BLE001 - whatever pickling raises names the cause
            return f"'{name}' ({type(error).__name__}: {error})"
    return None


class CallerArenas:
    """The instance process's side: its call arena, and the server's answer arena mapped.

    `pack_call` and the send of its message go under one lock (several threads call): a call packed later must not
    reach the server before the one that brought the arena it is packed in. A call's input region is free again
    once the server let go of it and no answer's output here views it (an identity's outputs are its inputs).
    """

    def __init__(self, budget_bytes: int) -> None:
        """A call arena of at most `budget_bytes` (0: every call travels in the message body)."""
        self._calls = LendingArena(budget_bytes)
        # Call ids whose input region one side let go of (the server; the outputs here that viewed it), applied at
        # the next pack; `_holds` counts the sides that view each lent region, `_regions` the arena each is in.
        self._let_go: Deque[int] = deque()
        self._holds: Dict[int, int] = {}
        self._regions: Dict[int, memoryview] = {}
        self._holding = threading.Lock()  # answers are read in one thread, calls packed in another
        self._answers = ArenaReader()
        self._answers_read: Deque[int] = deque()  # answer keys nothing here views (weak reference callbacks)
        self._watched: Dict[Any, Any] = {}

    def call_message(self, owner: int, call_id: int, arguments: CallArguments) -> Tuple[List[Buffer], List[int]]:
        """A MODEL_CALL message, encoded: (buffers, descriptors to send, not to give); `owner`: the job or request.

        Packed and sent under one lock, as `pack_call`; it also says which answers nothing here views any more.
        A call whose object inputs (or parameters) do not pickle still goes, what does not pickle replaced and said
        why: the server checks the call against its model as a thread instance's (its dtype, its shape), and fails it
        with the model's message, or INVALID_ARGUMENT naming what did not pickle. Not sent, the arena it may have
        grown (and its region) would be lost to the server, and every later call of this process with it.
        """
        packed, body, new_arena, fds = self.pack_call(call_id, arguments)
        read = self.take_answers_read()
        try:
            return encode((MODEL_CALL, owner, call_id, packed, new_arena, read, None), body, fds), fds
        except Exception:  # noqa: BLE001 - whatever pickling raises names the cause
            packed, unsent = _sendable_call(packed)
            return encode((MODEL_CALL, owner, call_id, packed, new_arena, read, unsent), body, fds), fds

    def pack_call(self, call_id: int, arguments: CallArguments) -> Tuple[Any, List[Buffer], int, List[int]]:
        """A call's MODEL_CALL items: (arguments to send, body parts, new arena size or 0, descriptors to send).

        The descriptors stay open until the arena grows again: the caller sends them before another call is packed.
        """
        arrays = {
            name: value if isinstance(value, np.ndarray) else np.asarray(value)
            for name, value in arguments.inputs.items()
        }
        let_go = self._let_go
        while let_go:
            self._release(let_go.popleft())
        packed, body, new_arena, lent = self._calls.lend_apart([arrays], call_id)
        segment = self._calls.segment
        fds = [segment.fileno()] if new_arena and segment is not None else []
        if lent and segment is not None:
            with self._holding:
                self._holds[call_id] = 1
                self._regions[call_id] = segment.view()
        return (arguments[0], packed, *arguments[2:]), body, new_arena, fds

    def _release(self, call_id: int) -> None:
        """One side let go of a call's input region: free once neither views it."""
        with self._holding:
            holds = self._holds.get(call_id)
            if holds is None:
                return
            if holds > 1:
                self._holds[call_id] = holds - 1
                return
            del self._holds[call_id], self._regions[call_id]
        self._calls.give_back(call_id)

    def calls_read(self, call_ids: Tuple[int, ...]) -> None:
        """The server no longer views these calls' inputs."""
        self._let_go.extend(call_ids)

    def _call_inputs(self, call_id: int) -> np.ndarray:
        """A uint8 array over the arena of a call's input region, holding the region while it lives."""
        with self._holding:
            region = self._regions.get(call_id)
            if region is None:
                raise ValueError("outputs in a call's inputs that are not there")
            self._holds[call_id] += 1
        inputs = np.ndarray((len(region),), np.uint8, region)
        watched = (call_id, id(inputs))
        self._watched[watched] = weakref.ref(
            inputs, functools.partial(_let_go, self._watched, self._let_go, watched, call_id)
        )
        return inputs

    def answer(self, head: Any, message: Message, wanted: bool) -> Optional[Outputs]:
        """A "response" answer's outputs (views of the server's arena or of the body); None when not `wanted`.

        Every answer goes through here, in the order they came (the one that brings a new arena first), wanted or
        not: one nobody waits for any more gives its region back at once.
        """
        _, call_id, _, packed, new_arena, key, calls_read = head
        if new_arena:
            self._answers.adopt(new_arena, message.fds)
        try:
            if not wanted:
                if key:
                    self._answers_read.append(key)
                return None
            inputs = self._call_inputs(call_id) if _in_inputs(packed) else None
            if not key:
                outputs: Outputs = self._answers.unpack(packed, message.body, copy=False, inputs=inputs)[0]
                return outputs
            view = self._answers.view
            if view is None:
                raise ValueError("outputs in an answer arena that never arrived")
            lease = np.ndarray((len(view),), np.uint8, view)
            watched = self._watched
            watched[key] = weakref.ref(lease, functools.partial(_let_go, watched, self._answers_read, key, key))
            outputs = self._answers.unpack(packed, message.body, copy=False, arena=lease, inputs=inputs)[0]
            return outputs
        finally:
            if calls_read:  # after the answer's own hold on its inputs, if any, is counted
                self.calls_read(calls_read)

    def take_answer(self, message: Message, wanted: bool) -> Answer:
        """What a MODEL_ANSWER says (see `Answer`); the outputs of a response not `wanted` are let go of at once.

        Every answer goes through here, in the order they came (one may bring the arena that the next ones name).
        """
        head = message.head
        if head[2] == "response":
            try:
                return ("response", self.answer(head, message, wanted))
            except Exception as error:  # noqa: BLE001 - that call fails alone
                return ("error", "INTERNAL", f"the answer's outputs did not arrive: {error}")
        if head[-1]:
            self.calls_read(head[-1])
        return tuple(head[2:-1])

    def take_answers_read(self) -> Tuple[int, ...]:
        """The answers whose outputs nothing here views any more, since the last call."""
        return _taken(self._answers_read)

    def close(self) -> None:
        """Release the call arena and unmap the answer arena (arrays still viewing it keep it mapped)."""
        self._calls.close()
        self._answers.close()


def answered(answer: Answer) -> Optional[Outputs]:
    """A response's outputs; None at the call's end; its error raised (ModelCallError)."""
    if answer[0] == "response":
        outputs: Outputs = answer[1]
        return outputs
    if answer[0] == "end":
        return None
    raise ModelCallError(Status[answer[1]], answer[2])


def _let_go(watched: Dict[Any, Any], gone: Deque[int], key: Any, value: int, _: Any) -> None:
    """A region's last view here is gone: `value` into `gone`.

    A weak reference's callback, which refers to no CallerArenas: no cycle.
    """
    watched.pop(key, None)
    gone.append(value)


def _in_inputs(packed: List[Any]) -> bool:
    """Whether a packed answer names outputs that lie in its call's inputs."""
    return any(len(item) == 3 and any(ref[0] == IN_INPUTS for ref in item[0].values()) for item in packed)


def _taken(read: Deque[int]) -> Tuple[int, ...]:
    """Everything in `read`, taken out oldest first (another thread may append meanwhile: popleft, not clear)."""
    if not read:
        return ()
    taken = []
    while read:
        taken.append(read.popleft())
    return tuple(taken)
