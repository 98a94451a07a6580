"""Prometheus text exposition format (version 0.0.4), written by hand to keep Triton's exact names."""

from __future__ import annotations

import math
from typing import Iterable, Iterator, List, Sequence, Tuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = Tuple[Tuple[str, str], ...]
# Integers below this print the same exactly and through `%.16g` (16 digits).
_EXACT_INT = 10**16


class Family:
    """One metric family: its HELP and TYPE lines and its samples."""

    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        """Create an empty family of a kind: counter, gauge, histogram or summary."""
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: List[Tuple[str, Labels, float]] = []

    def add(self, labels: Labels, value: float, suffix: str = "") -> None:
        """Add a sample; `suffix` names a histogram or summary part (`_count`, `_sum`, `_bucket`)."""
        self.samples.append((suffix, labels, value))

    def lines(self) -> Iterator[str]:
        """The sample lines, without HELP and TYPE."""
        for suffix, labels, value in self.samples:
            yield sample_line(self.name, suffix, labels, value)


def render(families: Iterable[Family]) -> bytes:
    """The whole exposition; families without samples are left out."""
    out: List[str] = []
    for family in families:
        body = list(family.lines())
        if not body:
            continue
        if family.help:  # prometheus-cpp writes no HELP line for an empty description (a custom family's)
            out.append(f"# HELP {family.name} {_escape_help(family.help)}\n")
        out.append(f"# TYPE {family.name} {family.kind}\n")
        out.extend(body)
    return "".join(out).encode()


def sample_line(name: str, suffix: str, labels: Labels, value: float) -> str:
    """One sample line, newline included."""
    return f"{name}{suffix}{format_labels(labels)} {format_value(value)}\n"


def format_labels(labels: Sequence[Tuple[str, str]]) -> str:
    """`{name="value",...}`, or nothing without labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in labels) + "}"


def format_value(value: float) -> str:
    """A sample value as prometheus-cpp writes Triton's: `%.16g` (`3`, `0.1`, `1e+16`, `-0`), `Nan`, `+Inf`, `-Inf`."""
    if type(value) is int and -_EXACT_INT < value < _EXACT_INT:
        return str(value)
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def _escape_label(value: str) -> str:
    """Escape a label value: backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    """Escape HELP text: backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")
