"""The machine description and bench/RESULTS.md: tables, ratios and target verdicts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench import cpu_side_by_side, handover_cost, kserve_peer
from bench.machine import portable
from bench.offline import Latency, Throughput
from bench.served import RETRY_FLAGS, Point
from bench.studies import npu_host_model

# Targets from issues #4 and #12 (measured here, never asserted in a unit test).
RATIO_TARGET = 0.8  # served/offline throughput, dynamic batching, concurrency 32
RATIO_CONCURRENCY = 32
ADDED_P50_TARGET_US = 500.0  # concurrency 1: served p50 - direct p50 (simple, py_add)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Results:
    machine: dict[str, str]
    commands: list[str]  # how the run was started, then the server command
    offline: dict[str, list[Throughput]]  # model file (its model name) -> batch 1..64
    offline_of: dict[str, str]  # served model name -> key in `offline` (same model file)
    direct: Latency  # simple, batch 1, direct session.run
    served: list[Point]  # every throughput point: target, reference and fast models
    latency: list[Point]  # concurrency 1: simple, and the Python model (see `directs`)
    target_models: dict[str, str]  # "on"/"off" -> model name: the throughput target's model
    reference_models: dict[str, str]  # "on"/"off" -> model name: the overhead reference
    quick: bool = False  # --quick: a smoke run, not numbers
    notes: list[str] = field(default_factory=list)  # load averages, duration, flags
    # simple, concurrency 1, against bench/floor.py: the same stacks answering from memory
    floor: list[Point] = field(default_factory=list)
    perf_analyzer: str = ""  # its path here; the report writes it as $PERF_ANALYZER
    # "on" -> model name: the fast model (batching pays: mlp_compute); no "off" variant
    fast_models: dict[str, str] = field(default_factory=dict)
    # model -> its direct batch-1 latency, for latency models other than `simple` (py_add)
    directs: dict[str, Latency] = field(default_factory=dict)
    # bench/cpu_side_by_side.py's SideBySide (rendered by its report() and verdicts())
    side_by_side: Any = None
    # bench/kserve_peer.py's PeerRun (rendered by its report() and verdicts())
    kserve: Any = None
    # bench/handover_cost.py's HandoverCosts (rendered by its report())
    handover: Any = None

    def direct_of(self, model: str) -> Latency:
        return self.directs.get(model, self.direct)

    def floor_of(self, protocol: str, model: str = "simple") -> Point | None:
        return next(
            (p for p in self.floor if p.protocol == protocol and p.model == model and p.ok), None
        )

    def best_offline(self, model: str) -> Throughput:
        runs = self.offline[self.offline_of.get(model, model)]
        return max(runs, key=lambda t: t.best_infer_per_sec)

    def ratio(self, point: Point) -> float:
        return point.infer_per_sec / self.best_offline(point.model).best_infer_per_sec

    def offline_at(self, model: str, batch: float) -> float:
        """Offline inferences/s at a (fractional) batch size, interpolated between the measured
        sizes: the reference for the batches the server actually formed."""
        runs = self.offline[self.offline_of.get(model, model)]
        return float(
            np.interp(
                max(batch, 1.0), [t.batch_size for t in runs], [t.best_infer_per_sec for t in runs]
            )
        )

    def ratio_at_batch(self, point: Point) -> float:
        """Served / offline at the server's average batch size for this point."""
        return point.infer_per_sec / self.offline_at(point.model, point.server.avg_batch)

    def run_inflation(self, point: Point) -> float:
        """Server `session.run` time / offline time for the same batch sizes (interpolated):
        how much slower the model runs inside the busy server than alone."""
        offline = self.offline.get(self.offline_of.get(point.model, point.model))
        by_batch = point.server.infer_by_batch
        if not offline or not by_batch:
            return 0.0
        sizes = [t.batch_size for t in offline]
        batch_us = [t.batch_us for t in offline]
        expected = sum(
            runs * float(np.interp(b, sizes, batch_us)) for b, (runs, _) in by_batch.items()
        )
        return sum(ns for _, ns in by_batch.values()) / 1e3 / expected

    def find(self, model: str, protocol: str, concurrency: int) -> Point | None:
        for point in self.served + self.latency:
            if (point.model, point.protocol, point.concurrency) == (model, protocol, concurrency):
                return point
        return None

    def points_of(self, models: dict[str, str]) -> list[Point]:
        names = set(models.values())
        return [p for p in self.served if p.model in names]


QUICK_MARKER = (
    "> **QUICK RUN** (`bench/run.py --quick`): a smoke test of the benchmark itself, "
    "with 1 s perf_analyzer windows and one short offline repetition. The numbers "
    "below are not measurements to quote or compare; `make bench` writes the real "
    "report."
)


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f}"


def _offline_table(runs: list[Throughput]) -> list[str]:
    lines = [
        "| batch | inferences/s (best) | µs per batch | µs per inference "
        "| all repetitions (inf/s) |",
        "|---:|---:|---:|---:|---|",
    ]
    for t in runs:
        reps = ", ".join(f"{x:,.0f}" for x in t.runs)
        lines.append(
            f"| {t.batch_size} | {t.best_infer_per_sec:,.0f} | {t.batch_us:,.1f} "
            f"| {t.batch_us / t.batch_size:,.1f} | {reps} |"
        )
    return lines


def _label(r: Results, p: Point) -> str:
    names = {
        model: f"batching {on_off}"
        for models in (r.target_models, r.reference_models, r.fast_models)
        for on_off, model in models.items()
    }
    mark = " †" if p.retried else ""
    return f"| {names.get(p.model, p.model)} | {p.protocol} | {p.concurrency}{mark} "


def _throughput_table(r: Results, points: list[Point]) -> list[str]:
    lines = [
        "| model | protocol | concurrency | inferences/s | served/offline best "
        "| avg batch | served/offline at avg batch | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        if not p.ok:
            lines.append(_label(r, p) + f"| failed: {p.error} | | | | | |")
            continue
        at_batch = f"{r.ratio_at_batch(p):.3f}" if p.server.executions else "-"
        lines.append(
            _label(r, p) + f"| {p.infer_per_sec:,.0f} | {r.ratio(p):.3f} "
            f"| {p.server.avg_batch:.1f} | {at_batch} "
            f"| {_ms(p.p50_us)} | {_ms(p.p99_us)} |"
        )
    return lines


def _time_table(r: Results, points: list[Point]) -> list[str]:
    lines = [
        "| model | protocol | concurrency | queue µs | compute µs | hops µs "
        "| outside core µs "
        "| run × offline | loop thread CPU µs/req | other threads CPU µs/req "
        "| perf_analyzer CPU µs/req | CPUs busy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cores = os.cpu_count() or 1
    for p in points:
        if not p.ok:
            continue
        s, c = p.server, p.cpu
        # Closed loop: mean client latency = concurrency / throughput (Little's law).
        outside = 1e6 * p.concurrency / p.infer_per_sec - s.total_us
        busy = (c.server + c.client) / p.seconds / cores if p.seconds else 0.0
        inflation = r.run_inflation(p)
        run_x = f"{inflation:.1f}" if inflation else "-"
        mark = " †" if p.retried else ""
        lines.append(
            f"| {p.model} | {p.protocol} | {p.concurrency}{mark} "
            f"| {s.queue_us:,.0f} | {s.compute_us:,.0f} "
            f"| {s.other_us:,.0f} | {outside:,.0f} | {run_x} "
            f"| {p.cpu_us_per_request(c.loop):,.0f} "
            f"| {p.cpu_us_per_request(c.threads):,.0f} "
            f"| {p.cpu_us_per_request(c.client):,.0f} | {busy:.0%} |"
        )
    return lines


def _latency_models(r: Results) -> list[str]:
    return list(dict.fromkeys(p.model for p in r.latency)) or ["simple"]


def _python(r: Results, model: str) -> bool:
    return r.direct_of(model).call == "execute"


def _latency_table(r: Results, model: str) -> list[str]:
    d = r.direct_of(model)
    what = (
        "`TritonPythonModel.execute` in-process, one request"
        if _python(r, model)
        else "`session.run`, batch 1"
    )
    lines = [
        "| path | p50 µs | p99 µs | p50 added by the server µs |",
        "|---|---:|---:|---:|",
        f"| direct {what} (best of {len(d.runs_p50_us)} x {d.calls} calls) "
        f"| {d.p50_us:,.1f} | {d.p99_us:,.1f} | - |",
    ]
    points = [p for p in r.latency if p.model == model]
    for p in points:
        if p.ok:
            lines.append(
                f"| perf_analyzer {p.protocol}, concurrency 1 | {p.p50_us:,.0f} "
                f"| {p.p99_us:,.0f} | {p.p50_us - d.p50_us:,.0f} |"
            )
        else:
            lines.append(f"| perf_analyzer {p.protocol}, concurrency 1 | failed: {p.error} | | |")
    for p in (f for f in r.floor if f.model == model):
        label = (
            f"floor: perf_analyzer {p.protocol}, concurrency 1, against the same stack "
            "answering from memory (`bench/floor.py`)"
        )
        if p.ok:
            lines.append(f"| {label} | {p.p50_us:,.0f} | {p.p99_us:,.0f} | - |")
        else:
            lines.append(f"| {label} | failed: {p.error} | | |")
    for p in points:
        base = r.floor_of(p.protocol, model)
        if p.ok and base is not None:
            lines.append(
                f"| the server's own share over {p.protocol}: served p50 - floor p50 "
                f"| {p.p50_us - base.p50_us:,.0f} | | |"
            )
    return lines


def _ratio_lines(r: Results, models: dict[str, str], target: bool) -> list[str]:
    on = models["on"]
    if on not in r.offline:
        return []
    best = r.best_offline(on)
    lines = []
    for protocol in sorted({p.protocol for p in r.points_of(models)}):
        p = r.find(on, protocol, RATIO_CONCURRENCY)
        if target:
            label = (
                f"Throughput, `{on}` dynamic batching, concurrency {RATIO_CONCURRENCY}, "
                f"{protocol}: served/offline >= {RATIO_TARGET}"
            )
        else:
            label = (
                f"Reference only (not the target: too cheap a model), `{on}` dynamic "
                f"batching, concurrency {RATIO_CONCURRENCY}, {protocol}"
            )
        if p is None or not p.ok:
            lines.append(f"- {label}: **not measured** ({p.error if p else 'not run'})")
            continue
        ratio = r.ratio(p)
        verdict = ("met" if ratio >= RATIO_TARGET else "not met") if target else "ratio"
        at_batch = (
            (
                f"; against offline at the batch the server formed ({p.server.avg_batch:.1f}"
                f", {r.offline_at(on, p.server.avg_batch):,.0f} inf/s): "
                f"{r.ratio_at_batch(p):.3f}"
            )
            if p.server.executions
            else ""
        )
        lines.append(
            f"- {label}: **{verdict}** — {p.infer_per_sec:,.0f} / "
            f"{best.best_infer_per_sec:,.0f} inf/s (offline best, batch "
            f"{best.batch_size}) = {ratio:.3f}{at_batch}"
        )
    return lines


def verdicts(r: Results) -> list[str]:
    lines = _ratio_lines(r, r.target_models, target=True)
    if r.fast_models:
        lines += _ratio_lines(r, r.fast_models, target=True)
    for p in r.latency:
        kind = " (Python model)" if _python(r, p.model) else ""
        label = (
            f"Latency, `{p.model}`{kind} concurrency 1, {p.protocol}: p50 added <= "
            f"{ADDED_P50_TARGET_US / 1e3:.1f} ms"
        )
        if not p.ok:
            lines.append(f"- {label}: **not measured** ({p.error})")
            continue
        direct = r.direct_of(p.model)
        added = p.p50_us - direct.p50_us
        verdict = "met" if added <= ADDED_P50_TARGET_US else "not met"
        base = r.floor_of(p.protocol, p.model)
        floor_note = (
            (
                f" (the same {p.protocol} stack answering from memory, `bench/floor.py`: "
                f"{base.p50_us:,.0f} µs p50, so {p.p50_us - base.p50_us:,.0f} µs of it is "
                "the server's own work)"
            )
            if base is not None
            else ""
        )
        lines.append(
            f"- {label}: **{verdict}** — {p.p50_us:,.0f} µs served - "
            f"{direct.p50_us:,.1f} µs direct = {added:,.0f} µs added{floor_note}"
        )
    if r.side_by_side is not None:
        lines += cpu_side_by_side.verdicts(r.side_by_side)
    if r.kserve is not None:
        lines += kserve_peer.verdicts(r.kserve)
    return lines + _ratio_lines(r, r.reference_models, target=False)


def _model_section(r: Results, models: dict[str, str], title: str, intro: list[str]) -> list[str]:
    on, off = models.get("on", ""), models.get("off")
    if on not in r.offline:
        return []
    variants = (
        f"`batching on` is `{on}` (dynamic batching, 2000 µs), `batching off` is `{off}` "
        "(same model file and options, no dynamic batching)."
        if off
        else f"`batching on` is `{on}` (its dynamic batching as above); no unbatched variant "
        "is served."
    )
    best = r.best_offline(on)
    return [
        title,
        "",
        *intro,
        "",
        f"### Offline: `{on}` in-process ONNX Runtime (the server's session options)",
        "",
        *_offline_table(r.offline[on]),
        "",
        f"Best offline: {best.best_infer_per_sec:,.0f} inf/s at batch {best.batch_size}; "
        "`served/offline best` divides by it. `served/offline at avg batch` divides by "
        "offline throughput at the server's average batch size for that point (interpolated "
        "between measured sizes): with one instance at concurrency c, about c/2 requests "
        "wait while c/2 run, so batches settle near c/2, not at 64.",
        "",
        f"### Served: `{on}` through perf_analyzer",
        "",
        variants,
        "",
        *_throughput_table(r, r.points_of(models)),
        "",
    ]


def render(r: Results) -> str:
    target, reference = r.target_models["on"], r.reference_models["on"]
    out = ["# ascend-serve benchmark results", ""]
    if r.quick:
        out += [QUICK_MARKER, ""]
    out += [
        "Written by `bench/run.py` (see `bench/README.md`): the numbers of one run on a shared "
        "machine, not a guarantee. Where the time goes, and what to change: "
        "`bench/FINDINGS.md`.",
        "",
        "## Target verdicts",
        "",
        *verdicts(r),
        "",
        "## Machine",
        "",
    ]
    out += [f"- {key}: {value}" for key, value in r.machine.items()]
    out += [*[f"- {note}" for note in r.notes], "", "## Commands", "", "```"]
    out += r.commands
    out += [
        *(p.command_line for p in r.latency + r.served),
        "# the floor server (bench/floor.py, canned answers from the real server), then:",
        *(p.command_line for p in r.floor),
        "```",
        "",
    ]
    if any(p.retried for p in r.latency + r.served):
        out += [
            "† in the tables: perf_analyzer did not stabilise with the first flags and the "
            f"point was measured again with `{' '.join(RETRY_FLAGS)}` (the command shown).",
            "",
        ]
    out += _model_section(
        r,
        r.target_models,
        f"## Throughput target: `{target}` (compute-bound CNN)",
        [
            f"`{target}`: FP32 [3, 64, 64] -> 4 x (Conv 3x3, 32 channels + Relu), "
            "GlobalAveragePool, Gemm -> 10, Softmax; about 117 M multiply-adds per inference on "
            "one ORT thread, so compute (milliseconds) dominates the server's per-request overhead "
            "(well under a millisecond of CPU, on the other core). The throughput target "
            f"(served >= {RATIO_TARGET} x best offline, dynamic batching, concurrency "
            f"{RATIO_CONCURRENCY}) is judged on this model."
        ],
    )
    if r.fast_models:
        fast = r.fast_models["on"]
        out += _model_section(
            r,
            r.fast_models,
            f"## Batching when the model is fast: `{fast}` (MLP)",
            [
                f"`{fast}`: FP32 [256] -> MatMul 256x2048 + Relu -> 2 x (MatMul 2048x2048 + Relu) "
                "-> MatMul 2048x16; about 8.9 M multiply-adds per inference from 36 MB of weights, "
                "with the server's default ONNX Runtime session options (no thread parameters in "
                "its config). At batch 1 each call streams every weight for one row, at batch 64 "
                "the same weights serve 64 rows, so offline throughput climbs steeply with the "
                "batch size: the ratio says whether the server forms the batches that make a fast "
                "model pay. max_batch_size 64, dynamic batching (preferred 16, 32, 64; 2000 µs), "
                f"one CPU instance; target: served >= {RATIO_TARGET} x best offline at concurrency "
                f"{RATIO_CONCURRENCY}."
            ],
        )
    out += _model_section(
        r,
        r.reference_models,
        f"## Per-request overhead reference: `{reference}` (model too cheap for the ratio to "
        "measure batching)",
        [
            f"Not a target verdict. `{reference}` (FP32 [256] -> 4 x MatMul 256x256 + Tanh) costs "
            "a few µs per inference at large batches, about 100x less than one request's "
            "serving overhead, so its served/offline ratio measures the server's per-request CPU "
            "cost (see the CPU columns below), not whether batching pays. Kept so that "
            "hot-path work on the frontends shows up as requests/s."
        ],
    )
    out += [
        "## Where the time goes",
        "",
        "Per-request averages over each whole perf_analyzer call (all its trials). From the "
        "server's statistics: queue = from the decoded request's arrival to its batch being "
        "launched; compute = input gather + `session.run` + output split on the instance "
        "thread; hops = the rest of the core's time (the hop to the instance thread and the "
        "hop back to the event loop); outside core = mean client latency (concurrency / "
        "throughput) minus the core's time: perf_analyzer, sockets, HTTP/gRPC parse, decode "
        "and encode, and waiting for the busy event loop. run × offline = `session.run` time "
        "in the server / offline time for the same batch sizes. CPU columns: CPU time per "
        "request of the server's main thread (event loop: frontends, codecs, scheduler), of "
        "its other threads (instance threads, gRPC poller; from /proc) and of perf_analyzer "
        "(getrusage); CPUs busy = all of it over the call's wall time and the machine's CPUs "
        "(other tenants of a shared machine are not counted). For the Python model the "
        "worker process that runs `execute` is not among the server's threads: its CPU is "
        "in none of these columns (bench/cpu_side_by_side.py counts the whole process "
        "tree).",
        "",
        *_time_table(r, r.latency + r.served),
        "",
    ]
    for model in _latency_models(r):
        title = (
            f"## Latency: `{model}` (Python model: FP32 [16] sum and difference, "
            "bench/models), batch 1"
            if _python(r, model)
            else f"## Latency: `{model}` (INT32 [16] add/sub), batch 1"
        )
        out += [title, "", *_latency_table(r, model), ""]
    if r.side_by_side is not None:
        out += cpu_side_by_side.report(r.side_by_side)
    if r.kserve is not None:
        out += kserve_peer.report(r.kserve)
    if r.handover is not None:
        out += handover_cost.report(r.handover)
        fhg = {p: r.handover.costs(p) for p in sorted({k.split()[0] for k in r.handover.figures})}
        out += npu_host_model.with_measured(fhg)
    return portable("\n".join(out), r.perf_analyzer)
