"""The custom metric families of inference callables (core/custom_metrics.py), as exposition families."""

from __future__ import annotations

import logging
from typing import Collection, List, Set

from pytriton.core.custom_metrics import HISTOGRAM, REGISTRY, sample_names
from pytriton.transport.metrics.exposition import Family
from pytriton.transport.metrics.latency import HistogramSnapshot, add_histogram

LOGGER = logging.getLogger(__name__)
_CLASHES_LOGGED: Set[str] = set()


def custom_families(taken: Collection[str]) -> List[Family]:
    """Every custom family, read now; one sharing a name with the server's families or their samples is left out.

    `taken`: the server's family and sample names. A family left out is logged once.
    """
    families = []
    for name, kind, description, samples in REGISTRY.snapshot():
        if not sample_names(name, kind).isdisjoint(taken):
            if name not in _CLASHES_LOGGED:
                _CLASHES_LOGGED.add(name)
                LOGGER.error("custom metric family '%s' is left out of /metrics: the server exports its own", name)
            continue
        family = Family(name, kind, description)
        for labels, value in samples:
            if kind == HISTOGRAM:
                bounds, counts, total, count = value
                add_histogram(family, labels, HistogramSnapshot(bounds, counts, count, total))
            else:
                family.add(labels, value)
        families.append(family)
    return families
