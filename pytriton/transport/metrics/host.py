"""CPU utilisation and memory of the host, read from /proc as Triton does (Linux only)."""

from __future__ import annotations

import logging
import pathlib
from typing import Dict, Optional, Tuple

LOGGER = logging.getLogger(__name__)

_KIB = 1024
# /proc/stat's aggregate line: user nice system idle iowait irq softirq steal ...
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_IDLE_FIELDS = (3, 4)


class HostMonitor:
    """Polled readings of /proc/stat and /proc/meminfo; utilisation is measured between two polls."""

    def __init__(self, proc: pathlib.Path = pathlib.Path("/proc")) -> None:
        """Prepare to read from a proc filesystem root."""
        self._proc = proc
        self._last_ticks: Optional[Tuple[int, int]] = None
        self.utilization = 0.0
        self.memory_total_bytes = 0
        self.memory_used_bytes = 0

    def start(self) -> bool:
        """Take the first readings; False where /proc cannot be read (not Linux), and nothing is reported."""
        try:
            self._last_ticks = self._read_ticks()
            self.memory_total_bytes, self.memory_used_bytes = self._read_memory()
        except (OSError, ValueError, KeyError, IndexError) as error:
            LOGGER.info("CPU metrics are not available: %s", error)
            return False
        return True

    def poll(self) -> None:
        """Update utilisation since the last poll and memory now; readings that fail are reported as 0."""
        try:
            ticks = self._read_ticks()
        except (OSError, ValueError, IndexError):
            self.utilization = 0.0
        else:
            self.utilization = _utilization(self._last_ticks, ticks)
            self._last_ticks = ticks
        try:
            self.memory_total_bytes, self.memory_used_bytes = self._read_memory()
        except (OSError, ValueError, KeyError):
            self.memory_total_bytes = self.memory_used_bytes = 0

    def _read_ticks(self) -> Tuple[int, int]:
        """Busy and idle jiffies of all CPUs together."""
        with open(self._proc / "stat", encoding="ascii") as stat:
            line = stat.readline()
        if not line.startswith("cpu "):
            raise ValueError("no aggregate cpu line in /proc/stat")
        fields = [int(field) for field in line.split()[1:]]
        return sum(fields[i] for i in _BUSY_FIELDS), sum(fields[i] for i in _IDLE_FIELDS)

    def _read_memory(self) -> Tuple[int, int]:
        """Total and used bytes; used is total minus available, as Triton reports it."""
        values: Dict[str, int] = {}
        with open(self._proc / "meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    values[name] = int(rest.split()[0]) * _KIB
        total, available = values["MemTotal"], values["MemAvailable"]
        return total, max(total - available, 0)


def _utilization(before: Optional[Tuple[int, int]], after: Tuple[int, int]) -> float:
    """Busy share of the jiffies between two readings, in [0, 1]."""
    if before is None:
        return 0.0
    busy = max(after[0] - before[0], 0)
    idle = max(after[1] - before[1], 0)
    return busy / (busy + idle) if busy + idle else 0.0
