"""Warnings of the clients, at nvidia-pytriton 0.7's import path.

0.7 warns NotSupportedTimeoutWarning where tritonclient cannot apply a timeout (its gRPC clients' calls other
than infer). The clients here pass gRPC timeouts per call, so they do not warn; the classes are here so that
code filtering them (`warnings.filterwarnings("ignore", category=NotSupportedTimeoutWarning)`) runs unchanged.
"""


class PyTritonWarning(UserWarning):
    """Base class of PyTriton's warnings."""


class NotSupportedTimeoutWarning(PyTritonWarning):
    """A timeout that the underlying client cannot apply."""
