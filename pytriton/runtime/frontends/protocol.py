"""What a frontend process and the hub (the process that holds the models) say to each other.

Every message is a tuple whose first item is a tag. Requests, responses and their ends are posted to an
outbox (ipc/outbox.py) and travel in batches; calls (`CALL`/`REPLY`) carry everything else: forwarded API
requests, the state the hub mirrors into its frontends, and the lifecycle.

Frontend to hub:
    (INFER, key, model, version, request id, inputs, parameters, requested outputs, batch size, priority,
     timeout us, arrival ns, streaming)
    (CANCEL, key): the client left, or cancelled
Hub to frontend:
    (RESPONSE, key, outputs, datatypes, final), (FAILED, key, status, message, reason, of request), (END, key)
    (CONNECTION, "http" or "grpc"), alone, with the descriptor of a connection the hub accepted
Either way: calls (ipc/calls.py).

Tensors of fixed-size dtypes travel as raw bytes in the message body, their place given as (offset, nbytes);
object (BYTES) arrays travel in the head, pickled with it.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from pytriton.core.errors import FailureReason, InferenceError, Status
from pytriton.core.request import InferenceRequest, InferenceResponse, OutputTensor
from pytriton.ipc.tensors import Buffer, dtype_code, dtype_of

INFER, CANCEL, RESPONSE, FAILED, END, CONNECTION = 1, 2, 5, 6, 7, 8


def pack_request(
    key: int, model: str, version: str, request: InferenceRequest, streaming: bool
) -> Tuple[Any, List[Buffer]]:
    """An INFER message and its body: the inputs' bytes as views (the request lives until its answer)."""
    parts: List[Buffer] = []
    inputs = _pack_arrays(request.inputs.items(), parts, copy=False)
    head = (
        INFER,
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
    )
    return head, parts


def unpack_request(head: Any, body: memoryview) -> InferenceRequest:
    """The request an INFER message carries; its arrays view the message body."""
    _, _, _, _, request_id, inputs, parameters, requested, batch_size, priority, timeout_us, arrival_ns, _ = head
    arrays = {item[0]: _array(item, body) for item in inputs}
    return InferenceRequest(
        request_id=request_id,
        inputs=arrays,
        parameters=parameters,
        requested_outputs=requested,
        batch_size=batch_size,
        priority=priority,
        timeout_us=timeout_us,
        arrival_ns=arrival_ns,
    )


def pack_response(key: int, response: InferenceResponse) -> Tuple[Any, List[Buffer]]:
    """A RESPONSE message and its body: the outputs' bytes copied now (a callable may write its arrays again)."""
    parts: List[Buffer] = []
    outputs = _pack_arrays([(output.name, output.array) for output in response.outputs], parts, copy=True)
    datatypes = tuple(output.datatype for output in response.outputs)
    return (RESPONSE, key, outputs, datatypes, response.final), parts


def unpack_response(head: Any, body: memoryview) -> InferenceResponse:
    """The response a RESPONSE message carries; its arrays view the message body."""
    _, _, outputs, datatypes, final = head
    return InferenceResponse(
        [OutputTensor(item[0], datatype, _array(item, body)) for item, datatype in zip(outputs, datatypes)], final
    )


def failed(key: int, error: InferenceError) -> Tuple[Any, ...]:
    """A FAILED message: the request ended with `error`."""
    return (FAILED, key, error.status.name, error.message, error.reason.name, error.of_request)


def error_of(head: Any) -> InferenceError:
    """The error a FAILED message carries."""
    _, _, status, message, reason, of_request = head
    error = InferenceError(Status[status], message, FailureReason[reason])
    error.of_request = of_request
    return error


def _pack_arrays(arrays: Any, parts: List[Buffer], copy: bool) -> Tuple[Any, ...]:
    """Arrays as (name, dtype, shape, offset, nbytes) over `parts`, or (name, None, array) for object arrays."""
    packed: List[Tuple[Any, ...]] = []
    offset = 0
    for name, array in arrays:
        if type(array) is not np.ndarray or array.dtype.hasobject:
            packed.append((name, None, array))
            continue
        nbytes = array.nbytes
        if copy:
            parts.append(array.tobytes())
        else:
            contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
            parts.append(contiguous.reshape(-1).view(np.uint8).data)
        packed.append((name, dtype_code(array.dtype), array.shape, offset, nbytes))
        offset += nbytes
    return tuple(packed)


def _array(item: Sequence[Any], body: memoryview) -> Any:
    """One packed array: a view of the message body, or the object array itself."""
    if item[1] is None:
        return item[2]
    _, code, shape, offset, nbytes = item
    dtype = dtype_of(code)
    return np.frombuffer(body, dtype, nbytes // dtype.itemsize if dtype.itemsize else 0, offset).reshape(shape)
