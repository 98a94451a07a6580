"""The RPC table of inference.GRPCInferenceService, read from the stubs' service descriptor."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import grpc
from tritonclient.grpc import service_pb2

from pytriton.transport.grpc.wire import parse_infer_request, serialize_infer_response, serialize_stream_response

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]

# (request deserializer, response serializer) where the generated ones would copy tensors into protobuf.
_ZERO_COPY: Dict[str, Tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = {
    "ModelInfer": (parse_infer_request, serialize_infer_response),
    "ModelStreamInfer": (parse_infer_request, serialize_stream_response),
}


def method_handlers(servicer: Any) -> Dict[str, Any]:
    """A grpc method handler for every RPC of the service, calling the servicer method of the same name."""
    handlers: Dict[str, Any] = {}
    for method in SERVICE.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        response_type = getattr(service_pb2, method.output_type.name)
        deserialize, serialize = _ZERO_COPY.get(method.name, (request_type.FromString, response_type.SerializeToString))
        behaviour = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif not (method.client_streaming or method.server_streaming):
            make = grpc.unary_unary_rpc_method_handler
        else:
            raise TypeError(f"{SERVICE.full_name}/{method.name}: half-streaming RPCs are not served")
        handlers[method.name] = make(behaviour, request_deserializer=deserialize, response_serializer=serialize)
    return handlers


def add_service(servicer: Any, server: Any) -> None:
    """Register the service on a grpc.aio server."""
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    register = getattr(server, "add_registered_method_handlers", None)  # grpcio >= 1.63: faster dispatch
    if register is not None:
        register(SERVICE.full_name, handlers)
