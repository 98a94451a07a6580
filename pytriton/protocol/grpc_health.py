"""gRPC's standard health service (`grpc.health.v1.Health`), whose `Check` Triton answers beside its own RPCs.

Kubernetes' `grpc` probes, grpc_health_probe, Envoy and cloud load balancers ask it. Triton answers `Check` with
SERVING while the server is ready and NOT_SERVING otherwise, whatever service the request names, and has no
`Watch` (UNIMPLEMENTED). Its two messages are built here in a descriptor pool of their own: no generated module
ships with grpcio or tritonclient, and a private pool cannot clash with grpcio-health-checking's in the default one.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "grpc.health.v1"
SERVICE_NAME = f"{PACKAGE}.Health"

# HealthCheckResponse.ServingStatus
SERVING = 1
NOT_SERVING = 2


def _file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/health/v1/health.proto, its `Check` only."""
    proto = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto", package=PACKAGE, syntax="proto3")
    field = descriptor_pb2.FieldDescriptorProto
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=field.TYPE_ENUM,
        type_name=f".{PACKAGE}.HealthCheckResponse.ServingStatus",
        label=field.LABEL_OPTIONAL,
    )
    service = proto.service.add(name="Health")
    service.method.add(
        name="Check", input_type=f".{PACKAGE}.HealthCheckRequest", output_type=f".{PACKAGE}.HealthCheckResponse"
    )
    return proto


_POOL = descriptor_pool.DescriptorPool()
DESCRIPTOR = _POOL.Add(_file())
SERVICE = _POOL.FindServiceByName(SERVICE_NAME)
HealthCheckRequest: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.HealthCheckRequest"))
HealthCheckResponse: Any = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName(f"{PACKAGE}.HealthCheckResponse")
)


def check_response(ready: bool) -> Any:
    """`Check`'s answer for a server that is, or is not, ready."""
    return HealthCheckResponse(status=SERVING if ready else NOT_SERVING)
