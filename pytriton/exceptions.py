"""PyTriton exceptions, the same hierarchy as NVIDIA's PyTriton."""

from __future__ import annotations


class PyTritonError(Exception):
    """Generic PyTriton exception."""

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


class PyTritonValidationError(PyTritonError):
    """PyTriton configuration validation exception."""


class PyTritonInvalidOperationError(PyTritonError):
    """PyTriton invalid operation exception."""


class PyTritonBadParameterError(PyTritonError):
    """PyTriton invalid parameter exception."""


class PyTritonModelConfigError(PyTritonError):
    """PyTriton invalid model config exception."""


class PyTritonUnrecoverableError(PyTritonError):
    """Unrecoverable error occurred in inference callable, thus no further inferences possible."""


class PyTritonRuntimeError(PyTritonError):
    """Raised when an error is detected that doesn't fall in any of the other categories."""
