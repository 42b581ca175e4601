"""Throughput against host cores for an NPU host (issue 26, item 6), from measured costs.

Nothing is run: the costs are arguments whose defaults are the figures recorded in
bench/FINDINGS.md (section 9's frontend-process model: f, h, g; section 16: µs per KB;
section 13: the 310P ResNet50 timing). The model says which resource binds so that a host
can be sized before it is bought: frontend loops, the owner's loop, the executors, the
total cores, or the devices.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

GEARS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Protocol:
    """Per-request CPU of one protocol, µs (FINDINGS section 9) and µs per KB (section 16)."""

    name: str
    f_us: float  # one-process server: decode + owner work, per request
    h_us: float  # owner's CPU per handed-over request
    g_us: float  # a frontend process's CPU per request
    frontend_us_per_kb: float  # body assembly / parse and the answer's build, per KB


HTTP = Protocol("HTTP", f_us=90.0, h_us=70.0, g_us=75.0, frontend_us_per_kb=0.66)
GRPC = Protocol("gRPC", f_us=290.0, h_us=130.0, g_us=270.0, frontend_us_per_kb=1.2)


@dataclass(frozen=True)
class Costs:
    """The owner's, executor's and device's costs; defaults as recorded in FINDINGS."""

    owner_us_per_kb: float = 0.3  # gather into the slab and d2h into shared memory
    executor_us_per_batch: float = (
        1000.0  # estimate (section 16 run 2 residual), not measured alone
    )
    executor_us_per_kb: float = 0.6  # section 16: whole tree minus server process (emulator)
    copies_per_kb_us: float = 0.2  # one h2d copy at the emulator's 5 GB/s
    device_base_ms: float = 2.2  # 310P ResNet50: 2.2 ms + 0.2 ms per row of the gear
    device_ms_per_row: float = 0.2
    batch: int = 32  # rows per batch when the devices are saturated


def gear(rows: int) -> int:
    """The smallest gear that holds `rows` (the .om pads up to it)."""
    for g in GEARS:
        if rows <= g:
            return g
    raise ValueError(f"batch {rows} exceeds the largest gear {GEARS[-1]}")


def device_ms(rows: int, c: Costs) -> float:
    """Device time of one batch, ms."""
    return c.device_base_ms + c.device_ms_per_row * gear(rows)


def executor_ms(rows: int, kb: float, c: Costs) -> float:
    """One device's executor time per batch, ms: it is one process, its host work serial."""
    per_row = kb * (c.executor_us_per_kb + c.copies_per_kb_us)
    return (c.executor_us_per_batch + rows * per_row) / 1000.0


@dataclass(frozen=True)
class Prediction:
    """Served inferences/s, the frontend processes chosen and the resource that binds."""

    rate: float
    processes: int
    binds: str
    bounds: dict[str, float]


def bounds(p: Protocol, c: Costs, kb: float, cores: int, devices: int, n: int) -> dict[str, float]:
    """Each resource's ceiling, inferences/s, with `n` accepting processes."""
    d = p.frontend_us_per_kb * kb
    o = c.owner_us_per_kb * kb
    f = p.f_us + d + o
    h = p.h_us + o
    g = p.g_us + d
    b = c.batch
    e_ms = executor_ms(b, kb, c)
    t_ms = device_ms(b, c)
    per_inf_us = (f + (n - 1) * (h + g)) / n + e_ms * 1000.0 / b
    out = {
        "owner loop": n * 1e6 / (f + (n - 1) * h),
        "device": devices * b * 1000.0 / t_ms,
        "executor": devices * b * 1000.0 / e_ms,
        "cores": cores * 1e6 / per_inf_us,
    }
    if n > 1:
        out["frontend loops"] = n * 1e6 / g
    return out


def predict(p: Protocol, c: Costs, kb: float, cores: int, devices: int) -> Prediction:
    """The best number of frontend processes (1..cores less one per executor) and its rate."""
    best: Prediction | None = None
    top = max(1, cores - devices)  # each device's executor keeps a core of its own
    for n in range(1, top + 1):
        bs = bounds(p, c, kb, cores, devices, n)
        binds = min(bs, key=bs.__getitem__)
        rate = bs[binds]
        if best is None or rate > best.rate * 1.01:
            best = Prediction(rate, n, binds, bs)
    assert best is not None
    if best.processes == top and best.binds in ("owner loop", "frontend loops"):
        more = bounds(p, c, kb, cores + 1, devices, top + 1)
        if min(more.values()) > best.rate * 1.01:  # another core would buy another process
            best = replace(best, binds="cores")
    return best


def split(p: Protocol, c: Costs, kb: float, cores: int, devices: int, servers: int) -> float:
    """Served rate of `servers` independent servers, each with its share of cores and devices.

    One owner loop per server is the wall past a few devices; separate servers (each seeing
    its own devices) multiply it.
    """
    if devices % servers or cores < servers:
        raise ValueError(f"{devices} devices and {cores} cores do not split into {servers} servers")
    return servers * predict(p, c, kb, cores // servers, devices // servers).rate


def table(
    p: Protocol, c: Costs, kb: float, cores: tuple[int, ...], devices: tuple[int, ...]
) -> list[str]:
    """A markdown table: one row per core count, one column per device count."""
    lines = [
        f"{p.name}, {kb:g} KB requests: inf/s (frontend processes N, binding resource)",
        "",
        "| cores | " + " | ".join(f"{d} NPU" for d in devices) + " |",
        "|---|" + "---|" * len(devices),
    ]
    for k in cores:
        cells = []
        for d in devices:
            r = predict(p, c, kb, k, d)
            cells.append(f"{r.rate:,.0f} (N {r.processes}, {r.binds})")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def report(c: Costs | None = None) -> str:
    """The four tables of FINDINGS: UINT8 150 KB and FP32 600 KB, HTTP and gRPC."""
    c = c or Costs()
    out: list[str] = []
    for kb in (150.0, 600.0):
        for p in (HTTP, GRPC):
            out += table(p, c, kb, (4, 8, 16, 32, 64), (1, 2, 4, 8)) + [""]
    out += [
        "8 NPUs as S servers (each its share of the cores and devices): inf/s at 32 / 64 cores",
        "",
        "| request | proto | S 1 | S 2 | S 4 | S 8 | devices alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for kb in (150.0, 600.0):
        for p in (HTTP, GRPC):
            cells = [
                " / ".join(f"{split(p, c, kb, k, 8, s):,.0f}" for k in (32, 64))
                for s in (1, 2, 4, 8)
            ]
            alone = 8 * c.batch * 1000.0 / device_ms(c.batch, c)
            out.append(f"| {kb:g} KB | {p.name} | " + " | ".join(cells) + f" | {alone:,.0f} |")
    return "\n".join(out)


def with_measured(fhg: dict[str, tuple[float, float, float]], c: Costs | None = None) -> list[str]:
    """The RESULTS.md section: 8-NPU predictions with this run's f, h, g (bench/handover_cost.py).

    `fhg` maps "http"/"grpc" to (f, h, g) µs; the per-KB, executor and device costs stay the
    FINDINGS defaults, since this run measures none of them.
    """
    c = c or Costs()
    base = {"http": HTTP, "grpc": GRPC}
    cores = (4, 8, 16, 32, 64)
    lines = [
        "## An 8-NPU host from these costs (bench/studies/npu_host_model.py)",
        "",
        "A calculation, not a measurement: f, h and g from the table above, the per-KB, "
        "executor and 310P ResNet50 device costs as recorded in bench/FINDINGS.md. Inferences/s "
        "with the best number of frontend processes N, and the resource that binds.",
        "",
        "| protocol | request | " + " | ".join(f"{k} cores" for k in cores) + " |",
        "|---|---|" + "---|" * len(cores),
    ]
    for key, (f, h, g) in sorted(fhg.items()):
        if key not in base or any(v != v for v in (f, h, g)):  # unknown protocol or NaN
            continue
        p = replace(base[key], f_us=f, h_us=h, g_us=g)
        for kb in (150.0, 600.0):
            cells = []
            for k in cores:
                r = predict(p, c, kb, k, 8)
                cells.append(f"{r.rate:,.0f} (N {r.processes}, {r.binds})")
            lines.append(f"| {p.name} | {kb:g} KB | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    """Print the tables; every cost can be replaced by a figure measured elsewhere."""
    ap = argparse.ArgumentParser(description=__doc__)
    for field, default in vars(Costs()).items():
        ap.add_argument("--" + field.replace("_", "-"), type=type(default), default=default)
    args = ap.parse_args()
    c = replace(Costs(), **{k: getattr(args, k) for k in vars(Costs())})
    print(report(c))


if __name__ == "__main__":
    main()
