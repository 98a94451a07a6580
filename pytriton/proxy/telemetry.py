"""OpenTelemetry spans in inference callables: `traced_span(request, name)` opens a child of the request's span.

OpenTelemetry is optional: it is imported only when a request carries a span.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def traced_span(request: Any, span_name: str, **kwargs: Any) -> Iterator[None]:
    """A span named `span_name`, child of `request.span`, around the block; nothing when the request has no span.

    Args:
        request: a Request an inference callable got.
        span_name: name of the span.
        **kwargs: passed to the tracer's `start_as_current_span` (attributes, kind, ...).
    """
    span = getattr(request, "span", None)
    if span is None:
        yield
        return
    from opentelemetry import trace

    tracer = getattr(request, "tracer", None) or trace.get_tracer("pytriton")
    with trace.use_span(span, end_on_exit=False, record_exception=False):
        with tracer.start_as_current_span(span_name, **kwargs):
            yield
