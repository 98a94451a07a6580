"""The Prometheus metrics endpoint: Triton's metric names and labels, read from the engine at scrape time."""

from pytriton.transport.metrics.frontend import MetricsFrontend

__all__ = ["MetricsFrontend"]
