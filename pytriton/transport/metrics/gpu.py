"""GPU utilisation, memory, power and energy through NVML (nvidia-ml-py), with Triton's names and labels.

Triton reads these through DCGM; NVML gives the same readings. Where nvidia-ml-py is not installed, NVML cannot
be loaded or no GPU is visible, `start` says so once in the debug log and no GPU metric is reported.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

from pytriton.transport.metrics.exposition import Family

LOGGER = logging.getLogger(__name__)

_MILLI = 1000.0
# (family, kind, help, reading index): Triton's families, in the order Triton lists them.
_FAMILIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", 0),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", 1),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", 2),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", 3),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", 4),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started", 5),
)
FAMILY_NAMES = tuple(name for name, _, _, _ in _FAMILIES)
# utilization, memory total, memory used, power (W), power limit (W), energy since start (J)
Reading = Tuple[float, float, float, float, float, float]


class GpuMonitor:
    """Polled NVML readings of the GPUs this process may use (CUDA_VISIBLE_DEVICES), labelled by `gpu_uuid`."""

    def __init__(self, nvml: Optional[Any] = None) -> None:
        """Prepare to read through an NVML binding (by default `pynvml`, from nvidia-ml-py, imported at start)."""
        self._nvml: Any = nvml
        self._devices: List[Tuple[str, Any]] = []
        self._energy_at_start_mj: List[float] = []
        self.readings: Sequence[Tuple[str, Reading]] = ()

    def start(self) -> bool:
        """Initialise NVML and find the GPUs; False (and nothing reported) where there are none. Blocks briefly."""
        if self._nvml is None:
            try:
                import pynvml  # an optional extra: pytriton[gpu]
            except ImportError:
                LOGGER.debug("GPU metrics are not reported: nvidia-ml-py is not installed (the gpu extra)")
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            LOGGER.debug("GPU metrics are not reported: NVML is not available (%s)", error)
            return False
        try:
            self._devices = _visible_devices(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
        except nvml.NVMLError as error:
            LOGGER.debug("GPU metrics are not reported: NVML lists no GPUs (%s)", error)
            self._devices = []
        if not self._devices:
            nvml.nvmlShutdown()
            return False
        energy = nvml.nvmlDeviceGetTotalEnergyConsumption
        self._energy_at_start_mj = [_read(energy, handle) for _, handle in self._devices]
        self.poll()
        LOGGER.debug("GPU metrics of %s", ", ".join(uuid for uuid, _ in self._devices))
        return True

    def poll(self) -> None:
        """Read every GPU now (blocking NVML calls: run it off the event loop); a failed reading is 0."""
        nvml = self._nvml
        readings = []
        for (uuid, handle), energy_at_start in zip(self._devices, self._energy_at_start_mj):
            utilization = _read(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle) / 100
            memory = _read_memory(nvml, handle)
            power = _read(nvml.nvmlDeviceGetPowerUsage, handle) / _MILLI
            limit = _read(nvml.nvmlDeviceGetPowerManagementLimit, handle) / _MILLI
            energy = max(_read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle) - energy_at_start, 0.0) / _MILLI
            readings.append((uuid, (utilization, memory[0], memory[1], power, limit, energy)))
        self.readings = readings  # one assignment: a scrape on the loop sees the old readings or the new ones

    def stop(self) -> None:
        """Release NVML."""
        if self._devices:
            self._devices = []
            self._nvml.nvmlShutdown()

    def families(self) -> List[Family]:
        """The six GPU families, as last polled."""
        readings = self.readings
        families = []
        for name, kind, help_text, index in _FAMILIES:
            family = Family(name, kind, help_text)
            for uuid, reading in readings:
                family.add((("gpu_uuid", uuid),), reading[index])
            families.append(family)
        return families


def _visible_devices(nvml: Any, visible: Optional[str]) -> List[Tuple[str, Any]]:
    """(uuid, handle) of each GPU that CUDA_VISIBLE_DEVICES lets this process use (every GPU when it is unset).

    An index there is taken as NVML's (PCI bus order, as with CUDA_DEVICE_ORDER=PCI_BUS_ID); a UUID or its prefix
    names the GPU itself.
    """
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        devices.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
    if visible is None:
        return devices
    chosen: List[Tuple[str, Any]] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            found = [devices[int(entry)]] if int(entry) < len(devices) else []
        else:
            found = [device for device in devices if entry and device[0].startswith(entry)]
        if not found:  # CUDA stops at the first entry it cannot use
            break
        chosen.extend(device for device in found if device not in chosen)
    return chosen


def _read(read: Callable[[Any], Any], handle: Any) -> float:
    """One NVML reading, 0 when the GPU does not support it or it fails."""
    try:
        return float(read(handle))
    except Exception:  # noqa: BLE001  (NVMLError_NotSupported and kin: Triton reports such readings as 0)
        return 0.0


def _read_memory(nvml: Any, handle: Any) -> Tuple[float, float]:
    """Total and used device memory in bytes."""
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:  # noqa: BLE001
        return 0.0, 0.0
    return float(memory.total), float(memory.used)
