"""What the server and an instance process say to each other, and how results and errors travel.

Messages are tuples whose first item is a tag (below). Those of every batch (JOB, RESULT, END) are plain
tuples of builtins: pickling a NamedTuple or a class costs ten times more (6.5 us against 0.5 us to pickle
a job's head here), about a tenth of what a process hop may cost. Rare ones carry a NamedTuple.

Tensors travel packed (pytriton/ipc/tensors.py) in regions of the sender's arena lent to the receiver until
it says it no longer views them (input_arena.py for a job's inputs, result_arena.py for its results, model_calls.py
for a callable's calls to other models). An
output that lies in its job's input region (an identity's, a slice of an input) is not copied: the result
names where it lies in the server's own arena.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

from pytriton.core.errors import FailureReason, InferenceError, Status, exception_text
from pytriton.core.logs.traceback_text import bounded_traceback
from pytriton.exceptions import PyTritonError
from pytriton.ipc.tensors import ArenaReader, ArenaWriter, Buffer

# Server to instance: (INIT, Init) (the body holds the pickled callable), (JOB, job id, streaming, requests,
# new arena size, jobs whose results the server no longer reads, longs), `longs` (None, or long_outputs.Long for
# each) where the requests' long object inputs lie in the body, in pickled pieces; (STOP, job id), (EXIT,),
# (SEGMENT, id, size) with the descriptor of a frontend process's buffer that jobs name inputs in,
# (FORGET, id) once it is gone, (CANCEL, job id, index) when the client of the job's request at `index` cancelled it,
# (SEQUENCES_ENDED, serials) as soon as sequences end without an END request run there (idle, cancelled): their
# state is dropped then, not at the next job, which may never come.
INIT, JOB, STOP, EXIT, SEGMENT, FORGET, CANCEL = 1, 2, 3, 4, 5, 6, 7
SEQUENCES_ENDED = 19
# Instance to server: (READY, kind, pid), (START_FAILED, traceback), (RESULT, job id, outputs, new arena size,
# final, longs, released), (FAILURE, job id, ErrorInfo, released), (END, job id, cut, released); `cut`: the generator
# was closed at a step (STOP, its requests cancelled), not ended by itself; `released` names the jobs whose inputs the
# process no longer views (usually the job answered: none when a model keeps its inputs); `longs` (None, or
# long_outputs.Long for each) where the outputs' long object arrays lie in the body, in pickled pieces.
READY, START_FAILED, RESULT, FAILURE, END = 11, 12, 13, 14, 15
# Instance to server, sent together with (in the same write as) a RESULT, FAILURE or END when the job changed
# custom metrics: (METRICS, updates), the updates of core/custom_metrics.py.
METRICS = 16
# A callable's call to another bound model (core/composition/), or a RemoteTriton route handler's (its request id
# stands for the job id: runtime/remote_routes.py), both made and read in model_calls.py: instance to server
# (MODEL_CALL, job id, call id, arguments, new arena size, answers read), `arguments` a plain tuple of
# composition.CallArguments whose inputs are packed, in a region of the instance's call arena lent for the call id (its
# descriptor with the message when the arena is new) or, up to COPY_BYTES in all, in the body. Server to instance
# (MODEL_ANSWER, call id, "response", packed outputs, new arena size, region key or 0, calls read) with the outputs in a
# region of the server's answer arena lent under `key` (or in the body, as inputs; or, IN_INPUTS, where they lie in the
# call's inputs), then (MODEL_ANSWER, call id, "end", calls read) or (MODEL_ANSWER, call id, "error", status name,
# message, calls read). `calls read`: the call ids whose input regions the server no longer views (also sent alone,
# (CALLS_READ, call ids), before a JOB); `answers read`: the keys of answer regions the instance no longer views (also
# sent alone, (ANSWERS_READ, keys), before a job's answer).
MODEL_CALL, MODEL_ANSWER, CALLS_READ, ANSWERS_READ = 17, 8, 9, 18
# Server to instance, while a streaming job runs: (STEPS_TAKEN, job id, steps) once the server took `steps` of its
# steps, every STEPS_ACK of them. The instance runs at most STEPS_AHEAD steps ahead of it: a stream whose client
# reads nothing holds the generator (the server takes no step for it), not a growing queue of steps in the server.
STEPS_TAKEN = 10
STEPS_AHEAD, STEPS_ACK = 32, 8


# A request of a job: (inputs, parameters, requested output names, sequence: (serial, id, start, end) or None);
# inputs and outputs travel as packed dicts.
JobRequest = Tuple[Any, Optional[Dict[str, Any]], Optional[List[str]], Optional[Tuple[int, Any, bool, bool]]]


class Init(NamedTuple):
    """What an instance process runs and how."""

    model_name: str
    instance_index: int
    factory: bool
    sys_path: List[str]
    model_config: Any
    arena_budget: int
    # Called with the loaded callable and `model_config` before the first job: what the binding layer attaches
    # to callables (the decorators' context), handed down so that this package needs nothing above it.
    prepare: Optional[Callable[[Any, Any], None]] = None
    model_version: str = ""  # what custom metrics made in the process are labelled with, and `model_name`


# The type name of the failure of a job whose inputs the process had no memory for (its new input arena could not be
# mapped, or its body not received): the server then sends the next job a new arena, as after a batch it could not
# send.
INPUTS_NOT_MAPPED = "InputsNotMapped"
INPUTS_NOT_MAPPED_BY = "pytriton.core.process_instances.host"  # its module, which no callable's exception names


# In a JOB's list of jobs whose results the server let go of: the server could not map the process's latest result
# arena (its memory limit), whose result failed; the process makes a new one for its next result.
RESULT_ARENA_REFUSED = -1


class ErrorInfo(NamedTuple):
    """An exception of the instance process, sendable whatever its class."""

    type_name: str
    module: str
    message: str
    traceback: str
    pickled: Optional[bytes]


def result_items(value: Any) -> Optional[Tuple[bool, Sequence[Any]]]:
    """A callable's result as (whether a tuple, its items) when it is a list or tuple, else None."""
    if isinstance(value, (list, tuple)):
        return type(value) is tuple, value
    return None


def result_value(as_tuple: Optional[bool], items: List[Any]) -> Any:
    """The list or tuple a result was."""
    return tuple(items) if as_tuple else items


def pack_result(writer: ArenaWriter, value: Any) -> Tuple[Any, List[Buffer], int]:
    """Pack what a callable returned: a list or tuple of dicts of arrays as such, anything else as it is."""
    items = result_items(value)
    if items is None:
        return (None, value), [], 0
    packed, body, arena = writer.pack(items[1])
    return (items[0], packed), body, arena


def unpack_result(reader: ArenaReader, packed: Any, body: memoryview) -> Any:
    """What pack_result packed, tensors copied out of the arena (the sender reuses it for its next message)."""
    as_tuple, items = packed
    if as_tuple is None:
        return items
    return result_value(as_tuple, reader.unpack(items, body, copy=True))


# -- errors -------------------------------------------------------------------------------------


class RemoteError(Exception):
    """An exception raised in an instance process; its class is named like the original's.

    Attributes:
        remote_traceback: the traceback formatted in the process that raised it.
    """

    remote_traceback = ""


_REMOTE_CLASSES: Dict[Tuple[str, str], Type[RemoteError]] = {}


def error_info(error: BaseException) -> ErrorInfo:
    """Describe an exception so that the server can raise its like."""
    text = bounded_traceback(error)  # a deep recursion's whole traceback takes seconds to format, and 14 MB
    pickled: Optional[bytes] = None
    if isinstance(error, InferenceError):
        pickled = pickle.dumps(("inference", error.status.name, error.message, error.reason.name))
    elif isinstance(error, PyTritonError):
        pickled = pickle.dumps(("pytriton", type(error).__module__, type(error).__qualname__, error.message))
    return ErrorInfo(type(error).__name__, type(error).__module__, exception_text(error), text, pickled)


def rebuild_error(info: ErrorInfo) -> BaseException:
    """The exception an ErrorInfo describes: pytriton's own classes as themselves, others as RemoteError."""
    error: BaseException
    if info.pickled is not None:
        kind, *fields = pickle.loads(info.pickled)
        if kind == "inference":
            status, message, reason = fields
            error = InferenceError(Status[status], message, FailureReason[reason])
        else:
            module, qualname, message = fields
            cls = _pytriton_class(module, qualname)
            error = cls(message) if cls is not None else _remote_class(info)(info.message)
    else:
        error = _remote_class(info)(info.message)
    setattr(error, "remote_traceback", info.traceback)  # noqa: B010 - any class may carry it
    return error


def _pytriton_class(module: str, qualname: str) -> Optional[Type[PyTritonError]]:
    """A PyTritonError subclass of pytriton's own modules, by name."""
    if not module.startswith("pytriton."):
        return None
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, PyTritonError) else None


def _remote_class(info: ErrorInfo) -> Type[RemoteError]:
    """A RemoteError subclass named like the original exception class."""
    key = (info.module, info.type_name)
    cls = _REMOTE_CLASSES.get(key)
    if cls is None:
        cls = _REMOTE_CLASSES[key] = type(info.type_name, (RemoteError,), {"__module__": info.module})
    return cls
