"""Kept so that `from pytriton.options.limits import ServerLimits` goes on working; see `pytriton.options.limits`."""

from pytriton.options.limits import DEFAULT_MAX_BODY_BYTES, ENV_PREFIX, GRPC_MAX_MESSAGE_BYTES, ServerLimits

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ENV_PREFIX", "GRPC_MAX_MESSAGE_BYTES", "ServerLimits"]
