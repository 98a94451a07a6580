"""What the runtime and the transports need of TritonConfig, resolved: plain frozen data.

Built by `pytriton.runtime.options.resolve_options`; read by the transports, which must not import the runtime.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional, Tuple

from pytriton.options.access import AccessRules
from pytriton.options.limits import ServerLimits
from pytriton.options.log_trace import TraceConfig

DEFAULT_SAGEMAKER_PORT = 8080
DEFAULT_VERTEX_AI_PORT = 8080
SAGEMAKER_PING_MODES = ("ready", "live")
SAGEMAKER_INFERENCE_TYPES = ("infer", "generate", "generate_stream")
# Triton's default summary quantiles, as (quantile, allowed error) pairs.
DEFAULT_SUMMARY_QUANTILES: Tuple[Tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
DEFAULT_METRICS_INTERVAL_MS = 2000


@dataclasses.dataclass(frozen=True)
class MetricsSettings:
    """What the metrics endpoint reports: allow_cpu_metrics, allow_gpu_metrics, metrics_interval_ms, metrics_config."""

    cpu_metrics: bool = True
    gpu_metrics: bool = True
    interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: Tuple[Tuple[float, float], ...] = DEFAULT_SUMMARY_QUANTILES


GRPC_COMPRESSION_LEVELS = ("none", "low", "medium", "high")


@dataclasses.dataclass(frozen=True)
class GrpcTls:
    """TLS for the gRPC endpoint: server certificate and key, and the CA that signs client certificates."""

    server_cert: pathlib.Path
    server_key: pathlib.Path
    root_cert: Optional[pathlib.Path]
    mutual: bool


@dataclasses.dataclass(frozen=True)
class GrpcKeepalive:
    """gRPC keepalive and HTTP/2 ping settings (milliseconds); defaults are Triton's."""

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_without_data_ms: int = 300_000
    max_ping_strikes: int = 2


@dataclasses.dataclass(frozen=True)
class SageMakerOptions:
    """The SageMaker frontend (GET /ping, POST /invocations) and Triton's SAGEMAKER_TRITON_* variables."""

    port: int = DEFAULT_SAGEMAKER_PORT
    model: Optional[str] = None
    ping_mode: str = "ready"
    inference_type: str = "infer"


@dataclasses.dataclass(frozen=True)
class VertexAiOptions:
    """The Vertex AI frontend: its port, default model and the AIP_PREDICT_ROUTE / AIP_HEALTH_ROUTE routes."""

    port: int = DEFAULT_VERTEX_AI_PORT
    default_model: Optional[str] = None
    predict_route: str = "/predict"
    health_route: str = "/health"


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
    metrics_settings: MetricsSettings
    exit_timeout_s: float
    strict_readiness: bool
    cache_capacity_bytes: Optional[int]
    log_verbose: int
    server_id: str
    grpc_tls: Optional[GrpcTls] = None
    grpc_keepalive: GrpcKeepalive = dataclasses.field(default_factory=GrpcKeepalive)
    grpc_compression_level: str = "none"
    log_file: Optional[str] = None
    trace: TraceConfig = dataclasses.field(default_factory=TraceConfig)
    http_access: AccessRules = dataclasses.field(default_factory=AccessRules)
    grpc_access: AccessRules = dataclasses.field(default_factory=AccessRules)
    sagemaker: Optional[SageMakerOptions] = None
    vertex_ai: Optional[VertexAiOptions] = None
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    frontends: int = 1  # processes serving HTTP and gRPC (options/frontends.py); 1: this process's loop
    # The key OpenAI clients send as `Authorization: Bearer <key>` (TritonSecurityConfig); None: none asked.
    openai_api_key: Optional[str] = None
    # The port of the OpenAI API's own server (0: a free one); None serves it on the HTTP port.
    openai_port: Optional[int] = None
