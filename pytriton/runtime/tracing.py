"""Tracing: OpenTelemetry spans (mode opentelemetry) or trace files (mode triton: runtime/trace_files.py).

In mode opentelemetry a sampled request gets request, queue and compute spans.

A model's scheduler gets a span source only while the model's trace settings are on, so a model that is not
traced pays nothing per request. A sampled request gets its spans when it leaves the queue: "request" from its
arrival, "queue" up to now, and "compute", open while the callable runs; the callable's Request carries that
span (`request.span`, `request.traced_span(name)` for child spans). They end when the request ends.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import time
from typing import Any, Callable, Dict, List, Optional

from pytriton.core.model import ServedModel
from pytriton.core.request import InferenceResponse
from pytriton.options.log_trace import TraceSettings
from pytriton.runtime.trace_files import FileModelTracer, TraceFiles

LOGGER = logging.getLogger("pytriton")

DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME = "triton-inference-server"
_OTLP_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def sdk_available() -> bool:
    """Whether the OpenTelemetry SDK is installed (the `otel` extra)."""
    return _installed("opentelemetry.sdk")


def _installed(module: str) -> bool:
    """Whether a module can be imported (its parent packages included)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Tracing:
    """Tracing of one server: an OpenTelemetry tracer provider or trace files, and the span sources of traced models."""

    def __init__(
        self,
        settings: TraceSettings,
        models: Callable[[], List[ServedModel]],
        versions_of: Callable[[str], List[ServedModel]],
    ) -> None:
        """Create the tracer provider (mode opentelemetry) or the trace files (mode triton with a file).

        `models`: every model version bound; `versions_of`: those of one model.

        Nothing is observed until `refresh`.
        """
        self._settings = settings
        self._models = models
        self._versions_of = versions_of
        self._sources: Dict[ServedModel, Any] = {}
        self._provider: Any = None
        self._tracer: Any = None
        self._files: Optional[TraceFiles] = None
        # Models `refresh` looked at (whether each is traced), since the start: what a settings change costs.
        self.looked_at = 0
        config = settings.config
        if config.mode == "opentelemetry":
            self._provider = _tracer_provider(settings)
            self._tracer = self._provider.get_tracer("pytriton")
        elif config.level and not config.file:
            LOGGER.warning(
                "trace_config: trace level %s asks for a trace file (triton,file=<path>) and names none: requests are "
                "traced only for models with a file of their own",
                "+".join(config.level),
            )
        settings.listeners.append(self.refresh)

    def add_span_processor(self, processor: Any) -> None:
        """Send spans to another OpenTelemetry span processor as well (e.g. an in-memory exporter's)."""
        if self._provider is None:
            raise RuntimeError("tracing is not in opentelemetry mode (trace_config mode=opentelemetry)")
        self._provider.add_span_processor(processor)

    def refresh(self, changed: str = "") -> None:
        """Trace the models whose trace settings are on and stop tracing the others (on the loop).

        `changed`: only that model's settings changed, so only its versions are looked at. Looking at every model
        on each model's change made setting N models' traces one after another cost O(N^2).
        """
        settings = self._settings
        settings.stamps = settings.writes_files
        if self._files is None and settings.stamps:
            self._files = TraceFiles(settings)
            self._files.on_exhausted = self.refresh
            changed = ""  # models without a file of their own may write to the server's now
        if self._tracer is None and self._files is None:
            return
        if self._files is not None:
            try:
                self._files.bind_loop(asyncio.get_running_loop())
            except RuntimeError:  # not on the loop: before the server runs, the loop it runs on is bound later
                pass
        if changed:
            models = self._versions_of(changed)
        else:
            models = self._models()
            for gone in set(self._sources) - set(models):  # bound again by a load: its old binding keeps its spans
                del self._sources[gone]
        files = self._files
        self.looked_at += len(models)
        for model in models:
            name = model.spec.name
            traced = settings.enabled(name) and (files is None or bool(settings.file_of(name)))
            source = self._sources.get(model)
            if traced and source is None:
                source = self._sources[model] = self._source(model)
                model.scheduler.spans = source
            elif not traced and source is not None:
                del self._sources[model]
                model.scheduler.spans = None

    def _source(self, model: ServedModel) -> Any:
        """A model's span source: OpenTelemetry spans, or trace file records."""
        if self._files is not None:
            spec = model.spec
            return FileModelTracer(spec.name, spec.version_str, self._files, ensemble=spec.ensemble is not None)
        return _ModelTracer(model, self._tracer, self._settings, self._on_exhausted)

    def shutdown(self) -> None:
        """Stop tracing, flush and close the exporters, write what the trace files have left and close them."""
        for model in self._sources:
            model.scheduler.spans = None
        self._sources.clear()
        provider, self._provider, self._tracer = self._provider, None, None
        if provider is not None:
            provider.shutdown()
        files, self._files = self._files, None
        if files is not None:
            files.close()

    def _on_exhausted(self) -> None:
        """trace_count ran out: stop tracing once the current request has its spans."""
        asyncio.get_running_loop().call_soon(self.refresh)


class _ModelTracer:
    """A model's span source: samples its requests by the trace settings and opens their spans."""

    def __init__(
        self, model: ServedModel, tracer: Any, settings: TraceSettings, on_exhausted: Callable[[], None]
    ) -> None:
        from opentelemetry.trace import set_span_in_context

        self._name = model.spec.name
        self._in_context = set_span_in_context
        self._attributes = {"triton.model_name": model.spec.name, "triton.model_version": model.spec.version_str}
        self._tracer = tracer
        self._settings = settings
        self._on_exhausted = on_exhausted

    def start(self, enqueue_ns: int, parent: Any = None, entry: Any = None) -> Optional[_TracedCall]:
        """The spans of a request that leaves the queue now, when it is sampled; under `parent` when given."""
        settings = self._settings
        if not settings.sample(self._name):
            return None
        if not settings.enabled(self._name):
            self._on_exhausted()
        now_ns = time.time_ns()
        arrival_ns = now_ns - (time.monotonic_ns() - enqueue_ns)
        tracer = self._tracer
        above = self._in_context(parent) if parent is not None else None
        root = tracer.start_span("request", context=above, start_time=arrival_ns, attributes=self._attributes)
        context = self._in_context(root)
        tracer.start_span("queue", context=context, start_time=arrival_ns).end(end_time=now_ns)
        compute = tracer.start_span("compute", context=context, start_time=now_ns)
        return _TracedCall(root, compute, tracer)


class _TracedCall:
    """The open spans of one traced request."""

    __slots__ = ("root", "span", "tracer")

    def __init__(self, root: Any, span: Any, tracer: Any) -> None:
        self.root = root
        self.span = span
        self.tracer = tracer

    def responded(self, response: InferenceResponse) -> InferenceResponse:
        """A response goes out as it is."""
        return response

    def finish(self, error: Optional[str]) -> None:
        """End the compute and request spans (ERROR status with the message when the request failed)."""
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            for span in (self.span, self.root):
                span.set_status(Status(StatusCode.ERROR, error))
        end_ns = time.time_ns()
        self.span.end(end_time=end_ns)
        self.root.end(end_time=end_ns)


def _tracer_provider(settings: TraceSettings) -> Any:
    """An SDK tracer provider with Triton's resource and, when installed, an OTLP/HTTP exporter to `url`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    config = settings.config
    attributes: Dict[str, str] = {"service.name": DEFAULT_SERVICE_NAME}
    for key, value in config.mode_settings:
        if key == "resource":
            name, _, attribute = value.partition("=")
            attributes[name.strip()] = attribute.strip()
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter = _otlp_exporter(config.setting("url", DEFAULT_OTLP_URL))
    if exporter is not None:
        processor = BatchSpanProcessor(
            exporter,
            max_queue_size=int(config.setting("bsp_max_queue_size")),
            schedule_delay_millis=float(config.setting("bsp_schedule_delay")),
            max_export_batch_size=int(config.setting("bsp_max_export_batch_size")),
        )
        provider.add_span_processor(processor)
    return provider


def _otlp_exporter(url: str) -> Optional[Any]:
    """The OTLP/HTTP span exporter for `url`, or None (with a warning) when it is not installed."""
    if not _installed(_OTLP_EXPORTER_MODULE):
        LOGGER.warning(
            "trace_config mode=opentelemetry: opentelemetry-exporter-otlp-proto-http is not installed, so spans "
            "are not exported to %s",
            url,
        )
        return None
    module = importlib.import_module(_OTLP_EXPORTER_MODULE)
    return module.OTLPSpanExporter(endpoint=url if "://" in url else f"http://{url}")
