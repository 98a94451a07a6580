"""TritonConfig read once into ServerOptions, with a warning for each option that has no effect."""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Dict, List, Optional, Sequence, Tuple

from pytriton import constants
from pytriton.constants import DEFAULT_SERVER_NAME
from pytriton.exceptions import PyTritonValidationError
from pytriton.options.access import GRPC_HEADER_PREFIX, AccessRules, parse_rules, token_rules
from pytriton.options.header_forwarding import forward_pattern
from pytriton.options.limits import ServerLimits, resolve_limits
from pytriton.options.log_trace import TraceConfig, parse_trace_config
from pytriton.options.server import (
    DEFAULT_METRICS_INTERVAL_MS,
    DEFAULT_SAGEMAKER_PORT,
    DEFAULT_SUMMARY_QUANTILES,
    DEFAULT_VERTEX_AI_PORT,
    GRPC_COMPRESSION_LEVELS,
    SAGEMAKER_INFERENCE_TYPES,
    SAGEMAKER_PING_MODES,
    GrpcKeepalive,
    GrpcTls,
    MetricsSettings,
    SageMakerOptions,
    ServerOptions,
    VertexAiOptions,
)
from pytriton.runtime.tracing import sdk_available
from pytriton.triton_config import TritonConfig

LOGGER = logging.getLogger("pytriton")

# Options of tritonserver that have no meaning for an in-process Python engine, and why.
_NO_EFFECT: Dict[str, str] = {
    "model_repository": "models are bound in-process; no model repository directory is used",
    "exit_on_error": "bound models are validated at bind time, so the server never starts with a broken model",
    "http_thread_count": "HTTP is served by one asyncio event loop; callables run in their own instance threads",
    "grpc_infer_allocation_pool_size": "gRPC messages are Python bytes objects; there is no allocation pool",
    "cache_directory": "the response cache is built in; no cache shared libraries are loaded",
    "buffer_manager_thread_count": "tensors are not copied through a buffer manager",
    "sagemaker_safe_port_range": "the other endpoints listen on the ports they are given",
    "sagemaker_thread_count": "the SageMaker frontend is served by the event loop",
    "vertex_ai_thread_count": "the Vertex AI frontend is served by the event loop",
}
# Options this engine does not implement (yet): setting them is an error, not a silent no-op.
_NOT_IMPLEMENTED: Dict[str, str] = {}
# Options that are accepted but not applied yet: a warning each.
_NOT_APPLIED: Dict[str, str] = {}
_METRICS_FLAGS = ("counter_latencies", "histogram_latencies", "summary_latencies")
# The options of each endpoint, which do nothing while it is not served. http_address and http_restricted_api are
# not HTTP's alone: the metrics (by default), SageMaker, Vertex AI and OpenAI ports listen on that address, and the
# restrictions apply to their APIs too.
_HTTP_OPTIONS = ("http_port", "http_header_forward_pattern")
_GRPC_OPTIONS = (
    "grpc_address",
    "grpc_port",
    "grpc_header_forward_pattern",
    "grpc_use_ssl",
    "grpc_use_ssl_mutual",
    "grpc_server_cert",
    "grpc_server_key",
    "grpc_root_cert",
    "grpc_infer_response_compression_level",
    "grpc_keepalive_time",
    "grpc_keepalive_timeout",
    "grpc_keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data",
    "grpc_http2_max_ping_strikes",
    "grpc_restricted_protocol",
)
_METRICS_OPTIONS = (
    "allow_gpu_metrics",
    "allow_cpu_metrics",
    "metrics_interval_ms",
    "metrics_port",
    "metrics_address",
    "metrics_config",
)


def resolve_options(
    config: TritonConfig,
    limits: Optional[ServerLimits] = None,
    *,
    access_token: Optional[str] = None,
    token_endpoints: Sequence[str] = (),
) -> ServerOptions:
    """Resolve a TritonConfig (warning about options without effect here) and the server limits.

    `access_token` restricts `token_endpoints` on HTTP and gRPC (TritonSecurityConfig); the restrictions
    http_restricted_api and grpc_restricted_protocol give apply first, to the APIs they name.
    """
    _report_unsupported(config)
    for option in ("http_header_forward_pattern", "grpc_header_forward_pattern"):
        pattern = getattr(config, option)
        if pattern:
            forward_pattern(pattern, option)  # refused before the server starts
    http_address = config.http_address or constants.DEFAULT_ADDRESS
    options = ServerOptions(
        http_enabled=config.allow_http is not False,
        http_address=http_address,
        http_port=_port("http_port", config.http_port, constants.DEFAULT_HTTP_PORT),
        http_header_forward_pattern=config.http_header_forward_pattern,
        grpc_enabled=config.allow_grpc is not False,
        grpc_address=config.grpc_address or constants.DEFAULT_ADDRESS,
        grpc_port=_port("grpc_port", config.grpc_port, constants.DEFAULT_GRPC_PORT),
        grpc_header_forward_pattern=config.grpc_header_forward_pattern,
        metrics_enabled=config.allow_metrics is not False,
        metrics_address=config.metrics_address or http_address,
        metrics_port=_port("metrics_port", config.metrics_port, constants.DEFAULT_METRICS_PORT),
        metrics_settings=_metrics_settings(config),
        exit_timeout_s=float(
            config.exit_timeout_secs if config.exit_timeout_secs is not None else constants.DEFAULT_EXIT_TIMEOUT_S
        ),
        strict_readiness=config.strict_readiness is not False,  # tritonserver's default is true
        cache_capacity_bytes=_cache_capacity(config.cache_config),
        log_verbose=config.log_verbose or 0,
        server_id=config.id or DEFAULT_SERVER_NAME,
        grpc_tls=_grpc_tls(config),
        grpc_keepalive=_grpc_keepalive(config),
        grpc_compression_level=_grpc_compression_level(config.grpc_infer_response_compression_level),
        log_file=str(config.log_file) if config.log_file else None,
        trace=_trace(config.trace_config),
        http_access=_http_access(config, token_rules(token_endpoints, access_token)),
        grpc_access=_grpc_access(config, token_rules(token_endpoints, access_token, header_prefix=GRPC_HEADER_PREFIX)),
        sagemaker=_sagemaker(config),
        vertex_ai=_vertex_ai(config),
        limits=resolve_limits(limits),
    )
    _report_unserved(config, options)
    return options


def _report_unserved(config: TritonConfig, options: ServerOptions) -> None:
    """Warn about options given for an endpoint that is not served (tritonserver ignores them without a word).

    An option left None, or set to False, asks for nothing and is not reported.
    """
    unserved = (
        (options.http_enabled, "HTTP is not served (allow_http=False)", _HTTP_OPTIONS),
        (options.grpc_enabled, "gRPC is not served (allow_grpc=False)", _GRPC_OPTIONS),
        (options.metrics_enabled, "metrics are not served (allow_metrics=False)", _METRICS_OPTIONS),
        (
            options.sagemaker is not None,
            "the SageMaker frontend is not served (allow_sagemaker is not true)",
            ("sagemaker_port",),
        ),
        (
            options.vertex_ai is not None,
            "the Vertex AI frontend is not served (allow_vertex_ai is not true, nor AIP_MODE=PREDICTION)",
            ("vertex_ai_port", "vertex_ai_default_model"),
        ),
    )
    for served, reason, names in unserved:
        given = [name for name in names if getattr(config, name) is not None and getattr(config, name) is not False]
        if not served and given:
            LOGGER.warning(
                "TritonConfig.%s %s no effect: %s", ", ".join(given), "has" if len(given) == 1 else "have", reason
            )


def _http_access(config: TritonConfig, token: AccessRules) -> AccessRules:
    """http_restricted_api over the access token's restrictions."""
    return parse_rules(config.http_restricted_api, option="http_restricted_api").over(token)


def _grpc_access(config: TritonConfig, token: AccessRules) -> AccessRules:
    """grpc_restricted_protocol over the access token's restrictions."""
    explicit = parse_rules(
        config.grpc_restricted_protocol,
        option="grpc_restricted_protocol",
        header_prefix=GRPC_HEADER_PREFIX,
        kind="protocol",
    )
    return explicit.over(token)


def _port(name: str, value: Optional[int], default: int) -> int:
    """A port number; 0 asks the system for a free one."""
    port = default if value is None else value
    if not 0 <= port <= 65535:
        raise PyTritonValidationError(f"TritonConfig.{name}: {port} is not a port (0 to 65535; 0 picks a free one)")
    return port


def _trace(entries: Optional[List[str]]) -> TraceConfig:
    """trace_config resolved; opentelemetry mode needs the OpenTelemetry SDK."""
    trace = parse_trace_config(entries)
    if trace.mode == "opentelemetry" and not sdk_available():
        raise PyTritonValidationError(
            "trace_config mode=opentelemetry needs the OpenTelemetry SDK: the otel extra "
            "(pip install '.[otel]' in pytriton's checkout)"
        )
    return trace


def _sagemaker(config: TritonConfig) -> Optional[SageMakerOptions]:
    """The SageMaker frontend when allow_sagemaker is set; SAGEMAKER_TRITON_* variables as Triton reads them."""
    if not config.allow_sagemaker:
        return None
    ping_mode = os.environ.get("SAGEMAKER_TRITON_PING_MODE", "ready")
    inference_type = os.environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
    if ping_mode not in SAGEMAKER_PING_MODES:
        raise PyTritonValidationError(f"SAGEMAKER_TRITON_PING_MODE must be ready or live, got '{ping_mode}'")
    if inference_type not in SAGEMAKER_INFERENCE_TYPES:
        raise PyTritonValidationError(
            f"SAGEMAKER_TRITON_INFERENCE_TYPE must be one of {', '.join(SAGEMAKER_INFERENCE_TYPES)}, "
            f"got '{inference_type}'"
        )
    return SageMakerOptions(
        port=_port("sagemaker_port", config.sagemaker_port, DEFAULT_SAGEMAKER_PORT),
        model=os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") or None,
        ping_mode=ping_mode,
        inference_type=inference_type,
    )


def _vertex_ai(config: TritonConfig) -> Optional[VertexAiOptions]:
    """The Vertex AI frontend: allow_vertex_ai, by default on when AIP_MODE=PREDICTION (as in Triton)."""
    allowed = config.allow_vertex_ai
    if allowed is None:
        allowed = os.environ.get("AIP_MODE") == "PREDICTION"
    if not allowed:
        return None
    default_port = os.environ.get("AIP_HTTP_PORT")
    try:
        port_default = int(default_port) if default_port else DEFAULT_VERTEX_AI_PORT
    except ValueError:
        raise PyTritonValidationError(f"AIP_HTTP_PORT must be a port number, got '{default_port}'") from None
    defaults = VertexAiOptions()
    return VertexAiOptions(
        port=_port("vertex_ai_port", config.vertex_ai_port, port_default),
        default_model=config.vertex_ai_default_model or None,
        predict_route=os.environ.get("AIP_PREDICT_ROUTE") or defaults.predict_route,
        health_route=os.environ.get("AIP_HEALTH_ROUTE") or defaults.health_route,
    )


def _grpc_tls(config: TritonConfig) -> Optional[GrpcTls]:
    """TLS settings when grpc_use_ssl or grpc_use_ssl_mutual is set (mutual implies TLS)."""
    mutual = bool(config.grpc_use_ssl_mutual)
    if not (config.grpc_use_ssl or mutual):
        return None
    if config.grpc_server_cert is None or config.grpc_server_key is None:
        raise PyTritonValidationError(
            "gRPC TLS (grpc_use_ssl) needs grpc_server_cert and grpc_server_key: the server's PEM certificate and key"
        )
    if mutual and config.grpc_root_cert is None:
        raise PyTritonValidationError("gRPC mutual TLS needs grpc_root_cert to verify client certificates")
    root_cert = pathlib.Path(config.grpc_root_cert) if config.grpc_root_cert is not None else None
    return GrpcTls(pathlib.Path(config.grpc_server_cert), pathlib.Path(config.grpc_server_key), root_cert, mutual)


def _grpc_keepalive(config: TritonConfig) -> GrpcKeepalive:
    """Keepalive settings: each given option over Triton's default."""
    defaults = GrpcKeepalive()

    def given(name: str, value: Optional[int], default: int) -> int:
        if value is None:
            return default
        if value < 0:
            raise PyTritonValidationError(f"TritonConfig.{name} must be >= 0, got {value}")
        return value

    permit = config.grpc_keepalive_permit_without_calls
    return GrpcKeepalive(
        time_ms=given("grpc_keepalive_time", config.grpc_keepalive_time, defaults.time_ms),
        timeout_ms=given("grpc_keepalive_timeout", config.grpc_keepalive_timeout, defaults.timeout_ms),
        permit_without_calls=defaults.permit_without_calls if permit is None else permit,
        max_pings_without_data=given(
            "grpc_http2_max_pings_without_data",
            config.grpc_http2_max_pings_without_data,
            defaults.max_pings_without_data,
        ),
        min_recv_ping_interval_without_data_ms=given(
            "grpc_http2_min_recv_ping_interval_without_data",
            config.grpc_http2_min_recv_ping_interval_without_data,
            defaults.min_recv_ping_interval_without_data_ms,
        ),
        max_ping_strikes=given(
            "grpc_http2_max_ping_strikes", config.grpc_http2_max_ping_strikes, defaults.max_ping_strikes
        ),
    )


def _grpc_compression_level(level: Optional[str]) -> str:
    """grpc_infer_response_compression_level: none, low, medium or high."""
    resolved = (level or "none").strip().lower()
    if resolved not in GRPC_COMPRESSION_LEVELS:
        raise PyTritonValidationError(
            f"grpc_infer_response_compression_level must be one of {', '.join(GRPC_COMPRESSION_LEVELS)}, got {level!r}"
        )
    return resolved


# The smallest `local,size=` tritonserver 2.51's local cache starts with (its buffer's manager takes the rest).
MIN_LOCAL_CACHE_BYTES = 192


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
        if capacity < MIN_LOCAL_CACHE_BYTES:
            # tritonserver 2.51 (measured) does not start below this: "Failed to initialize LocalCache".
            raise PyTritonValidationError(
                f"cache_config '{entry}': the local cache needs a size of at least {MIN_LOCAL_CACHE_BYTES} bytes "
                "(tritonserver 2.51 does not start with less)"
            )
    return capacity


def _metrics_settings(config: TritonConfig) -> MetricsSettings:
    """allow_cpu/gpu_metrics, metrics_interval_ms and metrics_config entries like `summary_latencies=true`."""
    interval_ms = DEFAULT_METRICS_INTERVAL_MS if config.metrics_interval_ms is None else config.metrics_interval_ms
    if interval_ms <= 0:
        raise PyTritonValidationError(f"metrics_interval_ms must be positive, got {interval_ms}")
    flags: Dict[str, bool] = {}
    quantiles = DEFAULT_SUMMARY_QUANTILES
    for key, value in _metrics_config_items(config.metrics_config or []):
        if key in _METRICS_FLAGS:
            flags[key] = _flag(key, value)
        elif key == "summary_quantiles":
            quantiles = _quantiles(value)
        else:
            LOGGER.warning("TritonConfig.metrics_config setting '%s' has no effect: it is not known here", key)
    return MetricsSettings(
        cpu_metrics=config.allow_cpu_metrics is not False,
        gpu_metrics=config.allow_gpu_metrics is not False,
        interval_ms=interval_ms,
        summary_quantiles=quantiles,
        **flags,
    )


def _metrics_config_items(entries: List[str]) -> List[Tuple[str, str]]:
    """`key=value` pairs; an entry without `=` continues the previous value (a list split at its commas)."""
    items: List[Tuple[str, str]] = []
    for entry in entries:
        key, sep, value = entry.partition("=")
        if sep:
            items.append((key.strip(), value.strip()))
        elif items:
            items[-1] = (items[-1][0], f"{items[-1][1]},{entry.strip()}")
        else:
            raise PyTritonValidationError(f"metrics_config '{entry}': expected <setting>=<value>")
    return items


def _flag(key: str, value: str) -> bool:
    """A metrics_config boolean (true/false)."""
    text = value.strip().strip('"').lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise PyTritonValidationError(f"metrics_config {key}={value}: expected true or false")


def _quantiles(value: str) -> Tuple[Tuple[float, float], ...]:
    """summary_quantiles `<quantile>:<error>` pairs, separated by commas or spaces."""
    pairs: List[Tuple[float, float]] = []
    for pair in value.strip().strip('"').replace(",", " ").split():
        quantile, sep, error = pair.partition(":")
        try:
            parsed = (float(quantile), float(error))
        except ValueError:
            parsed = (-1.0, -1.0)
        if not sep or not 0.0 <= parsed[0] <= 1.0 or not 0.0 <= parsed[1] <= 1.0:
            raise PyTritonValidationError(f"metrics_config summary_quantiles '{pair}': expected <quantile>:<error>")
        pairs.append(parsed)
    if not pairs:
        raise PyTritonValidationError("metrics_config summary_quantiles: no <quantile>:<error> pairs given")
    return tuple(pairs)


def no_effect_reason(name: str) -> Optional[str]:
    """Why TritonConfig option `name` has no effect here, or None when it has one (`pytriton serve --help`)."""
    return _NO_EFFECT.get(name) or _NOT_APPLIED.get(name)


def _report_unsupported(config: TritonConfig) -> None:
    """Warn about options without effect; refuse options that are not implemented."""
    for name, reason in _NOT_IMPLEMENTED.items():
        if getattr(config, name) not in (None, False):
            raise PyTritonValidationError(f"TritonConfig.{name} cannot be honoured: {reason}")
    for table in (_NO_EFFECT, _NOT_APPLIED):
        for name, reason in table.items():
            if getattr(config, name) is not None:
                LOGGER.warning("TritonConfig.%s has no effect: %s", name, reason)
