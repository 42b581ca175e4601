"""NPU gauges for the metrics endpoint, read at scrape time from the devices instances have open
(in this process, and in the NPU executor processes, which read them on request).

A prometheus_client custom collector: with no NPU model loaded it yields nothing and never
imports `acl`. Memory comes from acl.rt.get_mem_info (HBM, falling back to DDR on parts
without HBM such as the 310P); utilisation from acl.rt.get_device_utilization_rate where the
binding has it. Temperature and power are not in pyACL: leave them to Huawei's npu-exporter.
Beside the gauges, ascend_npu_execution_timeouts_total counts the executions that did not
finish within their timeout (npu/deadline.py), per model and device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from npu import constants as K
from npu import deadline, device
from npu.errors import check

# pyACL's utilisation keys -> our `engine` label. memory_utilization is reserved (-1).
_ENGINES = {
    "cube_utilization": "aicore",
    "vector_utilization": "vector",
    "aicpu_utilization": "aicpu",
}


@dataclass
class DeviceReading:
    used_bytes: int | None = None
    total_bytes: int | None = None
    utilization: dict[str, float] = field(default_factory=dict)  # engine -> 0..1


def read_device(acl: ModuleType, device_id: int) -> DeviceReading:
    """Runs with the device's context current on this thread (device.for_each_open_device)."""
    reading = DeviceReading()
    for attr in (K.MEM_HBM, K.MEM_DDR):
        free, total, ret = acl.rt.get_mem_info(attr)
        check(acl, ret, "acl.rt.get_mem_info")  # a device that cannot answer is left out
        if total > 0:
            reading.used_bytes, reading.total_bytes = total - free, total
            break
    utilisation = getattr(acl.rt, "get_device_utilization_rate", None)
    if utilisation is not None:
        rates, ret = utilisation(device_id)
        if ret == 0:
            for key, engine in _ENGINES.items():
                value = rates.get(key, -1)
                if isinstance(value, (int, float)) and value >= 0:
                    reading.utilization[engine] = value / 100.0
    return reading


def _hang_family() -> CounterMetricFamily | None:
    counts = deadline.timeout_counts()
    if not counts:
        return None
    family = CounterMetricFamily(
        "ascend_npu_execution_timeouts",
        "NPU executions that did not finish within their timeout (the instance is then out of "
        "service)",
        labels=["model", "device"],
    )
    for (model, device_id), count in sorted(counts.items()):
        family.add_metric([model, str(device_id)], float(count))
    return family


class NpuCollector(Collector):
    """ascend_npu_memory_used_bytes / _total_bytes and ascend_npu_utilization, per device."""

    def __init__(self) -> None:
        self._remote: list[tuple[int, DeviceReading]] = []

    def describe(self) -> Iterable:
        return []  # names are only known at scrape; registration must not touch the device

    def read_remote(self) -> None:
        """Ask the executor processes (the server's devices) for their readings: blocking, and
        seconds long behind a load, so the metrics app runs it in a thread of its own before
        each render (server/observability/remote_reads.py); `collect` uses the last ones."""
        from npu.executor import client

        self._remote = client.readings()

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        readings = device.for_each_open_device(read_device)  # instances in this process
        seen = {device_id for device_id, _ in readings}
        readings += [r for r in self._remote if r[0] not in seen]
        hangs = _hang_family()
        if not readings:
            return [hangs] if hangs is not None else []
        used = GaugeMetricFamily(
            "ascend_npu_memory_used_bytes", "NPU device memory in use, in bytes", labels=["device"]
        )
        total = GaugeMetricFamily(
            "ascend_npu_memory_total_bytes",
            "NPU device memory available to applications, in bytes",
            labels=["device"],
        )
        util = GaugeMetricFamily(
            "ascend_npu_utilization",
            "NPU busy fraction (0..1) per engine: aicore, vector, aicpu",
            labels=["device", "engine"],
        )
        for device_id, reading in readings:
            label = str(device_id)
            if reading.total_bytes is not None:
                used.add_metric([label], float(reading.used_bytes or 0))
                total.add_metric([label], float(reading.total_bytes))
            for engine, value in sorted(reading.utilization.items()):
                util.add_metric([label, engine], value)
        families = [family for family in (used, total, util) if family.samples]
        return families + ([hangs] if hangs is not None else [])


def npu_collector() -> Collector:
    """The collector for server/observability/metrics.py to register once."""
    return NpuCollector()
