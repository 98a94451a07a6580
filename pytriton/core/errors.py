"""Errors of the request path, each with the status every transport maps it to."""

from __future__ import annotations

import asyncio
import enum


class Status(enum.Enum):
    """Error class of a failed request; each transport maps it once."""

    INVALID_ARGUMENT = (400, "INVALID_ARGUMENT")
    NOT_FOUND = (404, "NOT_FOUND")
    ALREADY_EXISTS = (400, "ALREADY_EXISTS")  # Triton answers HTTP 400 (measured with nvidia-pytriton 0.7)
    UNAVAILABLE = (503, "UNAVAILABLE")
    UNIMPLEMENTED = (501, "UNIMPLEMENTED")
    INTERNAL = (500, "INTERNAL")
    CANCELLED = (400, "CANCELLED")  # Triton's HTTP server answers TRITONSERVER_ERROR_CANCELLED with 400

    @property
    def http_status(self) -> int:
        """The HTTP status code."""
        return self.value[0]

    @property
    def grpc_code_name(self) -> str:
        """The name of the grpc.StatusCode member."""
        return self.value[1]


class FailureReason(enum.Enum):
    """Why a request failed, as Triton's nv_inference_request_failure reason label."""

    REJECTED = "REJECTED"
    CANCELED = "CANCELED"
    BACKEND = "BACKEND"
    OTHER = "OTHER"


class BatchNotRun(RuntimeError):
    """An instance could not take a batch, so its callable never ran with it: the batch fails alone.

    Logged as the server's fault, not as something the callable raised.
    """


class OutputsNotTaken(RuntimeError):
    """The server could not take the outputs an instance's callable returned (it ran): the batch fails alone.

    Logged as the server's fault, not as something the callable raised (its memory limit, say).
    """


class InferenceError(Exception):
    """A request failed; carries the status and Triton's message."""

    def __init__(self, status: Status, message: str, reason: FailureReason = FailureReason.OTHER) -> None:
        r"""Create an error with a status, a message and a failure reason.

        A message that is no UTF-8 (lone surrogates: a callable's `ValueError("\udcff")`, a file name decoded
        with `surrogateescape`) keeps them as `\udcff` escapes: both transports must encode it, and neither
        could (HTTP answered "str is not valid UTF-8" and gRPC never answered).
        """
        message = utf8_safe(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.of_request = False  # Triton's core names the request in this message (`for_request`)
        # It came as the request's answer (the model ran, or its queue gave up on it), not from its submission:
        # tritonserver's HTTP server then answers it without a content type (text/plain).
        self.in_response = False

    @classmethod
    def invalid(cls, message: str) -> InferenceError:
        """A client error (400 / INVALID_ARGUMENT)."""
        return cls(Status.INVALID_ARGUMENT, message)

    @classmethod
    def invalid_input(cls, message: str) -> InferenceError:
        """A request's inputs do not fit the model (400 / INVALID_ARGUMENT), as Triton's core checks them.

        The codec that knows the request's id prefixes the message as Triton does (`for_request`).
        """
        error = cls(Status.INVALID_ARGUMENT, message)
        error.of_request = True
        return error

    def for_request(self, request_id: str) -> InferenceError:
        """This error, its message prefixed with the request's id as Triton's core writes it."""
        return InferenceError(self.status, f"[request id: {request_id or '<id_unknown>'}] {self.message}", self.reason)

    @classmethod
    def not_found(cls, message: str) -> InferenceError:
        """An unknown model or version (404 / NOT_FOUND)."""
        return cls(Status.NOT_FOUND, message)

    @classmethod
    def unavailable(cls, message: str) -> InferenceError:
        """Queue full, timeout or shutting down (503 / UNAVAILABLE)."""
        return cls(Status.UNAVAILABLE, message, FailureReason.REJECTED)

    @classmethod
    def unimplemented(cls, message: str) -> InferenceError:
        """An unsupported operation (501 / UNIMPLEMENTED)."""
        return cls(Status.UNIMPLEMENTED, message)

    @classmethod
    def cancelled(cls, message: str) -> InferenceError:
        """The client went away or cancelled the request."""
        return cls(Status.CANCELLED, message, FailureReason.CANCELED)

    @classmethod
    def internal(cls, message: str) -> InferenceError:
        """The model failed (500 / INTERNAL)."""
        return cls(Status.INTERNAL, message, FailureReason.BACKEND)


def utf8_safe(text: str) -> str:
    """`text`, its lone surrogates (which UTF-8 cannot encode) as backslash escapes."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def exception_text(error: BaseException) -> str:
    """`str(error)`, or Python's words when that raises (its traceback module writes the same)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - any __str__ may fail
        return "<exception str() failed>"


class CallableRaised(Exception):
    """One of `CONTROL_FLOW` that a callable raised, carried to the loop in its place (`error`).

    Each means something else on the way there: asyncio refuses to set StopIteration on a future (the request was
    never answered, and its instance never freed); GeneratorExit ends the coroutine or generator it is raised into
    instead of failing it (never answered either); CancelledError reads as the cancel of the task that awaits it
    (answered "the server stopped"); StopIteration and StopAsyncIteration raised on in an async generator are PEP
    479's RuntimeError. Raised by the callable, each is its fault, answered as any other.
    """

    def __init__(self, error: BaseException) -> None:
        """Carry `error`."""
        super().__init__(error)
        self.error = error


# What a callable may raise that must be carried (CallableRaised) rather than raised on to the loop.
CONTROL_FLOW = (StopIteration, StopAsyncIteration, GeneratorExit, asyncio.CancelledError)


def callable_error(error: BaseException) -> InferenceError:
    """What a request gets for what the callable raised: the type's name and message, as Triton's shows them.

    ("ValueError: ..."); an exception from another process arrives as a class of the same name. An exception
    whose `str()` raises is named with Python's words for it (`exception_text`), as nvidia-pytriton 0.7 names it.
    """
    if isinstance(error, CallableRaised):
        error = error.error
    message = exception_text(error)
    return InferenceError.internal(f"{type(error).__name__}: {message}" if message else type(error).__name__)


def json_type_error(words: str) -> InferenceError:
    """TritonJson's refusal of a JSON value of another type (`non-string as string`), in its words.

    Triton's HTTP frontend reads many bodies' fields with TritonJson (`AsString`, `AsUInt`, `AsBool`) and
    answers its errors as 500 / INTERNAL; here they are the client's mistake, 400 / INVALID_ARGUMENT, as the
    other JSON values of the wrong type (docs/migration.md lists where Triton blames the server).
    """
    return InferenceError.invalid(f"attempt to access JSON {words}")


def json_uint(value: object) -> int:
    """A JSON value read as TritonJson's `AsUInt` reads it: an integer (not a bool) from 0 to 2**64 - 1."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
        return value
    raise json_type_error("non-unsigned-integer as unsigned-integer")
