"""Resolved server options: TritonConfig read once, with a warning for each option that has no effect."""

from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional

from pytriton import constants
from pytriton.exceptions import PyTritonValidationError
from pytriton.triton_config import TritonConfig

LOGGER = logging.getLogger("pytriton")

# Options of tritonserver that have no meaning for an in-process Python engine, and why.
_NO_EFFECT: Dict[str, str] = {
    "model_repository": "models are bound in-process; no model repository directory is used",
    "exit_on_error": "bound models are validated at bind time, so the server never starts with a broken model",
    "http_thread_count": "HTTP is served by one asyncio event loop; callables run in their own instance threads",
    "grpc_infer_allocation_pool_size": "gRPC messages are allocated by grpcio",
    "allow_gpu_metrics": "this engine reports no GPU metrics",
    "cache_directory": "the response cache is built in; no cache shared libraries are loaded",
    "buffer_manager_thread_count": "tensors are not copied through a buffer manager",
    "sagemaker_safe_port_range": "the SageMaker frontend is not available in this engine",
    "sagemaker_thread_count": "the SageMaker frontend is not available in this engine",
    "vertex_ai_thread_count": "the Vertex AI frontend is not available in this engine",
}
# Options this engine does not implement (yet): setting them is an error, not a silent no-op.
_NOT_IMPLEMENTED: Dict[str, str] = {
    "http_restricted_api": "API restriction is not implemented yet",
    "grpc_restricted_protocol": "protocol restriction is not implemented yet",
    "allow_sagemaker": "the SageMaker frontend is not implemented yet",
    "allow_vertex_ai": "the Vertex AI frontend is not implemented yet",
    "grpc_use_ssl": "gRPC TLS is not implemented yet",
    "grpc_use_ssl_mutual": "gRPC TLS is not implemented yet",
}
# Options that are accepted but not applied yet: a warning each.
_NOT_APPLIED: Dict[str, str] = {
    "trace_config": "tracing is not implemented yet",
    "metrics_config": "metrics settings are not implemented yet",
    "metrics_interval_ms": "metrics are computed when scraped",
}


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """What the runtime needs from TritonConfig, with defaults applied."""

    http_enabled: bool
    http_address: str
    http_port: int
    http_header_forward_pattern: Optional[str]
    grpc_enabled: bool
    grpc_address: str
    grpc_port: int
    grpc_header_forward_pattern: Optional[str]
    metrics_enabled: bool
    metrics_address: str
    metrics_port: int
    exit_timeout_s: float
    strict_readiness: bool
    cache_capacity_bytes: Optional[int]
    log_verbose: int

    @classmethod
    def from_config(cls, config: TritonConfig) -> ServerOptions:
        """Resolve a TritonConfig, warning about options that have no effect here."""
        _report_unsupported(config)
        http_address = config.http_address or constants.DEFAULT_ADDRESS
        return cls(
            http_enabled=config.allow_http is not False,
            http_address=http_address,
            http_port=_port(config.http_port, constants.DEFAULT_HTTP_PORT),
            http_header_forward_pattern=config.http_header_forward_pattern,
            grpc_enabled=config.allow_grpc is not False,
            grpc_address=config.grpc_address or constants.DEFAULT_ADDRESS,
            grpc_port=_port(config.grpc_port, constants.DEFAULT_GRPC_PORT),
            grpc_header_forward_pattern=config.grpc_header_forward_pattern,
            metrics_enabled=config.allow_metrics is not False,
            metrics_address=config.metrics_address or http_address,
            metrics_port=_port(config.metrics_port, constants.DEFAULT_METRICS_PORT),
            exit_timeout_s=float(
                config.exit_timeout_secs if config.exit_timeout_secs is not None else constants.DEFAULT_EXIT_TIMEOUT_S
            ),
            strict_readiness=bool(config.strict_readiness),
            cache_capacity_bytes=_cache_capacity(config.cache_config),
            log_verbose=config.log_verbose or 0,
        )


def _port(value: Optional[int], default: int) -> int:
    """A port number; 0 asks the system for a free one."""
    port = default if value is None else value
    if not 0 <= port <= 65535:
        raise PyTritonValidationError(f"invalid port {port}")
    return port


def _cache_capacity(cache_config: Optional[List[str]]) -> Optional[int]:
    """The byte size of the `local` cache from cache_config entries like `local,size=1048576`."""
    if not cache_config:
        return None
    capacity: Optional[int] = None
    for entry in cache_config:
        name, _, setting = entry.partition(",")
        key, _, value = setting.partition("=")
        if name.strip() != "local":
            raise PyTritonValidationError(f"cache_config '{entry}': only the 'local' cache is available")
        if key.strip() != "size":
            raise PyTritonValidationError(f"cache_config '{entry}': the local cache has only a 'size' setting")
        try:
            capacity = int(value)
        except ValueError:
            raise PyTritonValidationError(f"cache_config '{entry}': size must be an integer") from None
    return capacity


def _report_unsupported(config: TritonConfig) -> None:
    """Warn about options without effect; refuse options that are not implemented."""
    for name, reason in _NOT_IMPLEMENTED.items():
        if getattr(config, name) not in (None, False):
            raise PyTritonValidationError(f"TritonConfig.{name} cannot be honoured: {reason}")
    for table in (_NO_EFFECT, _NOT_APPLIED):
        for name, reason in table.items():
            if getattr(config, name) is not None:
                LOGGER.warning("TritonConfig.%s has no effect: %s", name, reason)
