"""gRPC's standard health service, `grpc.health.v1.Health/Check`, as tritonserver 2.51 answers it.

Kubernetes' `grpc` probes, grpc_health_probe and load balancers ask it. tritonserver 2.51 (asked through
nvidia-pytriton 0.7) answered SERVING (`08 01`) for every service name, the empty one, Triton's and unknown ones
alike, and UNIMPLEMENTED for `Watch`; it answers NOT_SERVING while the server is not ready, and restricts `Check`
with the health category. The messages are written out as bytes here (health.proto: HealthCheckRequest's
`service` is field 1, HealthCheckResponse's `status` is field 1, SERVING = 1, NOT_SERVING = 2), sent by grpcio.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np
import pytest

from pytriton.model_config import Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, running_triton

CHECK = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"
NOT_SERVING = b"\x08\x02"


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"]} for request in requests]


def _bind(triton: Triton) -> None:
    spec = [Tensor(name="IN", dtype=np.float32, shape=(-1,))]
    triton.bind("identity", _identity, inputs=spec, outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))])


def health_request(service: str = "") -> bytes:
    """A HealthCheckRequest naming `service` (none: the server as a whole)."""
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def check(
    url: str, request: bytes = b"", metadata: Optional[Sequence[Tuple[str, str]]] = None, method: str = CHECK
) -> bytes:
    """Call `Check` (or another unary method) with raw request bytes; its raw response bytes."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
        response: bytes = call(request, timeout=10, metadata=metadata)
        return response


@pytest.fixture(scope="module")
def served() -> Any:
    with running_triton(_bind, allow_metrics=False) as triton:
        yield triton


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "identity", "no.such.Service"])
def test_check_answers_serving_for_any_service_name_as_triton_does(served, service):
    assert check(grpc_url(served), health_request(service)) == SERVING


def test_watch_is_unimplemented_as_in_triton(served):
    with grpc.insecure_channel(grpc_url(served)) as channel:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch", request_serializer=bytes, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as raised:
            next(iter(watch(b"", timeout=10)))
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_an_unparsable_check_request_is_an_invalid_argument(served):
    with pytest.raises(grpc.RpcError) as raised:
        check(grpc_url(served), b"\x0a\x05ab")  # a string field that says 5 bytes and holds 2
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert check(grpc_url(served)) == SERVING


def test_check_is_restricted_with_the_health_category(start_triton):
    triton = start_triton(_bind, grpc_restricted_protocol="health:health-key=secret", allow_metrics=False)
    with pytest.raises(grpc.RpcError) as raised:
        check(grpc_url(triton))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert raised.value.details() == "This protocol is restricted, expecting header 'triton-grpc-protocol-health-key'"
    assert check(grpc_url(triton), metadata=[("triton-grpc-protocol-health-key", "secret")]) == SERVING


def test_check_through_frontend_processes_is_answered_and_restricted_as_by_one_process():
    with running_triton(
        _bind, frontends=3, allow_metrics=False, grpc_restricted_protocol="health:health-key=secret"
    ) as triton:
        for _ in range(4):  # each on a connection of its own, which either frontend may take
            with pytest.raises(grpc.RpcError) as raised:
                check(grpc_url(triton))
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert check(grpc_url(triton), metadata=[("triton-grpc-protocol-health-key", "secret")]) == SERVING
