"""Custom metrics of inference callables, in the shape of Triton's Python backend (`pb_utils.MetricFamily`).

    from pytriton.metrics import MetricFamily

    family = MetricFamily("my_cache_hits", "Cache hits of my model", kind=MetricFamily.COUNTER)
    hits = family.Metric(labels={"cache": "embeddings"})
    hits.increment(1)

Families are exported on the metrics port with the server's own (`nv_*`) families. A metric created while a
model's callable runs, or anywhere in a `ProcessInstances` process, carries that model's `model` and
`version` labels (unless its labels name them); one created elsewhere carries only the labels given.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from pytriton.core.custom_metrics import COUNTER, GAUGE, HISTOGRAM, REGISTRY, FamilyState, Series
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonValidationError

__all__ = ["Metric", "MetricFamily"]


class Metric:
    """One labelled metric of a family: a counter, a gauge or a histogram, as the family's kind says."""

    __slots__ = ("_kind", "_name", "_series")

    def __init__(
        self,
        family: MetricFamily,
        labels: Optional[Mapping[str, str]] = None,
        buckets: Optional[Sequence[float]] = None,
    ) -> None:
        """The metric of `family` with `labels`; the same labels give the same metric. A histogram needs `buckets`."""
        self._series: Series = REGISTRY.series(family._state, labels, buckets)
        self._kind = family.kind
        self._name = family.name

    @property
    def labels(self) -> dict:  # type: ignore[type-arg]
        """Its labels, the model's included."""
        return dict(self._series.labels)

    def increment(self, value: float = 1.0) -> None:
        """Add `value` to a counter (never negative) or a gauge."""
        if self._kind == HISTOGRAM:
            self._refuse("increment")
        if type(value) is not float:
            value = self._number(value, "increment")
        if self._kind == COUNTER and value < 0:
            raise PyTritonValidationError(f"counter '{self._name}' cannot be incremented by a negative value ({value})")
        self._series.add(value)

    def set(self, value: float) -> None:
        """Set a gauge to `value`."""
        if self._kind != GAUGE:
            self._refuse("set")
        if type(value) is not float:
            value = self._number(value, "set")
        self._series.set(value)

    def observe(self, value: float) -> None:
        """Count one observation of a histogram."""
        if self._kind != HISTOGRAM:
            self._refuse("observe")
        if type(value) is not float:
            value = self._number(value, "observe")
        self._series.observe(value)

    def value(self) -> float:
        """A counter's or gauge's value, as this process counted it."""
        if self._kind == HISTOGRAM:
            self._refuse("value")
        return float(self._series.value)

    def _number(self, value: object, operation: str) -> float:
        """`value` as a float, or TypeError where Triton's `pb_utils` refuses it too (a str, None, a list...)."""
        kind = type(value)
        if isinstance(value, (str, bytes)) or not (hasattr(kind, "__float__") or hasattr(kind, "__index__")):
            raise TypeError(f"{operation}() of metric '{self._name}' takes a number, not {kind.__name__}")
        return float(value)  # type: ignore[arg-type]

    def _refuse(self, operation: str) -> None:
        raise PyTritonInvalidOperationError(f"metric '{self._name}' is a {self._kind}: it has no {operation}()")


class MetricFamily:
    """A metric family: a name, a description and a kind; its metrics differ in labels.

    Defining a family again with the same name and kind gives the same family (its first description
    stays); with another kind it is refused.
    """

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __init__(self, name: str, description: str, kind: str) -> None:
        """Define the family (PyTritonValidationError for an invalid name or kind, or a clash of kinds)."""
        self._state: FamilyState = REGISTRY.family(name, description, kind)

    @property
    def name(self) -> str:
        """The family's name."""
        return self._state.name

    @property
    def kind(self) -> str:
        """COUNTER, GAUGE or HISTOGRAM."""
        return self._state.kind

    @property
    def description(self) -> str:
        """The HELP text (the first definition's)."""
        return self._state.description

    def Metric(self, labels: Optional[Mapping[str, str]] = None, buckets: Optional[Sequence[float]] = None) -> Metric:
        """The family's metric with `labels` (the module doc says when `model` and `version` join them).

        A histogram needs `buckets`, its ascending upper bounds (+Inf is implied); other kinds take none.
        """
        return Metric(self, labels, buckets)
