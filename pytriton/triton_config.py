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

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"
_LIST_ITEM = re.compile(r"^(.+?)_(\d+)$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


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
    Options this engine cannot honour are reported with a warning when the server starts.
    """

    model_repository: Optional[pathlib.Path] = None
    id: Optional[str] = None
    log_verbose: Optional[int] = None
    log_file: Optional[pathlib.Path] = None
    exit_timeout_secs: Optional[int] = None
    exit_on_error: Optional[bool] = None
    strict_readiness: Optional[bool] = None
    allow_http: Optional[bool] = None
    http_address: Optional[str] = None
    http_port: Optional[int] = None
    http_header_forward_pattern: Optional[str] = None
    http_thread_count: Optional[int] = None
    http_restricted_api: Optional[str] = None
    allow_grpc: Optional[bool] = None
    grpc_address: Optional[str] = None
    grpc_port: Optional[int] = None
    grpc_header_forward_pattern: Optional[str] = None
    grpc_infer_allocation_pool_size: Optional[int] = None
    grpc_use_ssl: Optional[bool] = None
    grpc_use_ssl_mutual: Optional[bool] = None
    grpc_server_cert: Optional[pathlib.Path] = None
    grpc_server_key: Optional[pathlib.Path] = None
    grpc_root_cert: Optional[pathlib.Path] = None
    grpc_infer_response_compression_level: Optional[str] = None
    grpc_keepalive_time: Optional[int] = None
    grpc_keepalive_timeout: Optional[int] = None
    grpc_keepalive_permit_without_calls: Optional[bool] = None
    grpc_http2_max_pings_without_data: Optional[int] = None
    grpc_http2_min_recv_ping_interval_without_data: Optional[int] = None
    grpc_http2_max_ping_strikes: Optional[int] = None
    grpc_restricted_protocol: Optional[str] = None
    allow_metrics: Optional[bool] = None
    allow_gpu_metrics: Optional[bool] = None
    allow_cpu_metrics: Optional[bool] = None
    metrics_interval_ms: Optional[int] = None
    metrics_port: Optional[int] = None
    metrics_address: Optional[str] = None
    allow_sagemaker: Optional[bool] = None
    sagemaker_port: Optional[int] = None
    sagemaker_safe_port_range: Optional[str] = None
    sagemaker_thread_count: Optional[int] = None
    allow_vertex_ai: Optional[bool] = None
    vertex_ai_port: Optional[int] = None
    vertex_ai_thread_count: Optional[int] = None
    vertex_ai_default_model: Optional[str] = None
    metrics_config: Optional[List[str]] = None
    trace_config: Optional[List[str]] = None
    cache_config: Optional[List[str]] = None
    cache_directory: Optional[str] = None
    buffer_manager_thread_count: Optional[int] = None

    def __post_init__(self) -> None:
        """Validate configuration for early error handling."""
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
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
        list_fields = {name for name, hint in typing.get_type_hints(cls).items() if _is_list(hint)}
        for env_name, value in os.environ.items():
            if not env_name.startswith(ENV_PREFIX):
                continue
            key = env_name[len(ENV_PREFIX) :].lower()
            match = _LIST_ITEM.match(key)
            if match and match.group(1) in list_fields:
                lists.setdefault(match.group(1), {})[int(match.group(2))] = value
            else:
                config[key] = value
        for key, items in lists.items():
            config[key] = [items[index] for index in sorted(items)]
        return cls.from_dict(config)


def _is_list(hint: Any) -> bool:
    """Whether a field type is Optional[List[...]]."""
    return any(getattr(arg, "__origin__", None) is list for arg in typing.get_args(hint))


def cast_config_value(name: str, hint: Any, value: Any) -> Any:
    """Cast a value (often a string from the environment) to a field's type."""
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
        raise PyTritonValidationError(f"TritonConfig.{name} must be a boolean, got {value!r}")
    try:
        return target(value)
    except (TypeError, ValueError):
        raise PyTritonValidationError(f"TritonConfig.{name} must be {target.__name__}, got {value!r}") from None


def resolve_config(explicit: Optional[TritonConfig]) -> TritonConfig:
    """Merge options: explicit config over environment variables over defaults."""
    from_env = {name: value for name, value in TritonConfig.from_env().to_dict().items() if value is not None}
    given = {name: value for name, value in (explicit.to_dict() if explicit else {}).items() if value is not None}
    return TritonConfig(**{**from_env, **given})
