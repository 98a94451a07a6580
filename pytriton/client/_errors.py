"""Translation of tritonclient, gRPC and network errors into pytriton client errors."""

from __future__ import annotations

import asyncio
import http.client
import socket
from typing import Tuple, Type

import grpc
from tritonclient.utils import InferenceServerException

from pytriton.client.exceptions import (
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelUnavailableError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
)

# What an inference call may raise that `client_error` translates (aiohttp errors are added by the asyncio client).
TRANSLATED_ERRORS: Tuple[Type[BaseException], ...] = (
    InferenceServerException,
    grpc.RpcError,
    OSError,
    # tritonclient.http's geventhttpclient raises its HTTPConnectionClosed / HTTPParseError (no OSErrors) for a
    # connection the server closes mid-call, or answers with no HTTP: failed connections, as OSErrors are
    http.client.HTTPException,
    asyncio.TimeoutError,
)

_QUEUE_FULL_MESSAGE = "maximum queue size"


class ServerQueueFullError(PyTritonClientQueueFullError, PyTritonClientInferenceServerError):
    """The server refused a request because the model's queue is full (QueuePolicy.max_queue_size).

    A PyTritonClientInferenceServerError in 0.7's words, as 0.7 raises it for every error the server answers (so
    its users' `except PyTritonClientInferenceServerError` catches it), and a PyTritonClientQueueFullError too.
    """


def client_error(error: BaseException, timeout_s: float) -> PyTritonClientError:
    """The pytriton client error for an error raised while running an inference request."""
    if isinstance(error, PyTritonClientError):
        return error
    if isinstance(error, (socket.timeout, asyncio.TimeoutError, TimeoutError)):
        # tritonclient.http's socket timeout says "timed out": 0.7 appends it after the timeout, with no full stop
        said = f" Message: {error}" if str(error) else ""
        return PyTritonClientTimeoutError(f"Timeout occurred during inference request. Timeout: {timeout_s} s{said}")
    if isinstance(error, InferenceServerException):
        status, message = str(error.status() or ""), str(error.message() or "")
    elif isinstance(error, grpc.RpcError):
        status, message = str(getattr(error, "code", lambda: "")()), str(getattr(error, "details", lambda: "")())
    else:  # a connection that could not be made or broke, as NVIDIA's client reports it (no full stop after "s")
        return PyTritonClientTimeoutError(
            f"Timeout occurred during inference request. Timeout: {timeout_s} s Message: {error}"
        )
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return PyTritonClientTimeoutError(
            f"Timeout occurred during inference request. Timeout: {timeout_s} s. Message: {message}"
        )
    if _QUEUE_FULL_MESSAGE in message.lower():
        return ServerQueueFullError(f"Error occurred during inference request. Message: {message}")
    return PyTritonClientInferenceServerError(f"Error occurred during inference request. Message: {message}")


def asyncio_client_error(error: BaseException, model_name: str, timeout_s: float, grpc: bool) -> PyTritonClientError:
    """The error AsyncioModelClient raises for an error of an inference request, in 0.7's words for it.

    0.7's AsyncioModelClient words a timeout and the server's errors differently from its ModelClient:
    "Timeout exceeded while running inference for <model>", and "Error occurred on Triton Inference Server
    side:", a new line, a space and the message (a timeout when it says "Deadline Exceeded"). Others read as
    ModelClient's. Over gRPC its timeout is the call's deadline, so it reads as the server's "Deadline Exceeded".
    """
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        if grpc:
            return PyTritonClientTimeoutError("Error occurred on Triton Inference Server side:\n Deadline Exceeded")
        return PyTritonClientTimeoutError(f"Timeout exceeded while running inference for {model_name}")
    if isinstance(error, InferenceServerException):
        message = str(error.message() or "")
        worded = f"Error occurred on Triton Inference Server side:\n {message}"
        if _QUEUE_FULL_MESSAGE in message.lower():
            return ServerQueueFullError(worded)
        if "DEADLINE_EXCEEDED" in str(error.status() or "") or "Deadline Exceeded" in message:
            return PyTritonClientTimeoutError(worded)
        return PyTritonClientInferenceServerError(worded)
    return client_error(error, timeout_s)


def unavailable_error(error: BaseException, model_name: str, timeout_s: float) -> PyTritonClientError:
    """The error for a failed config read: a timeout stays a timeout, anything else means the model is unavailable."""
    translated = client_error(error, timeout_s)
    if isinstance(translated, PyTritonClientTimeoutError):
        return translated
    return PyTritonClientModelUnavailableError(f"Could not obtain the config of model {model_name}: {error}")
