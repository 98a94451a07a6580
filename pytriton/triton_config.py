"""TritonConfig: the server options of NVIDIA's PyTriton, read from code, the environment and defaults."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import pathlib
import re
import typing
from typing import Any, Dict, List, Optional, Type, TypeVar

from pytriton import constants
from pytriton.exceptions import PyTritonValidationError
from pytriton.options.server import (
    DEFAULT_METRICS_INTERVAL_MS,
    DEFAULT_SAGEMAKER_PORT,
    DEFAULT_VERTEX_AI_PORT,
    GrpcKeepalive,
)

LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"
_LIST_ITEM = re.compile(r"^(.+?)_(\d+)$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_KEEPALIVE = GrpcKeepalive()
# What a value that does not cast is said to have to be.
_TYPE_WORDS: Dict[type, str] = {int: "an integer", float: "a number", bool: "true or false"}


def _doc(doc: str, default: object = None) -> Dict[str, object]:
    """A TritonConfig field's metadata: what it does, and the value the server uses when it is None.

    `pytriton serve --help` shows both. `default` is the constant the server resolves None to, or words
    where it depends on something else.
    """
    return {"doc": doc, "default": default}


def _keyword_only(cls: Type[_T]) -> Type[_T]:
    """Make a dataclass's __init__ refuse positional arguments, as nvidia-pytriton's kwonly_dataclass does.

    (`dataclass(kw_only=True)` needs Python 3.10.)
    """
    init = cls.__init__
    signature = inspect.signature(init)
    parameters = [p if p.name == "self" else p.replace(kind=p.KEYWORD_ONLY) for p in signature.parameters.values()]

    @functools.wraps(init)
    def keyword_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError(f"{cls.__name__} initialization can't be used with positional arguments")
        init(self, **kwargs)

    keyword_init.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    cls.__init__ = keyword_init  # type: ignore[method-assign]
    return cls


@_keyword_only
@dataclasses.dataclass
class TritonConfig:
    """Server configuration; every field is optional and None means the server's default.

    The field names and meanings are those of NVIDIA's PyTriton (tritonserver's command line options).
    Options this engine cannot honour are reported with a warning when the server starts. Each field's
    metadata holds what it does ("doc") and the value None stands for ("default"), as `pytriton serve
    --help` shows them.
    """

    model_repository: Optional[pathlib.Path] = dataclasses.field(
        default=None, metadata=_doc("tritonserver's model repository directory")
    )
    id: Optional[str] = dataclasses.field(
        default=None,
        metadata=_doc("the server's name in GET /v2 and gRPC ServerMetadata", constants.DEFAULT_SERVER_NAME),
    )
    log_verbose: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("1 or more: the pytriton logger logs at DEBUG too, which slows inference", 0)
    )
    log_file: Optional[pathlib.Path] = dataclasses.field(
        default=None, metadata=_doc("write the pytriton logger's records to this file instead of stderr")
    )
    exit_timeout_secs: Optional[int] = dataclasses.field(
        default=None,
        metadata=_doc(
            "on a stop, how long queued and running requests may still finish, in seconds",
            constants.DEFAULT_EXIT_TIMEOUT_S,
        ),
    )
    exit_on_error: Optional[bool] = dataclasses.field(default=None, metadata=_doc("exit when a model fails to load"))
    strict_readiness: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("/v2/health/ready also requires every model to be ready", True)
    )
    allow_http: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("serve HTTP/REST (KServe v2); allow_http and allow_grpc cannot both be false", True)
    )
    http_address: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("the address HTTP listens on", constants.DEFAULT_ADDRESS)
    )
    http_port: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("the HTTP port; 0 picks a free one", constants.DEFAULT_HTTP_PORT)
    )
    http_header_forward_pattern: Optional[str] = dataclasses.field(
        default=None,
        metadata=_doc("a regular expression: matching HTTP headers reach the callables as request parameters"),
    )
    http_thread_count: Optional[int] = dataclasses.field(default=None, metadata=_doc("threads serving HTTP requests"))
    http_restricted_api: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("<apis>:<header>=<value> groups separated by ';': HTTP APIs that need that header")
    )
    allow_grpc: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("serve gRPC (inference.GRPCInferenceService)", True)
    )
    grpc_address: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("the address gRPC listens on", constants.DEFAULT_ADDRESS)
    )
    grpc_port: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("the gRPC port; 0 picks a free one", constants.DEFAULT_GRPC_PORT)
    )
    grpc_header_forward_pattern: Optional[str] = dataclasses.field(
        default=None,
        metadata=_doc("a regular expression: matching gRPC metadata keys reach the callables as request parameters"),
    )
    grpc_infer_allocation_pool_size: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("gRPC request and response objects kept for reuse")
    )
    grpc_use_ssl: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("TLS on gRPC; needs grpc_server_cert and grpc_server_key", False)
    )
    grpc_use_ssl_mutual: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("mutual TLS on gRPC (implies TLS); also needs grpc_root_cert", False)
    )
    grpc_server_cert: Optional[pathlib.Path] = dataclasses.field(
        default=None, metadata=_doc("the gRPC server's PEM certificate")
    )
    grpc_server_key: Optional[pathlib.Path] = dataclasses.field(
        default=None, metadata=_doc("the gRPC server's PEM private key")
    )
    grpc_root_cert: Optional[pathlib.Path] = dataclasses.field(
        default=None, metadata=_doc("the PEM root certificate that verifies gRPC clients (mutual TLS)")
    )
    grpc_infer_response_compression_level: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("none, low, medium or high: how gRPC inference responses are compressed", "none")
    )
    grpc_keepalive_time: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("the gRPC keepalive ping period, in milliseconds", _KEEPALIVE.time_ms)
    )
    grpc_keepalive_timeout: Optional[int] = dataclasses.field(
        default=None,
        metadata=_doc(
            "how long a keepalive ping waits for its acknowledgement, in milliseconds", _KEEPALIVE.timeout_ms
        ),
    )
    grpc_keepalive_permit_without_calls: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("allow keepalive pings while no call is in flight", _KEEPALIVE.permit_without_calls)
    )
    grpc_http2_max_pings_without_data: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("pings a client may send without data frames", _KEEPALIVE.max_pings_without_data)
    )
    grpc_http2_min_recv_ping_interval_without_data: Optional[int] = dataclasses.field(
        default=None,
        metadata=_doc(
            "the shortest time between a client's pings without data, in milliseconds",
            _KEEPALIVE.min_recv_ping_interval_without_data_ms,
        ),
    )
    grpc_http2_max_ping_strikes: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("bad pings tolerated before GOAWAY", _KEEPALIVE.max_ping_strikes)
    )
    grpc_restricted_protocol: Optional[str] = dataclasses.field(
        default=None,
        metadata=_doc(
            "<protocols>:<key>=<value> groups separated by ';': gRPC calls needing metadata triton-grpc-protocol-<key>"
        ),
    )
    allow_metrics: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("serve Prometheus metrics on /metrics", True)
    )
    allow_gpu_metrics: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("report the nv_gpu_* gauges (needs the gpu extra and a GPU)", True)
    )
    allow_cpu_metrics: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("report the nv_cpu_* gauges", True)
    )
    metrics_interval_ms: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("how often the gauges are refreshed, in milliseconds", DEFAULT_METRICS_INTERVAL_MS)
    )
    metrics_port: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("the metrics port; 0 picks a free one", constants.DEFAULT_METRICS_PORT)
    )
    metrics_address: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("the address metrics listen on", "http_address")
    )
    allow_sagemaker: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("serve the SageMaker frontend (GET /ping, POST /invocations)", False)
    )
    sagemaker_port: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("the SageMaker port; 0 picks a free one", DEFAULT_SAGEMAKER_PORT)
    )
    sagemaker_safe_port_range: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("the port range allowed to endpoints other than SageMaker's")
    )
    sagemaker_thread_count: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("threads serving SageMaker requests")
    )
    allow_vertex_ai: Optional[bool] = dataclasses.field(
        default=None, metadata=_doc("serve the Vertex AI frontend", "true when AIP_MODE=PREDICTION")
    )
    vertex_ai_port: Optional[int] = dataclasses.field(
        default=None,
        metadata=_doc("the Vertex AI port; 0 picks a free one", f"$AIP_HTTP_PORT, else {DEFAULT_VERTEX_AI_PORT}"),
    )
    vertex_ai_thread_count: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("threads serving Vertex AI requests")
    )
    vertex_ai_default_model: Optional[str] = dataclasses.field(
        default=None, metadata=_doc("the model the Vertex AI predict route runs", "the only model")
    )
    metrics_config: Optional[List[str]] = dataclasses.field(
        default=None,
        metadata=_doc(
            "<setting>=<value>: counter_latencies, histogram_latencies, summary_latencies, summary_quantiles"
        ),
    )
    trace_config: Optional[List[str]] = dataclasses.field(
        default=None,
        metadata=_doc("[<mode>,]<setting>=<value>: Triton's trace settings (mode triton or opentelemetry)"),
    )
    cache_config: Optional[List[str]] = dataclasses.field(
        default=None, metadata=_doc("local,size=<bytes>: the response cache, for models bound with response_cache")
    )
    cache_directory: Optional[str] = dataclasses.field(default=None, metadata=_doc("the directory of cache libraries"))
    buffer_manager_thread_count: Optional[int] = dataclasses.field(
        default=None, metadata=_doc("threads copying tensor contents")
    )

    def __post_init__(self) -> None:
        """Validate configuration for early error handling."""
        hint = Optional[bool]  # cast as resolve_config will: allow_http="true" allows HTTP
        http = cast_config_value("allow_http", hint, self.allow_http)
        grpc = cast_config_value("allow_grpc", hint, self.allow_grpc)
        if http is False and grpc is False:
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> Dict[str, Any]:
        """Map config object to dictionary."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: Dict[str, Any]) -> TritonConfig:
        """Create a TritonConfig from a dict, casting values to the field types; unknown names are warned."""
        hints = typing.get_type_hints(cls)
        names = [field.name for field in dataclasses.fields(cls)]
        known: Dict[str, Any] = {}
        for name, value in config.items():
            if name not in hints:
                LOGGER.warning(
                    "Ignoring %s=%s as could not find matching config field. Available fields: %s",
                    name,
                    value,
                    ", ".join(names),
                )
                continue
            known[name] = cast_config_value(name, hints[name], value)
        return cls(**known)

    @classmethod
    def from_env(cls) -> TritonConfig:
        """Create a TritonConfig from PYTRITON_TRITON_CONFIG_* variables (lists as NAME_0, NAME_1, ...).

        Example:
            PYTRITON_TRITON_CONFIG_GRPC_PORT=45436 PYTRITON_TRITON_CONFIG_LOG_VERBOSE=4
        """
        config: Dict[str, Any] = {}
        lists: Dict[str, Dict[int, str]] = {}
        hints = typing.get_type_hints(cls)
        list_fields = {name for name, hint in hints.items() if _is_list(hint)}
        for env_name, value in os.environ.items():
            if not env_name.startswith(ENV_PREFIX):
                continue
            key = env_name[len(ENV_PREFIX) :].lower()
            match = _LIST_ITEM.match(key)
            if match and match.group(1) in list_fields:
                lists.setdefault(match.group(1), {})[int(match.group(2))] = value
            elif key in hints:
                config[key] = cast_config_value(key, hints[key], value, source=env_name)  # a bad one names the variable
            else:
                config[key] = value
        for key, items in lists.items():
            config[key] = [items[index] for index in sorted(items)]
        return cls.from_dict(config)


def _is_list(hint: Any) -> bool:
    """Whether a field type is Optional[List[...]]."""
    return any(getattr(arg, "__origin__", None) is list for arg in typing.get_args(hint))


def cast_config_value(name: str, hint: Any, value: Any, *, source: Optional[str] = None) -> Any:
    """Cast a value (often a string from the environment) to a field's type.

    Raises:
        PyTritonValidationError: the value does not cast; the message names `source` (an environment
            variable), else `TritonConfig.<name>`.
    """
    source = source or f"TritonConfig.{name}"
    if value is None:
        return None
    target = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if getattr(target, "__origin__", None) is list:
        # one string is one entry: entries such as `local,size=1048576` contain commas themselves
        return [value] if isinstance(value, str) else list(value)
    if target is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise PyTritonValidationError(f"{source} must be true or false, got {value!r}")
    if target is int and isinstance(value, float) and not value.is_integer():
        raise PyTritonValidationError(f"{source} must be an integer, got {value!r}")  # int() would cut 1.5 to 1
    try:
        return target(value)
    except (TypeError, ValueError):
        expected = _TYPE_WORDS.get(target, target.__name__)
        raise PyTritonValidationError(f"{source} must be {expected}, got {value!r}") from None


def resolve_config(explicit: Optional[TritonConfig]) -> TritonConfig:
    """Merge options: explicit config over environment variables over defaults.

    The explicit config's values are cast to their fields' types, as the environment's are: 0.7 handed them to
    tritonserver's command line as text, so `http_port="8000"`, `allow_grpc="false"` or `strict_readiness=0`
    worked there, and a value of the wrong type here was a TypeError or, for a switch, taken as true.

    Raises:
        PyTritonValidationError: an explicit value does not cast (the message names the field).
    """
    from_env = {name: value for name, value in TritonConfig.from_env().to_dict().items() if value is not None}
    hints = typing.get_type_hints(TritonConfig)
    given = {
        name: cast_config_value(name, hints[name], value)
        for name, value in (explicit.to_dict() if explicit else {}).items()
        if value is not None
    }
    return TritonConfig(**{**from_env, **given})
