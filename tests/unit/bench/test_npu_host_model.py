"""The NPU host model's arithmetic: each bound is the formula FINDINGS states."""

from __future__ import annotations

import pytest

from bench.studies.npu_host_model import (
    HTTP,
    Costs,
    Protocol,
    bounds,
    device_ms,
    gear,
    predict,
    report,
    split,
    with_measured,
)

FREE = Protocol("x", f_us=1.0, h_us=1.0, g_us=1.0, frontend_us_per_kb=0.0)


def test_the_gear_is_the_smallest_that_holds_the_batch() -> None:
    assert [gear(r) for r in (1, 3, 8, 9, 32)] == [1, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="largest gear 32"):
        gear(33)


def test_a_full_gear_32_batch_gives_the_device_only_rate_of_section_13() -> None:
    assert device_ms(32, Costs()) == pytest.approx(8.6)
    b = bounds(HTTP, Costs(), 150.0, cores=64, devices=1, n=1)
    assert b["device"] == pytest.approx(32 * 1000 / 8.6)  # 3,721 rows/s


def test_owner_loop_is_n_over_f_plus_n_minus_one_h() -> None:
    p = Protocol("p", f_us=90.0, h_us=70.0, g_us=75.0, frontend_us_per_kb=0.0)
    c = Costs(owner_us_per_kb=0.0)
    b = bounds(p, c, 0.0, cores=64, devices=8, n=4)
    assert b["owner loop"] == pytest.approx(4e6 / (90 + 3 * 70))
    assert b["frontend loops"] == pytest.approx(4e6 / 75)


def test_executor_bound_counts_per_batch_and_per_kb_host_work() -> None:
    c = Costs(executor_us_per_batch=1000.0, executor_us_per_kb=0.6, copies_per_kb_us=0.2, batch=32)
    b = bounds(FREE, c, 600.0, cores=64, devices=2, n=1)
    assert b["executor"] == pytest.approx(2 * 32 * 1e6 / (1000 + 32 * 600 * 0.8))


def test_with_free_host_work_the_devices_bind_and_scale_with_their_count() -> None:
    c = Costs(
        owner_us_per_kb=0.0, executor_us_per_batch=1.0, executor_us_per_kb=0.0, copies_per_kb_us=0.0
    )
    one = predict(FREE, c, 150.0, cores=16, devices=1)
    eight = predict(FREE, c, 150.0, cores=16, devices=8)
    assert one.binds == "device" and eight.binds == "device"
    assert eight.rate == pytest.approx(8 * one.rate)


def test_one_owner_caps_an_eight_device_host_below_its_devices_over_http() -> None:
    r = predict(HTTP, Costs(), 150.0, cores=64, devices=8)
    assert r.binds == "owner loop"
    assert r.rate < 1e6 / (HTTP.h_us + 0.3 * 150) < 8 * 3721


def test_the_report_has_the_four_tables() -> None:
    text = report()
    for head in ("HTTP, 150 KB", "gRPC, 150 KB", "HTTP, 600 KB", "gRPC, 600 KB"):
        assert head in text
    assert text.count("| 64 |") == 4


def test_splitting_eight_devices_into_servers_multiplies_the_owner_wall() -> None:
    one = split(HTTP, Costs(), 150.0, 64, 8, 1)
    four = split(HTTP, Costs(), 150.0, 64, 8, 4)
    assert one == pytest.approx(predict(HTTP, Costs(), 150.0, 64, 8).rate)
    assert four == pytest.approx(4 * predict(HTTP, Costs(), 150.0, 16, 2).rate)
    assert four > 3 * one
    with pytest.raises(ValueError, match="do not split into 3 servers"):
        split(HTTP, Costs(), 150.0, 64, 8, 3)


def test_the_report_section_uses_the_measured_f_h_g_and_skips_unmeasured() -> None:
    lines = with_measured({"http": (90.0, 70.0, 75.0), "grpc": (float("nan"),) * 3})
    rows = [line for line in lines if line.startswith("| HTTP |")]
    assert len(rows) == 2 and not any(line.startswith("| gRPC |") for line in lines)
    expected = predict(HTTP, Costs(), 150.0, 64, 8)
    assert rows[0].endswith(f"{expected.rate:,.0f} (N {expected.processes}, {expected.binds}) |")
