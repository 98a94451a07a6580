"""The RPC table: inference.GRPCInferenceService's, read from the stubs' service descriptor, and `Check`.

`Check` is gRPC's health service's (protocol/grpc_health.py), which Triton serves beside its own.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, Dict, List, NamedTuple, Optional, Tuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError, Status
from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.options.access import AccessRules
from pytriton.protocol import grpc_health
from pytriton.transport.grpc.messages import UNPARSED
from pytriton.transport.grpc.wire import infer_response_parts, message_parts, parse_infer_request, stream_response_parts

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


class Rpc(NamedTuple):
    """One RPC the server answers: its method descriptor and message classes; the servicer method of its name."""

    method: Any  # google.protobuf.descriptor.MethodDescriptor
    request_type: Any
    response_type: Any

    @property
    def path(self) -> bytes:
        """Its HTTP/2 path, /{service}/{method}."""
        return f"/{self.method.containing_service.full_name}/{self.method.name}".encode()


# Every RPC served: Triton's own, then the health service's `Check` (servicer method names are unique across both).
RPCS: Tuple[Rpc, ...] = (
    *(
        Rpc(method, getattr(service_pb2, method.input_type.name), getattr(service_pb2, method.output_type.name))
        for method in SERVICE.methods
    ),
    Rpc(grpc_health.SERVICE.methods_by_name["Check"], grpc_health.HealthCheckRequest, grpc_health.HealthCheckResponse),
)

Parts = Tuple[List[Buffer], int]
Behaviour = Callable[[Any, Any], Awaitable[Any]]

# (request parser, response serializer) where the generated ones would copy tensors into protobuf.
_ZERO_COPY: Dict[str, Tuple[Callable[[Buffer], Any], Callable[[Any], Parts]]] = {
    "ModelInfer": (parse_infer_request, infer_response_parts),
    "ModelStreamInfer": (parse_infer_request, stream_response_parts),
}


class Method:
    """One RPC: how its messages are read and written, and the servicer behaviour that answers it."""

    __slots__ = ("behaviour", "deserialize", "name", "serialize", "streaming")

    def __init__(
        self,
        name: str,
        streaming: bool,
        deserialize: Callable[[Buffer], Any],
        serialize: Callable[[Any], Parts],
        behaviour: Behaviour,
    ) -> None:
        """An RPC named `name`; a streaming one takes an iterator of requests and writes its responses."""
        self.name = name
        self.streaming = streaming
        self.deserialize = deserialize
        self.serialize = serialize
        self.behaviour = behaviour


class CallLimit:
    """The RPCs in progress on one server, against the most it takes at once (grpc_max_concurrent_rpcs)."""

    def __init__(self, maximum: int) -> None:
        """No call in progress; at most `maximum` at once."""
        self.maximum = maximum
        self.active = 0


def method_table(
    servicer: Any, access: Optional[AccessRules] = None, limit: Optional[CallLimit] = None
) -> Dict[bytes, Method]:
    """Every RPC of the service by its HTTP/2 path, calling the servicer method of the same name.

    Methods whose category `access` restricts first check the call's metadata (grpc_restricted_protocol);
    with a `limit`, a call beyond it is refused with RESOURCE_EXHAUSTED before anything else.
    """
    table: Dict[bytes, Method] = {}
    for rpc in RPCS:
        method = rpc.method
        if method.client_streaming != method.server_streaming:
            raise TypeError(f"{rpc.path.decode()}: half-streaming RPCs are not served")
        deserialize, serialize = _ZERO_COPY.get(method.name, (rpc.request_type.FromString, message_parts))
        behaviour = getattr(servicer, method.name)
        if access is not None and access.restricts_grpc(method.name):
            behaviour = _guarded(behaviour, method.name, access)
        if limit is not None:
            behaviour = _limited(behaviour, limit)
        health = method.containing_service is grpc_health.SERVICE
        parse = _tolerant(deserialize, _health_refusal if health else _triton_refusal)
        table[rpc.path] = Method(method.name, method.client_streaming, parse, serialize, behaviour)
    return table


def _triton_refusal(error: DecodeError) -> InferenceError:
    """What Triton's own service answers a message protobuf cannot parse: INTERNAL "Unable to parse request".

    That is its gRPC library's answer (for a message of no field, or of bytes that are not UTF-8 in a string); a
    stream goes on here, where tritonserver's ends without a word.
    """
    return InferenceError(Status.INTERNAL, UNPARSED)


def _health_refusal(error: DecodeError) -> InferenceError:
    """grpc++'s health service parses its request itself: INVALID_ARGUMENT."""
    return InferenceError.invalid(f"failed to parse the request message: {error}")


def _tolerant(
    deserialize: Callable[[Buffer], Any], refusal: Callable[[DecodeError], InferenceError]
) -> Callable[[Buffer], Any]:
    """A request parser that hands a message protobuf cannot parse to the method as `refusal`'s error."""

    @functools.wraps(deserialize)
    def parse(data: Buffer) -> Any:
        try:
            return deserialize(data)
        except DecodeError as error:
            return refusal(error)

    return parse


def _guarded(behaviour: Behaviour, name: str, access: AccessRules) -> Behaviour:
    """Answer UNAVAILABLE, as Triton does, unless the call carries the restricted category's metadata.

    A message that could not be parsed (`_tolerant`'s error) is refused for that first: grpc parses it
    before Triton's handler checks the metadata.
    """

    async def guarded(request: Any, context: Any) -> Any:
        denial = access.grpc_denial(name, context.invocation_metadata() or ())
        if denial is not None and not isinstance(request, InferenceError):
            await context.abort(grpc.StatusCode.UNAVAILABLE, denial)
        return await behaviour(request, context)

    return guarded


def _limited(behaviour: Behaviour, limit: CallLimit) -> Behaviour:
    """Answer RESOURCE_EXHAUSTED, as grpc does, while `limit.maximum` calls are in progress."""

    async def limited(request: Any, context: Any) -> Any:
        if limit.active >= limit.maximum:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        limit.active += 1
        try:
            return await behaviour(request, context)
        finally:
            limit.active -= 1

    return limited
