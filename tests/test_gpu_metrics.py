"""GPU metrics: absent and silent without a GPU; Triton's families and labels from NVML readings where there is one.

NVML itself needs an NVIDIA driver, so the readings here come from a stand-in `pynvml` module with NVML's calls and
units (the exposition, labels, energy since start and CUDA_VISIBLE_DEVICES are this project's code under test); the
real NVML is read by `tests/test_gpu.py` on a GPU machine (`pytest -m gpu`).
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any, Callable, Dict, List

import pytest

from pytriton.runtime.options import resolve_options
from pytriton.transport.metrics.gpu import GpuMonitor
from pytriton.triton import Triton, TritonConfig
from tests.test_metrics import _bind_echo, sample, scrape

GPU_FAMILIES = {
    "nv_gpu_utilization": "gauge",
    "nv_gpu_memory_total_bytes": "gauge",
    "nv_gpu_memory_used_bytes": "gauge",
    "nv_gpu_power_usage": "gauge",
    "nv_gpu_power_limit": "gauge",
    "nv_energy_consumption": "counter",
}
UUIDS = ["GPU-11111111-aaaa-bbbb-cccc-000000000001", "GPU-22222222-aaaa-bbbb-cccc-000000000002"]


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


def fake_nvml(count: int = 2, init_error: bool = False) -> types.ModuleType:
    """A `pynvml` with NVML's calls and units: percent, bytes, milliwatts, millijoules since the driver loaded."""
    module = types.ModuleType("pynvml")
    energy_mj = [5_000_000.0 + 1000 * index for index in range(count)]
    calls: Dict[str, int] = {"init": 0, "shutdown": 0}

    def init() -> None:
        calls["init"] += 1
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def shutdown() -> None:
        calls["shutdown"] += 1

    def energy(handle: int) -> float:
        energy_mj[handle] += 2500.0  # 2.5 J more at each reading
        return energy_mj[handle]

    def power_limit(handle: int) -> float:
        if handle == 1:
            raise NotSupported("Not Supported")
        return 700_000.0

    module.__dict__.update(
        NVMLError=NVMLError,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda handle: UUIDS[handle],
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=40 + 10 * handle, memory=5),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=80 * 2**30, used=2**30 * (handle + 1)),
        nvmlDeviceGetPowerUsage=lambda handle: 123_456.0,
        nvmlDeviceGetPowerManagementLimit=power_limit,
        nvmlDeviceGetTotalEnergyConsumption=energy,
        calls=calls,
    )
    return module


def test_no_gpu_no_metrics_and_no_warnings(
    start_triton: Callable[..., Triton], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=True))  # no driver, on a GPU machine too
    caplog.set_level(logging.DEBUG)
    for allow in (None, True):
        families = scrape(start_triton(_bind_echo, allow_gpu_metrics=allow, metrics_interval_ms=10))
        assert not set(GPU_FAMILIES) & set(families)
        assert "nv_inference_request_success" in families
    louder = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not louder, [record.getMessage() for record in louder]
    assert sum("GPU metrics are not reported" in record.getMessage() for record in caplog.records) == 2


def test_allow_gpu_metrics_is_an_option_with_effect() -> None:
    assert resolve_options(TritonConfig()).metrics_settings.gpu_metrics
    assert resolve_options(TritonConfig(allow_gpu_metrics=True)).metrics_settings.gpu_metrics
    assert not resolve_options(TritonConfig(allow_gpu_metrics=False)).metrics_settings.gpu_metrics


def test_nvml_that_cannot_start_reports_nothing() -> None:
    nvml = fake_nvml(init_error=True)
    monitor = GpuMonitor(nvml)
    assert not monitor.start()
    assert all(not family.samples for family in monitor.families())
    none_visible = fake_nvml(count=0)
    assert not GpuMonitor(none_visible).start()
    assert none_visible.calls == {"init": 1, "shutdown": 1}


def test_readings_in_triton_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = fake_nvml()
    monitor = GpuMonitor(nvml)
    assert monitor.start()
    readings = dict(monitor.readings)
    assert list(readings) == UUIDS
    utilization, total, used, power, limit, energy = readings[UUIDS[0]]
    assert (utilization, total, used, power, limit) == (0.4, 80 * 2**30, 2**30, 123.456, 700.0)
    assert energy == 2.5  # joules since start, not since the driver loaded
    assert readings[UUIDS[1]][4] == 0.0  # a reading the GPU does not support is 0, as Triton reports it
    monitor.poll()
    assert dict(monitor.readings)[UUIDS[0]][5] == 5.0
    monitor.stop()
    assert nvml.calls["shutdown"] == 1


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", [UUIDS[1]]),
        ("1,0", [UUIDS[1], UUIDS[0]]),
        ("GPU-22222222", [UUIDS[1]]),
        ("0,7,1", [UUIDS[0]]),  # CUDA stops at the first device it cannot use
        ("", []),
        ("-1", []),
    ],
)
def test_cuda_visible_devices_choose_the_gpus(
    monkeypatch: pytest.MonkeyPatch, visible: str, expected: List[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monitor = GpuMonitor(fake_nvml())
    assert monitor.start() == bool(expected)
    assert [uuid for uuid, _ in monitor.readings] == expected


def test_served_with_triton_names_and_labels(
    start_triton: Callable[..., Triton], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    families = scrape(start_triton(_bind_echo, metrics_interval_ms=10))
    for name, kind in GPU_FAMILIES.items():
        assert families[name].type == kind
        assert sorted(sample.labels["gpu_uuid"] for sample in families[name].samples) == UUIDS
    assert sample(families, "nv_gpu_utilization", gpu_uuid=UUIDS[1]) == 0.5
    assert sample(families, "nv_gpu_memory_used_bytes", gpu_uuid=UUIDS[1]) == 2 * 2**30
    assert sample(families, "nv_gpu_power_usage", gpu_uuid=UUIDS[0]) == 123.456
    assert sample(families, "nv_energy_consumption", gpu_uuid=UUIDS[0]) >= 2.5


def test_allow_gpu_metrics_false_reads_no_gpu(
    start_triton: Callable[..., Triton], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml: Any = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    families = scrape(start_triton(_bind_echo, allow_gpu_metrics=False))
    assert not set(GPU_FAMILIES) & set(families)
    assert nvml.calls["init"] == 0
