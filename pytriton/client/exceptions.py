"""Exceptions raised by the pytriton clients, the same hierarchy as NVIDIA's PyTriton."""

from __future__ import annotations


class PyTritonClientError(Exception):
    """Generic pytriton client exception."""

    def __init__(self, message: str) -> None:
        """Initialize the exception with a message."""
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        """Return the message."""
        return self._message

    @property
    def message(self) -> str:
        """The exception message."""
        return self._message


class PyTritonClientValueError(PyTritonClientError):
    """Incorrect values were given to the client API."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server url is invalid."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """A timeout occurred while communicating with the server."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The model with the given name and version is unavailable on the server."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was used after it was closed."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """A batch was sent to a model that does not support batching."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The inference callable or the server failed to handle a request."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """A request was refused because a queue was full."""
