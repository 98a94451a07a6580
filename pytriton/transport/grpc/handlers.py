"""The RPC table of inference.GRPCInferenceService, read from the stubs' service descriptor."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError
from pytriton.transport.access import AccessRules
from pytriton.transport.grpc.wire import parse_infer_request, serialize_infer_response, serialize_stream_response

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]

# (request deserializer, response serializer) where the generated ones would copy tensors into protobuf.
_ZERO_COPY: Dict[str, Tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = {
    "ModelInfer": (parse_infer_request, serialize_infer_response),
    "ModelStreamInfer": (parse_infer_request, serialize_stream_response),
}


class CallLimit:
    """The RPCs in progress on one server, against the most it takes at once (grpc_max_concurrent_rpcs).

    Counted here rather than by grpc.aio's maximum_concurrent_rpcs: in older grpcio every refused call
    lowers that count, so after a refusal it admits calls over the limit (grpc/grpc#41531; seen with
    grpcio 1.67, the newest tritonclient allows on Python 3.9).
    """

    def __init__(self, maximum: int) -> None:
        """No call in progress; at most `maximum` at once."""
        self.maximum = maximum
        self.active = 0


def method_handlers(
    servicer: Any, access: Optional[AccessRules] = None, limit: Optional[CallLimit] = None
) -> Dict[str, Any]:
    """A grpc method handler for every RPC of the service, calling the servicer method of the same name.

    Methods whose category `access` restricts first check the call's metadata (grpc_restricted_protocol);
    with a `limit`, a call beyond it is refused with RESOURCE_EXHAUSTED before anything else.
    """
    handlers: Dict[str, Any] = {}
    for method in SERVICE.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        response_type = getattr(service_pb2, method.output_type.name)
        deserialize, serialize = _ZERO_COPY.get(method.name, (request_type.FromString, response_type.SerializeToString))
        deserialize = _tolerant(deserialize)
        behaviour = getattr(servicer, method.name)
        if access is not None and access.restricts_grpc(method.name):
            behaviour = _guarded(behaviour, method.name, access)
        if limit is not None:
            behaviour = _limited(behaviour, limit)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif not (method.client_streaming or method.server_streaming):
            make = grpc.unary_unary_rpc_method_handler
        else:
            raise TypeError(f"{SERVICE.full_name}/{method.name}: half-streaming RPCs are not served")
        handlers[method.name] = make(behaviour, request_deserializer=deserialize, response_serializer=serialize)
    return handlers


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A request deserializer that hands a message protobuf cannot parse to the method as an INVALID_ARGUMENT."""

    @functools.wraps(deserialize)
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as error:
            return InferenceError.invalid(f"failed to parse the request message: {error}")

    return parse


def _guarded(behaviour: Callable[[Any, Any], Any], name: str, access: AccessRules) -> Callable[[Any, Any], Any]:
    """Answer UNAVAILABLE, as Triton does, unless the call carries the restricted category's metadata."""

    async def guarded(request: Any, context: Any) -> Any:
        denial = access.grpc_denial(name, context.invocation_metadata() or ())
        if denial is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, denial)
        return await behaviour(request, context)

    return guarded


def _limited(behaviour: Callable[[Any, Any], Any], limit: CallLimit) -> Callable[[Any, Any], Any]:
    """Answer RESOURCE_EXHAUSTED, as grpc.aio does, while `limit.maximum` calls are in progress."""

    async def limited(request: Any, context: Any) -> Any:
        if limit.active >= limit.maximum:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        limit.active += 1
        try:
            return await behaviour(request, context)
        finally:
            limit.active -= 1

    return limited


def add_service(
    servicer: Any, server: Any, access: Optional[AccessRules] = None, limit: Optional[CallLimit] = None
) -> None:
    """Register the service on a grpc.aio server; `access` restricts API categories to callers with a header.

    `limit` caps the calls in progress at once (all run on the server's loop, so a plain count is safe).
    """
    handlers = method_handlers(servicer, access, limit)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    register = getattr(server, "add_registered_method_handlers", None)  # grpcio >= 1.63: faster dispatch
    if register is not None:
        register(SERVICE.full_name, handlers)
