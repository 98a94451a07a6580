"""What a frontend process and the hub (the process that holds the models) say to each other.

Every message is a tuple whose first item is a tag. Requests, responses and their ends are posted to an
outbox (ipc/outbox.py) and travel in batches; calls (ipc/calls.py) carry everything else: forwarded API
requests, the state the hub mirrors into its frontends, and the lifecycle.

First, hub to frontend: (INIT, Init); the frontend answers (READY, pid) or (START_FAILED, what failed).
Frontend to hub:
    (INFER, key, model, version, request id, inputs, parameters, requested outputs, batch size, priority,
     timeout us, arrival ns, streaming, sequence parameters (id, start, end) or None, version named): `version`
     is the one the frontend found; `version named` whether the client named it (else the hub answers a version
     out of service as one process answers a request naming none)
    (INFER_PIECES, ...as INFER): a request with an input in pickled pieces (below): the hub rebuilds it off its loop
    (CANCEL, key): the client left, or cancelled
    (SEGMENT, id, size), alone, with the descriptor of a receive buffer the frontend made; (FORGET, id)
    (RETURNED, loans): the frontend no longer views these regions of the hub's arena
    (REFUSED, ARENA_PLACE): the frontend could not map the hub's new arena (out of descriptors)
    (CLOSED, kind): a connection the hub handed over closed (the hub counts them against the caps)
    (TOKENS, model, version, first token ns, gaps ns, output tokens, prompt tokens): one generation of the
     OpenAI API, counted in the model's statistics on the hub (core/stats.TokenStats)
    (TAKEN, key, responses): the frontend took so many responses of a streaming request, every STREAM_ACK of them;
     the hub delivers at most STREAM_AHEAD more than it took, so a client that reads nothing of its stream holds
     the model's generator, not a growing queue of responses in its frontend
    (SENT, key, protocol, stamps): the transport's timestamps of a TRACED_RESPONSE (received from, to, sent from,
     to; protocol HTTP or GRPC), or none (protocol ""): the hub's trace file record of the request is complete
    (LOG, fields): a record of the frontend's `pytriton` loggers (log_records.py), handled by the hub's loggers
Hub to frontend:
    (RESPONSE, key, outputs, datatypes, final, loan, parameters),
    (TRACED_RESPONSE, ...as RESPONSE): the response of a request the hub writes a trace file record of, which
     waits for the frontend's SENT; only such requests' responses are timed and answered so
    (FAILED, key, status, message, reason, of request, answered: the request's answer, not refused at submission),
    (END, key); `loan` names the response's region of the hub's arena (0: none), for RETURNED
    (ARENA, size), alone, with the descriptor of the hub's new arena for this frontend
    (RELEASED, keys): the hub no longer views these requests' inputs in the frontend's buffers
    (REFUSED, id): the hub could not map that receive buffer (out of descriptors): its requests are copied
    (CONNECTION, "http" or "grpc", over the cap), alone, with the descriptor of a connection the hub accepted

A tensor of a fixed-size dtype is (name, dtype, shape, offset, nbytes, where): its bytes are in the message body
(where BODY), or stay where they are: in a frontend's buffer (where is the segment's id, from 1), or in the hub's
arena (ARENA). Those of at least SHARED_BYTES that lie in shared memory are named, never copied; smaller ones cost
less copied into the body. An object (BYTES) array is (name, None, array), pickled in the head; one of
PIECE_ELEMENTS or more (long_outputs.is_long) is (name, "|O", shape, offset, piece sizes, PIECES): its elements,
pickled as lists of PIECE_ELEMENTS, lie in the body (core/process_instances/long_outputs.py). numpy pickles an
object array whole, in one call that holds the GIL (a million short strings: 0.2 s, on the loop that sends it; 0.05
s unpickled, on the loop that reads it, and the head grows by their size); lists pickle four times faster, and the
receiver rebuilds the array a piece at a time (`rebuild_long`). Either side does both off its loop, in threads
(long_outputs.off_loop): the hub (hub.py) and the frontend (remote.py), each keeping a request's messages in order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.errors import FailureReason, InferenceError, Status
from pytriton.core.process_instances.long_outputs import is_long, pickled_or_none, rebuilt
from pytriton.core.request import InferenceRequest, InferenceResponse, OutputTensor
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.raw_tensors import plain_elements
from pytriton.ipc.regions import COPY_BYTES
from pytriton.ipc.tensors import Buffer, dtype_code, dtype_of
from pytriton.options.server import ServerOptions

INFER, CANCEL, RESPONSE, FAILED, END, CONNECTION = 1, 2, 5, 6, 7, 8
SEGMENT, FORGET, RETURNED, ARENA, RELEASED, CLOSED = 9, 10, 11, 12, 13, 14
TOKENS, TAKEN, TRACED_RESPONSE, SENT, REFUSED, LOG = 15, 16, 17, 18, 19, 20
INFER_PIECES = 21
STREAM_AHEAD, STREAM_AHEAD_BYTES, STREAM_ACK = 256, 16 << 20, 32
INIT, READY, START_FAILED = 101, 102, 103
# Where a tensor's bytes are, besides a frontend buffer (its segment id): PIECES, an object array's, pickled.
BODY, ARENA_PLACE, PIECES = 0, -1, -2
SHARED_BYTES = COPY_BYTES + 1
_OBJECT_CODE = dtype_code(np.dtype(object))

# A region the hub mirrors: (name, key, offset, byte size).
Region = Tuple[str, str, int, int]


class Init(NamedTuple):
    """What a frontend process serves, and where."""

    number: int
    options: ServerOptions
    server_version: str
    http: bool  # whether it serves HTTP
    grpc: bool  # whether it serves gRPC
    models: List[ModelSpec]
    unloaded: List[Tuple[str, int]]  # the model versions out of service (unloaded, or removed for good)
    trace_stamps: bool  # whether the hub writes trace files (its transports' requests are timed for them)
    log_levels: Dict[str, int]  # the levels of the hub's loggers, the root's under "" (log_records.logger_levels)


# Where a large array lies in shared memory: (where, offset), or None to copy it into the body.
Place = Callable[[np.ndarray], Optional[Tuple[int, int]]]
# The array a packed item names: (where, offset, nbytes, dtype, shape) -> array.
Resolve = Callable[[int, int, int, np.dtype, Tuple[int, ...]], np.ndarray]


def pack_request(
    key: int,
    model: str,
    version: str,
    request: InferenceRequest,
    streaming: bool,
    place: Place,
    named: bool = True,
    pickled: Optional[Pickled] = None,
) -> Tuple[Any, List[Buffer], bool]:
    """An INFER message, its body, and whether any input stays in a frontend buffer (viewed until RELEASED).

    The body holds the other inputs' bytes as views: the request lives until its answer. `pickled`: its long
    object inputs' pieces, pickled ahead (`pickle_inputs_ahead`); the others are pickled now, or with
    PICKLE_FIRST none is: a long one raises LongInputs.
    """
    parts: List[Buffer] = []
    inputs, shared, pieces = _pack_arrays(request.inputs.items(), parts, copy=False, place=place, pickled=pickled)
    head = (
        INFER_PIECES if pieces else INFER,
        key,
        model,
        version,
        request.id,
        inputs,
        request.parameters,
        request.requested_outputs,
        request.batch_size,
        request.priority,
        request.timeout_us,
        request.arrival_ns,
        streaming,
        request.sequence,
        named,
    )
    return head, parts, shared


def unpack_request(
    head: Any, body: memoryview, resolve: Resolve, long_arrays: Optional[Dict[str, np.ndarray]] = None
) -> InferenceRequest:
    """The request an INFER message carries; its arrays view the message body or shared memory.

    Its long object arrays are taken from `long_arrays` (`rebuild_long`'s) where given, else rebuilt now.
    """
    (
        _,
        _,
        _,
        _,
        request_id,
        inputs,
        parameters,
        requested,
        batch_size,
        priority,
        timeout_us,
        arrival_ns,
        _,
        sequence,
        _,
    ) = head
    arrays = {}
    for item in inputs:  # _array's work, inline: this runs for every request the hub takes
        code = item[1]
        if code is None:
            arrays[item[0]] = item[2]
            continue
        dtype = _STR_DTYPES.get(code) if type(code) is str else None
        if dtype is None:
            dtype = dtype_of(code)
            if type(code) is str:
                _STR_DTYPES[code] = dtype
        if item[5] == BODY:
            arrays[item[0]] = np.ndarray(item[2], dtype, body, item[3])  # numpy checks the bounds
        elif item[5] == PIECES:
            arrays[item[0]] = _rebuilt(item, body, long_arrays)
        else:
            arrays[item[0]] = resolve(item[5], item[3], item[4], dtype, item[2])
    return InferenceRequest(
        request_id=request_id,
        inputs=arrays,
        parameters=parameters,
        requested_outputs=requested,
        batch_size=batch_size,
        priority=priority,
        timeout_us=timeout_us,
        arrival_ns=arrival_ns,
        sequence=sequence,
    )


# The dtypes of the codes seen (builtin dtypes travel as their strings: a handful of them).
_STR_DTYPES: Dict[str, np.dtype] = {}


def pack_response(
    key: int, response: InferenceResponse, place: Place, loan: int, pickled: Optional[Pickled] = None
) -> Tuple[Any, List[Buffer]]:
    """A RESPONSE message and its body: outputs of the body copied now (a callable may write its arrays again).

    `pickled`: its long object outputs' pieces, pickled ahead (`pickle_ahead`); the others are pickled now.
    """
    parts: List[Buffer] = []
    named = [(output.name, output.array) for output in response.outputs]
    outputs, _, _ = _pack_arrays(named, parts, copy=True, place=place, pickled=pickled)
    datatypes = tuple(output.datatype for output in response.outputs)
    return (RESPONSE, key, outputs, datatypes, response.final, loan, response.parameters), parts


def pack_small_response(key: int, response: InferenceResponse) -> Optional[Tuple[Any, List[Buffer]]]:
    """`pack_response` for the usual response, every output copied into the body; None when one is large.

    The hub packs a response per request: this is `_pack_arrays` without the placing, in one loop.
    """
    parts: List[Buffer] = []
    packed: List[Tuple[Any, ...]] = []
    datatypes: List[str] = []
    offset = 0
    for output in response.outputs:
        array = output.array
        datatypes.append(output.datatype)
        if type(array) is not np.ndarray or array.dtype.hasobject:
            if is_long(array):
                return None
            packed.append((output.name, None, plain_objects(array)))
            continue
        nbytes = array.nbytes
        if nbytes >= SHARED_BYTES:
            return None
        parts.append(array.tobytes())
        packed.append((output.name, dtype_code(array.dtype), array.shape, offset, nbytes, BODY))
        offset += nbytes
    return (RESPONSE, key, tuple(packed), tuple(datatypes), response.final, 0, response.parameters), parts


def unpack_response(
    head: Any, body: memoryview, resolve: Resolve, later: Optional[List[Any]] = None
) -> InferenceResponse:
    """The response a RESPONSE message carries; its arrays view the message body or shared memory.

    `later`: its long object outputs are not rebuilt now: their items are appended there, and their arrays are
    UNREBUILT until `put_back_long` puts back what `rebuild_long` made of them.
    """
    _, _, outputs, datatypes, final, _, parameters = head
    return InferenceResponse(
        [
            OutputTensor(item[0], datatype, _array(item, body, resolve, later))
            for item, datatype in zip(outputs, datatypes)
        ],
        final,
        parameters,
    )


# The array of a long object output not rebuilt yet (`unpack_response`'s `later`).
UNREBUILT = np.empty(0, dtype=object)


def put_back_long(response: InferenceResponse, arrays: Dict[str, np.ndarray]) -> None:
    """Put a response's long object outputs, rebuilt (`rebuild_long`), in the places `unpack_response` left."""
    for output in response.outputs:
        if output.array is UNREBUILT:
            output.array = arrays[output.name]


def failed(key: int, error: InferenceError, answered: bool) -> Tuple[Any, ...]:
    """A FAILED message: the request ended with `error`, as its answer or refused at its submission."""
    return (FAILED, key, error.status.name, error.message, error.reason.name, error.of_request, answered)


def error_of(head: Any) -> InferenceError:
    """The error a FAILED message carries."""
    _, _, status, message, reason, of_request, answered = head
    error = InferenceError(Status[status], message, FailureReason[reason])
    error.of_request = of_request
    error.in_response = answered
    return error


def shared_places(items: Sequence[Any]) -> List[Tuple[int, int, int]]:
    """(where, offset, nbytes) of each packed item that stays in shared memory."""
    return [
        (item[5], item[3], item[4]) for item in items if item[1] is not None and item[5] != BODY and item[5] != PIECES
    ]


def _pack_arrays(
    arrays: Any, parts: List[Buffer], copy: bool, place: Place, pickled: Optional[Pickled] = None
) -> Tuple[Tuple[Any, ...], bool, bool]:
    """Arrays as packed items over `parts`, whether any stays in shared memory, and whether any is PIECES.

    See the module docstring; `pickled`: long object arrays' pieces pickled ahead, by name.
    """
    packed: List[Tuple[Any, ...]] = []
    offset = 0
    shared = long = False
    for name, array in arrays:
        if type(array) is not np.ndarray or array.dtype.hasobject:
            pieces = None
            if is_long(array):
                pieces = pickled.get(name) if pickled else None
                if pieces is None:
                    if pickled is PICKLE_FIRST:
                        raise LongInputs(name)
                    pieces = pickled_or_none(array, plain=True)
            if pieces is None:
                packed.append((name, None, plain_objects(array)))
                continue
            sizes = tuple(len(piece) for piece in pieces)
            parts.extend(pieces)
            packed.append((name, _OBJECT_CODE, array.shape, offset, sizes, PIECES))
            offset += sum(sizes)
            long = True
            continue
        nbytes = array.nbytes
        if nbytes >= SHARED_BYTES:
            found = place(array)
            if found is not None:
                packed.append((name, dtype_code(array.dtype), array.shape, found[1], nbytes, found[0]))
                shared = True
                continue
        if copy:
            parts.append(array.tobytes())
        else:
            contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
            parts.append(contiguous.reshape(-1).view(np.uint8).data)
        packed.append((name, dtype_code(array.dtype), array.shape, offset, nbytes, BODY))
        offset += nbytes
    return tuple(packed), shared, long


def plain_objects(array: Any) -> Any:
    """An object array whose elements the other process unpickles importing nothing (raw_tensors.plain_elements).

    A frontend imports none of the model's modules: an element of a class of one ended its channel, unreadable.
    An element whose str raises stays, for the outbox to fail its response alone (Outbox.post's `unsent`).
    """
    if type(array) is not np.ndarray:
        return array
    try:
        return plain_elements(array)
    except Exception:  # noqa: BLE001 - an element's str raised: see above
        return array


def long_outputs(response: InferenceResponse) -> bool:
    """Whether a response has a long object output (long_outputs.is_long), which crosses in pickled pieces."""
    for output in response.outputs:
        array = output.array
        if is_long(array):
            return True
    return False


# A message's long object arrays pickled ahead (`pickle_ahead`, `pickle_inputs_ahead`): their pieces, by name.
Pickled = Dict[str, List[bytes]]
# `pack_request`'s `pickled` for a sender that pickles long inputs off its loop first: it raises LongInputs at one.
PICKLE_FIRST: Pickled = {}


class LongInputs(Exception):
    """A request to pack with PICKLE_FIRST has a long object input: pickle them first (`pickle_inputs_ahead`).

    Found where packing meets one, so that a request without any pays no check of its own.
    """


def pickle_ahead(response: InferenceResponse) -> Pickled:
    """Pickle a response's long object outputs now (a thread, off the loop), for `pack_response` to take."""
    return _pickled_long((output.name, output.array) for output in response.outputs)


def pickle_inputs_ahead(request: InferenceRequest) -> Pickled:
    """Pickle a request's long object inputs now (a thread, off the loop), for `pack_request` to take."""
    return _pickled_long(request.inputs.items())


def _pickled_long(arrays: Iterable[Tuple[str, Any]]) -> Pickled:
    """The pieces of the long object arrays among `arrays` whose elements pickle, by name."""
    pickled: Pickled = {}
    for name, array in arrays:
        if is_long(array):
            pieces = pickled_or_none(array, plain=True)
            if pieces is not None:
                pickled[name] = pieces
    return pickled


def long_items(items: Sequence[Any]) -> List[Any]:
    """The packed items of long object arrays (in PIECES) among a message's."""
    return [item for item in items if item[1] is not None and item[5] == PIECES]


def rebuild_long(items: Sequence[Any], body: memoryview) -> Dict[str, np.ndarray]:
    """The long object arrays of `long_items`, by name: a piece at a time (the GIL is free between the pieces)."""
    return {item[0]: _rebuilt(item, body, None) for item in items}


def _rebuilt(item: Sequence[Any], body: memoryview, long_arrays: Optional[Dict[str, np.ndarray]]) -> np.ndarray:
    """A long object array: rebuilt already (in `long_arrays`), or now."""
    if long_arrays is not None:
        found = long_arrays.get(item[0])
        if found is not None:
            return found
    _, _, shape, offset, sizes, _ = item
    if offset < 0 or offset + sum(sizes) > body.nbytes:
        raise ValueError(f"an object array's pieces past the message's body ({body.nbytes} bytes)")
    return rebuilt(tuple(shape), body, offset, sizes)


def _array(item: Sequence[Any], body: memoryview, resolve: Resolve, later: Optional[List[Any]] = None) -> Any:
    """One packed array: a view of the message body or of shared memory, or the object array itself.

    A long object array is rebuilt now, or with `later` appended there (UNREBUILT).
    """
    if item[1] is None:
        return item[2]
    _, code, shape, offset, nbytes, where = item
    dtype = dtype_of(code)
    if where != BODY:
        if where != PIECES:
            return resolve(where, offset, nbytes, dtype, shape)
        if later is not None:
            later.append(item)
            return UNREBUILT
        return _rebuilt(item, body, None)
    return np.ndarray(shape, dtype, body, offset)  # numpy checks the bounds
