"""Metric families that inference callables define and update, exported with the server's own on /metrics.

One registry per process (`REGISTRY`), as Triton's Python backend has one per server. An update takes the
registry's lock (uncontended: no syscall) and adds a number. In an instance process (`start_shipping`)
each updated series also remembers what changed since it was last shipped; `take_updates` hands that over
(plain tuples, cheap to pickle) and the server's `apply_updates` adds it to its own registry, so that
counts stay exact whichever process made them.

A series created while a model's callable runs (`model_scope`), or anywhere in an instance process, gets
that model's `model` and `version` labels unless it names them itself.
"""

from __future__ import annotations

import bisect
import contextvars
import logging
import math
import re
import threading
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonValidationError

LOGGER = logging.getLogger(__name__)

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

LabelPairs = Tuple[Tuple[str, str], ...]
# What one series changed since it was last shipped: (family name, kind, description, labels, buckets, change).
# The change is a counter's delta, a gauge's (value set or None, delta after it), a histogram's
# (per-bucket count deltas, +Inf last; sum delta; count delta).
Update = Tuple[str, str, str, LabelPairs, Optional[Tuple[float, ...]], Any]

# (model name, version) of the callable running in this thread or task.
_MODEL: contextvars.ContextVar[Optional[Tuple[str, str]]] = contextvars.ContextVar("pytriton_model", default=None)
# The scope's variable itself, for a path that sets it in a context of its own (core/instances.call_in_scope).
MODEL_SCOPE = _MODEL
# The model an instance process serves: every series made in it is that model's.
_PROCESS_MODEL: Optional[Tuple[str, str]] = None


def model_scope(name: str, version: str) -> contextvars.Token[Optional[Tuple[str, str]]]:
    """Mark the current thread or task as running model `name` version `version`; reset with the token."""
    return _MODEL.set((name, version))


def stay_in_model_scope(model: Tuple[str, str]) -> None:
    """Mark the current thread as running `model` from now on (an instance's own thread: no reset needed)."""
    if _MODEL.get() is not model:
        _MODEL.set(model)


def end_model_scope(token: contextvars.Token[Optional[Tuple[str, str]]]) -> None:
    """Undo `model_scope` (a generator closed from another context leaves that context's scope as it is)."""
    try:
        _MODEL.reset(token)
    except ValueError:
        pass


def current_model() -> Optional[Tuple[str, str]]:
    """(name, version) of the model whose callable runs here, if any."""
    found = _MODEL.get()
    return found if found is not None else _PROCESS_MODEL


class Series:
    """One labelled metric of a family; updated under the registry's lock."""

    __slots__ = (
        "_bounds",
        "_counts",
        "_pending_counts",
        "_pending_delta",
        "_pending_set",
        "_registry",
        "count",
        "family",
        "labels",
        "total",
        "value",
    )

    def __init__(
        self, registry: Registry, family: FamilyState, labels: LabelPairs, bounds: Optional[Tuple[float, ...]]
    ) -> None:
        """An empty series; `bounds` are a histogram's bucket upper bounds (+Inf implied)."""
        self._registry = registry
        self.family = family
        self.labels = labels
        self.value = 0.0
        self._bounds: Tuple[float, ...] = bounds or ()
        self._counts = [0] * (len(self._bounds) + 1)
        self.count = 0
        self.total = 0.0
        self._pending_delta = 0.0
        self._pending_set: Optional[float] = None
        self._pending_counts: Optional[List[int]] = None

    @property
    def bounds(self) -> Tuple[float, ...]:
        """A histogram's bucket upper bounds, +Inf left out."""
        return self._bounds

    def add(self, delta: float) -> None:
        """Add to a counter or gauge."""
        registry = self._registry
        with registry.lock:
            self.value += delta
            if registry.shipping:
                self._pending_delta += delta
                registry.dirty[id(self)] = self

    def set(self, value: float) -> None:
        """Set a gauge."""
        registry = self._registry
        with registry.lock:
            self.value = value
            if registry.shipping:
                self._pending_set = value
                self._pending_delta = 0.0
                registry.dirty[id(self)] = self

    def observe(self, value: float) -> None:
        """Count one observation of a histogram."""
        index = bisect.bisect_left(self._bounds, value)
        registry = self._registry
        with registry.lock:
            self._counts[index] += 1
            self.count += 1
            self.total += value
            if registry.shipping:
                pending = self._pending_counts
                if pending is None:
                    pending = self._pending_counts = [0] * len(self._counts)
                pending[index] += 1
                self._pending_delta += value
                registry.dirty[id(self)] = self

    def add_observations(self, counts: Sequence[int], total: float, count: int) -> None:
        """Add observations counted elsewhere (an instance process's), bucket by bucket."""
        with self._registry.lock:
            for index, added in enumerate(counts):
                self._counts[index] += added
            self.count += count
            self.total += total

    def histogram_state(self) -> Tuple[Tuple[float, ...], List[int], float, int]:
        """A copy of a histogram's (bounds, count per bucket with +Inf last, sum, count); the lock held."""
        return self._bounds, list(self._counts), self.total, self.count

    def pend_all(self) -> None:
        """Count everything so far as changed since the last shipping (shipping starts; the lock held)."""
        if self.family.kind == HISTOGRAM:
            self._pending_counts = list(self._counts)
            self._pending_delta = self.total
        elif self.family.kind == GAUGE:
            self._pending_set = self.value
            self._pending_delta = 0.0
        else:
            self._pending_delta = self.value

    def take_update(self) -> Update:
        """What changed since the last call (the registry's lock held), as an Update; resets it."""
        family = self.family
        change: Any
        if family.kind == HISTOGRAM:
            pending = self._pending_counts or [0] * len(self._counts)
            change = (pending, self._pending_delta, sum(pending))
            self._pending_counts = None
        elif family.kind == GAUGE:
            change = (self._pending_set, self._pending_delta)
            self._pending_set = None
        else:
            change = self._pending_delta
        self._pending_delta = 0.0
        bounds = self._bounds if family.kind == HISTOGRAM else None
        return (family.name, family.kind, family.description, self.labels, bounds, change)


class FamilyState:
    """A metric family: its name, kind and description, and its series by labels."""

    __slots__ = ("description", "kind", "name", "series")

    def __init__(self, name: str, description: str, kind: str) -> None:
        """An empty family."""
        self.name = name
        self.description = description
        self.kind = kind
        self.series: Dict[LabelPairs, Series] = {}


class Registry:
    """Every custom metric family of this process."""

    def __init__(self) -> None:
        """An empty registry; it ships nothing until `start_shipping`."""
        self.lock = threading.Lock()
        self.families: Dict[str, FamilyState] = {}
        self.shipping = False
        self.dirty: Dict[int, Series] = {}
        self._refused: Set[str] = set()

    def family(self, name: str, description: str, kind: str) -> FamilyState:
        """The family of that name, made now if new; an existing one of another kind is refused."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise PyTritonValidationError(
                f"invalid metric family name {name!r}: it must match [a-zA-Z_:][a-zA-Z0-9_:]* (Prometheus' rule)"
            )
        if kind not in KINDS:
            raise PyTritonValidationError(
                f"invalid metric family kind {kind!r} for '{name}': use MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        if not isinstance(description, str):
            raise PyTritonValidationError(f"the description of metric family '{name}' must be a str")
        if not _encodes(description):
            raise PyTritonValidationError(
                f"the description of metric family '{name}' must be text UTF-8 can encode (no lone surrogates): "
                f"{description!r}"
            )
        with self.lock:
            found = self.families.get(name)
            if found is None:
                clash = self._clash(name, kind)
                if clash is None:
                    found = self.families[name] = FamilyState(name, description, kind)
        if found is None:
            assert clash is not None
            raise PyTritonValidationError(
                f"metric family '{name}' ({kind}) would write samples named like those of {clash.kind} "
                f"'{clash.name}' ({', '.join(sorted(sample_names(name, kind) & sample_names(clash.name, clash.kind)))})"
                ": Prometheus would keep one of them; name it otherwise"
            )
        if found.kind != kind:
            raise PyTritonValidationError(
                f"metric family '{name}' already exists as a {found.kind}; it cannot be defined again as a {kind}"
            )
        return found

    def _clash(self, name: str, kind: str) -> Optional[FamilyState]:
        """A family of another name that a new one's samples would share a name with (histogram `x`, `x_count`)."""
        names = sample_names(name, kind)
        for family in self.families.values():
            if not names.isdisjoint(sample_names(family.name, family.kind)):
                return family
        return None

    def series(
        self,
        family: FamilyState,
        labels: Optional[Mapping[str, str]],
        buckets: Optional[Sequence[float]],
        model_labels: bool = True,
    ) -> Series:
        """The series of a family with these labels (and the model's unless told not to), made now if new."""
        pairs = _label_pairs(family, labels, model_labels)
        bounds = _bounds(family, buckets)
        with self.lock:
            found = family.series.get(pairs)
            if found is None:
                found = family.series[pairs] = Series(self, family, pairs, bounds)
                if self.shipping:  # the server shows it at 0 before its first update, as Triton does
                    self.dirty[id(found)] = found
        if found.bounds != (bounds or ()):
            raise PyTritonValidationError(
                f"metric '{family.name}' with labels {dict(pairs)} already exists with buckets {list(found.bounds)}"
            )
        return found

    def start_shipping(self, model: Optional[Tuple[str, str]]) -> None:
        """Keep updates to ship to a server; an instance process of `model`: series made here are that model's.

        A RemoteTriton process (`model` None) serves several models: its series carry the model of the callable
        that made them (its instance threads' scope), if any.
        """
        global _PROCESS_MODEL
        if model is not None:
            _PROCESS_MODEL = model
        with self.lock:
            if self.shipping:
                return
            self.shipping = True
            for family in self.families.values():
                for series in family.series.values():
                    series.pend_all()  # what was counted before shipping started is shipped too
                    self.dirty[id(series)] = series

    def take_updates(self) -> List[Update]:
        """What changed since the last call, for the server (empty when nothing did)."""
        if not self.dirty:
            return []
        with self.lock:
            dirty, self.dirty = self.dirty, {}
            return [series.take_update() for series in dirty.values()]

    def apply_updates(self, updates: Sequence[Update]) -> None:
        """Add what an instance process changed; a family that clashes with one here is logged once and left out."""
        for name, kind, description, labels, bounds, change in updates:
            series = self._known_series(name, kind, labels, bounds)
            if series is None:
                try:
                    series = self.series(self.family(name, description, kind), dict(labels), bounds, False)
                except PyTritonValidationError as error:
                    if name not in self._refused:
                        self._refused.add(name)
                        LOGGER.error("custom metric from an instance process left out: %s", error)
                    continue
            if kind == HISTOGRAM:
                counts, total, count = change
                series.add_observations(counts, total, count)
            elif kind == GAUGE:
                value_set, delta = change
                if value_set is not None:
                    series.set(value_set)
                series.add(delta)
            else:
                series.add(change)

    def _known_series(
        self, name: str, kind: str, labels: LabelPairs, bounds: Optional[Tuple[float, ...]]
    ) -> Optional[Series]:
        """The series an update names when it exists here as the update has it (the usual case: no checks again)."""
        family = self.families.get(name)
        if family is None or family.kind != kind:
            return None
        series = family.series.get(labels)
        if series is None or series.bounds != (bounds or ()):
            return None
        return series

    def snapshot(self) -> List[Tuple[str, str, str, List[Tuple[LabelPairs, Any]]]]:
        """Each family as (name, kind, description, [(labels, value)]); histograms: (bounds, counts, sum, count)."""
        with self.lock:
            families = []
            for family in self.families.values():
                samples: List[Tuple[LabelPairs, Any]] = []
                for series in family.series.values():
                    if family.kind == HISTOGRAM:
                        samples.append((series.labels, series.histogram_state()))
                    else:
                        samples.append((series.labels, series.value))
                families.append((family.name, family.kind, family.description, samples))
            return families


def sample_names(name: str, kind: str) -> FrozenSet[str]:
    """The names a family goes by on /metrics: its own, and a histogram's samples' (`_count`, `_sum`, `_bucket`)."""
    if kind == HISTOGRAM:
        return frozenset((name, f"{name}_count", f"{name}_sum", f"{name}_bucket"))
    return frozenset((name,))


def _label_pairs(family: FamilyState, labels: Optional[Mapping[str, str]], model_labels: bool) -> LabelPairs:
    """Checked labels, with the current model's `model` and `version` unless given, in a stable order."""
    given: Dict[str, str] = {}
    if labels is not None:
        if not isinstance(labels, Mapping):
            raise PyTritonValidationError(f"labels of metric '{family.name}' must be a dict of str to str")
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL.match(key) or key.startswith("__"):
                raise PyTritonValidationError(
                    f"invalid label name {key!r} of metric '{family.name}': it must match [a-zA-Z_][a-zA-Z0-9_]* "
                    "and not start with '__'"
                )
            if not isinstance(value, str):
                raise PyTritonValidationError(
                    f"label '{key}' of metric '{family.name}' must have a str value, not {type(value).__name__}"
                )
            if not _encodes(value):
                raise PyTritonValidationError(
                    f"label '{key}' of metric '{family.name}' must have a value UTF-8 can encode (no lone "
                    f"surrogates): {value!r}"
                )
            given[key] = value
    if family.kind == HISTOGRAM and "le" in given:
        raise PyTritonValidationError(f"label 'le' of histogram '{family.name}' is reserved for its buckets")
    model = current_model() if model_labels else None
    if model is not None:
        given.setdefault("model", model[0])
        given.setdefault("version", model[1])
    return tuple(sorted(given.items()))


def _encodes(text: str) -> bool:
    """Whether UTF-8 encodes `text` (/metrics is UTF-8: one lone surrogate, as `os.fsdecode` makes, fails scrapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bounds(family: FamilyState, buckets: Optional[Sequence[float]]) -> Optional[Tuple[float, ...]]:
    """A histogram's checked bucket bounds; None for other kinds (which take none)."""
    if family.kind != HISTOGRAM:
        if buckets is not None:
            raise PyTritonInvalidOperationError(
                f"metric '{family.name}' is a {family.kind}: buckets are for histograms"
            )
        return None
    if buckets is None:
        raise PyTritonValidationError(f"histogram '{family.name}' needs buckets (a list of ascending upper bounds)")
    try:
        bounds = tuple(float(bound) for bound in buckets)
    except (TypeError, ValueError):
        raise PyTritonValidationError(f"buckets of histogram '{family.name}' must be numbers: {buckets!r}") from None
    if any(math.isnan(bound) for bound in bounds) or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise PyTritonValidationError(
            f"buckets of histogram '{family.name}' must be strictly ascending numbers: {list(buckets)!r}"
        )
    if bounds and math.isinf(bounds[-1]) and bounds[-1] > 0:
        bounds = bounds[:-1]  # +Inf is always there
    return bounds


REGISTRY = Registry()
