"""NPU gauges for the metrics endpoint: only devices that loaded instances hold, never a
reason to import acl."""

from __future__ import annotations

import sys
import threading

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from npu.telemetry import npu_collector
from tests.support.npu_harness import InstanceThread, backend, prepare, rows


def samples(collector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_nothing_reported_and_acl_not_imported_without_npu_models(monkeypatch):
    for name in [n for n in sys.modules if n == "acl" or n.startswith("acl.")]:
        monkeypatch.delitem(sys.modules, name)
    registry = CollectorRegistry()
    registry.register(npu_collector())
    assert b"ascend_npu" not in generate_latest(registry)
    assert "acl" not in sys.modules


def test_memory_and_utilisation_per_open_device(acl_emu, tmp_path):
    acl_emu._emu.configure(memory_bytes=1 << 24)
    prepared = prepare(tmp_path, latency_ms={"fixed": 20})
    threads = [InstanceThread(f"npu{d}") for d in (0, 1)]
    instances = [backend(prepared, device=d, index=d) for d in (0, 1)]
    collector = npu_collector()
    try:
        for thread, instance in zip(threads, instances, strict=False):
            thread.run(instance.load)
        threads[0].run(instances[0].execute, {"INPUT0": rows(2)})
        values = samples(collector)  # scraped from this thread, which holds no context
        charged = {d: acl_emu._runtime.RT.devices[d].charged for d in (0, 1)}
        for d in (0, 1):
            label = (("device", str(d)),)
            assert values[("ascend_npu_memory_total_bytes", label)] == 1 << 24
            assert values[("ascend_npu_memory_used_bytes", label)] == charged[d] > 0
        busy = values[("ascend_npu_utilization", (("device", "0"), ("engine", "aicore")))]
        assert 0 < busy <= 1
        assert ("ascend_npu_utilization", (("device", "1"), ("engine", "vector"))) not in values

        registry = CollectorRegistry()
        registry.register(collector)
        text = generate_latest(registry).decode()
        assert 'ascend_npu_memory_used_bytes{device="0"}' in text

        acl_emu._emu.lose_device(1)  # a device that stops answering is left out
        assert {k[1][0] for k in samples(collector)} == {("device", "0")}

        threads[0].run(instances[0].unload)
        assert samples(collector) == {}
        threads[1].run(instances[1].unload)
        assert samples(collector) == {}
    finally:
        for thread in threads:
            thread.close()


def test_scrapes_while_the_instance_works(acl_emu, tmp_path):
    prepared = prepare(tmp_path, latency_ms={"fixed": 2})
    thread = InstanceThread("npu0")
    instance = backend(prepared)
    collector = npu_collector()
    stop = threading.Event()
    errors: list[BaseException] = []

    def scrape() -> None:
        while not stop.is_set():
            try:
                collector.collect()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    try:
        thread.run(instance.load)
        scraper = threading.Thread(target=scrape)
        scraper.start()
        for n in range(1, 9):
            out = thread.run(instance.execute, {"INPUT0": rows(n)})
            np.testing.assert_array_equal(out["OUTPUT0"], rows(n) * 2 + 1)
        stop.set()
        scraper.join()
        thread.run(instance.unload)
    finally:
        stop.set()
        thread.close()
    assert not errors
