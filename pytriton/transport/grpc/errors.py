"""Engine errors to gRPC status codes, mapped once for every RPC."""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, Tuple, TypeVar

import grpc

from pytriton.core.errors import InferenceError

LOGGER = logging.getLogger(__name__)

S = TypeVar("S")
Handler = Callable[[S, Any, Any], Awaitable[Any]]


def status_of(error: Exception) -> Tuple[grpc.StatusCode, str]:
    """The status code and message a failed RPC answers with."""
    if isinstance(error, InferenceError):
        return grpc.StatusCode[error.status.grpc_code_name], error.message
    LOGGER.error("unexpected error serving a gRPC request: %r", error, exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal server error: {error}"


def unary(method: Handler[S]) -> Handler[S]:
    """Decorate a unary RPC method: an exception (or a request that failed to parse) becomes the RPC's status."""

    @functools.wraps(method)
    async def wrapper(self: S, request: Any, context: Any) -> Any:
        try:
            if isinstance(request, InferenceError):  # the deserializer could not parse the message
                raise request
            return await method(self, request, context)
        except Exception as error:  # noqa: BLE001 - every failure must reach the client as a status
            code, message = status_of(error)
        await context.abort(code, message)

    return wrapper
