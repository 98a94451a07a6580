"""A model's own trace_config (`Triton.bind(trace_config=...)`) as overrides of the server's trace settings."""

from __future__ import annotations

from typing import Optional, Sequence

from pytriton.exceptions import PyTritonValidationError
from pytriton.options.log_trace import TraceConfig, TraceSetting, parse_trace_config


def model_trace_setting(
    model_name: str, entries: Optional[Sequence[str]], server: TraceConfig
) -> Optional[TraceSetting]:
    """The trace settings a model's trace_config overrides (level, rate, count, log frequency, file); None for none.

    A model's `triton,file=...` is its own trace file (tritonserver 2.51 has one file for all its models).

    The mode and the mode's settings (OpenTelemetry url, resource, ...) belong to the server here, where
    nvidia-pytriton gives each model's Python backend its own tracer: a model asking for other ones is refused.

    Raises:
        PyTritonValidationError: the entries are malformed, or name another mode or other mode settings.
    """
    if entries is None:
        return None
    config = parse_trace_config(entries)
    if config.mode != server.mode or (config.mode_settings and config.mode_settings != server.mode_settings):
        raise PyTritonValidationError(
            f"trace_config of model '{model_name}': the trace mode and its settings are the server's here; "
            "set them in TritonConfig(trace_config=...) and keep only level, rate and count per model"
        )
    file = config.file if config.file and config.file != server.file else None
    setting = TraceSetting(config.level, config.rate, config.count, config.log_frequency, file)
    if setting == TraceSetting(server.level, server.rate, server.count, server.log_frequency):
        return None
    return setting
