"""pytriton: serve Python inference callables over the Triton HTTP and gRPC protocols, in pure Python."""

__version__ = "0.1.0"
