"""Mean GPU utilisation over a measured window, sampled through NVML (pytriton's own GPU metrics reader)."""

from __future__ import annotations

import threading
import time
from typing import List, Optional

from pytriton.transport.metrics.gpu import GpuMonitor


class GpuSampler:
    """Samples nv_gpu_utilization's reading every 0.2 s between start and stop; None where there is no GPU."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self._monitor: Optional[GpuMonitor] = GpuMonitor()
        if not self._monitor.start():
            self._monitor = None
        self._interval_s = interval_s
        self._samples: List[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, begin: float = 0.0, end: float = float("inf")) -> None:
        """Sample from now (or from the wall-clock time `begin`) until `stop` (or the wall-clock time `end`)."""
        if self._monitor is None:
            return
        self._samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, args=(begin, end), daemon=True)
        self._thread.start()

    def stop(self) -> Optional[float]:
        """Stop sampling; the mean utilisation of the GPUs in [0, 1], None without a GPU."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        return sum(self._samples) / len(self._samples) if self._samples else None

    def _sample(self, begin: float, end: float) -> None:
        monitor = self._monitor
        assert monitor is not None
        if self._stop.wait(max(begin - time.time(), 0.0)):
            return
        while not self._stop.wait(self._interval_s) and time.time() < end:
            monitor.poll()
            readings = [reading[0] for _, reading in monitor.readings]
            if readings:
                self._samples.append(sum(readings) / len(readings))
