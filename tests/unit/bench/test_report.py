"""bench/report.py writes no machine paths: reports from different machines diff cleanly."""

from __future__ import annotations

from pathlib import Path

from bench.kserve_peer import PeerRun
from bench.offline import Latency, Throughput
from bench.report import ROOT, Results, portable, render
from bench.served import Point

PA = "/root/.cache/perf-analyzer/perf_analyzer"


def test_checkout_paths_become_relative_and_perf_analyzer_a_variable() -> None:
    root = Path("/work/main")
    text = (
        f"{root}/.venv/bin/python -m server --model-repository {root}/bench/out/models\n"
        f"{PA} -m simple -f {root}/bench/out/perf_analyzer/simple-http-c1.csv\n"
        f"cwd {root}; not {root}2/x nor /x{root}/y"
    )
    assert portable(text, PA, root) == (
        ".venv/bin/python -m server --model-repository bench/out/models\n"
        "$PERF_ANALYZER -m simple -f bench/out/perf_analyzer/simple-http-c1.csv\n"
        f"cwd .; not {root}2/x nor /x{root}/y"
    )


def test_a_perf_analyzer_found_on_path_is_left_as_its_name() -> None:
    assert portable("perf_analyzer -m simple", "perf_analyzer") == "perf_analyzer -m simple"


def test_the_rendered_report_has_no_machine_paths() -> None:
    python = str(ROOT / ".venv" / "bin" / "python")
    point = Point(
        "simple",
        "http",
        1,
        [PA, "-m", "simple", "-f", str(ROOT / "bench/out/perf_analyzer/simple-http-c1.csv")],
        error="exit 1: failed",
    )
    results = Results(
        machine={"Python": f"3.11.7 ({python})", "perf_analyzer": f"Perf Analyzer ({PA})"},
        commands=[
            f"# started as: {python} bench/run.py",
            f"# server (log: {ROOT}/bench/out/ascend-serve-1.log):",
        ],
        offline={},
        offline_of={},
        direct=Latency(1, 10, 10.0, 20.0, [10.0]),
        served=[],
        latency=[point],
        target_models={"on": "a", "off": "b"},
        reference_models={"on": "c", "off": "d"},
        perf_analyzer=PA,
    )
    text = render(results)
    assert str(ROOT) not in text and PA not in text
    assert "- Python: 3.11.7 (.venv/bin/python)" in text
    assert "- perf_analyzer: Perf Analyzer ($PERF_ANALYZER)" in text
    assert "# server (log: bench/out/ascend-serve-1.log):" in text
    assert "$PERF_ANALYZER -m simple -f bench/out/perf_analyzer/simple-http-c1.csv" in text


def test_python_model_latency_fast_model_and_side_by_side_are_reported() -> None:
    from bench.cpu_side_by_side import Sample, SideBySide
    from bench.served import ServerSplit

    def point(model: str, protocol: str, concurrency: int, p50_us: float) -> Point:
        return Point(
            model,
            protocol,
            concurrency,
            [PA, "-m", model],
            ok=True,
            infer_per_sec=100.0,
            p50_us=p50_us,
            p99_us=2 * p50_us,
            seconds=1.0,
            server=ServerSplit(requests=100, executions=10),
        )

    offline = [Throughput(b, 10.0 * b, [10.0 * b]) for b in (1, 64)]
    side = SideBySide(
        samples=[
            Sample("ascend-serve", "py_add", "http", 1, 900.0, 300.0, switches=2.25),
            Sample("triton", "py_add", "http", 1, 800.0, 400.0, switches=1.5),
            Sample("ascend-serve", "py_add", "grpc", 1, 500.0, 450.0, switches=12.0),
        ],
        triton="nvidia-pytriton==0.7.0",
        commands=[f"{PA} -m py_add"],
    )
    results = Results(
        machine={},
        commands=[],
        offline={"mlp_compute": offline},
        offline_of={},
        direct=Latency(1, 10, 10.0, 20.0, [10.0]),
        served=[point("mlp_compute", "http", 32, 1000.0)],
        latency=[point("simple", "http", 1, 200.0), point("py_add", "http", 1, 400.0)],
        floor=[point("simple", "http", 1, 80.0), point("py_add", "http", 1, 90.0)],
        target_models={"on": "a", "off": "b"},
        reference_models={"on": "c", "off": "d"},
        fast_models={"on": "mlp_compute"},
        directs={"py_add": Latency(1, 10, 3.0, 4.0, [3.0], call="execute")},
        side_by_side=side,
        kserve=PeerRun(
            kserve="not measured: no kserve (install `kserve==0.21.0` into .venv-kserve)"
        ),
        perf_analyzer=PA,
    )
    text = render(results)
    assert "## Beside KServe 0.21 (Python), one closed-loop Python client (issue 27)" in text
    assert (
        "- gRPC c=8 against KServe 0.21 (Python): not measured: no kserve (install "
        "`kserve==0.21.0` into .venv-kserve)"
    ) in text
    assert (
        "- Throughput, `mlp_compute` dynamic batching, concurrency 32, http: served/offline "
        ">= 0.8: **not met** — 100 / 640 inf/s"
    ) in text
    assert (
        "- Latency, `py_add` (Python model) concurrency 1, http: p50 added <= 0.5 ms: "
        "**met** — 400 µs served - 3.0 µs direct = 397 µs added (the same http stack "
        "answering from memory, `bench/floor.py`: 90 µs p50, so 310 µs of it is the "
        "server's own work)"
    ) in text
    assert "- Latency, `simple` concurrency 1, http: p50 added <= 0.5 ms: **met** — 200 µs" in text
    assert "direct `TritonPythonModel.execute` in-process, one request" in text
    assert "## Server CPU per inference, side by side with Triton" in text
    assert "| ascend-serve | py_add | http | 900 | 300 | 2.2 | 300 |" in text
    assert "| triton | py_add | http | 800 | 400 | 1.5 | 400 |" in text
    assert (
        "- Context switches per inference, Python model `py_add`, grpc: <= 8: **not met** — 12.0"
    ) in text
    assert (
        "- CPU per inference, Python model `py_add`, http: ascend-serve <= Triton: **met**" in text
    )
    assert text.index("CPU per inference, Python model") < text.index("## Machine")
    assert PA not in text and "$PERF_ANALYZER -m py_add" in text


def test_measured_handover_costs_feed_the_npu_host_section() -> None:
    from bench.handover_cost import HandoverCosts

    costs = HandoverCosts("simple_batching", 16, 1)
    for name, value in (("owner_us", 90.0), ("frontend_us", 75.0), ("infer_per_sec", 9000.0)):
        costs.figures[f"http N=1 {name}"] = [value]
    costs.figures["http N=2 owner_us"] = [70.0]
    costs.figures["http N=2 frontend_us"] = [75.0]
    costs.figures["http N=2 infer_per_sec"] = [8000.0]
    results = Results(
        machine={},
        commands=[],
        offline={},
        offline_of={},
        direct=Latency(1, 10, 10.0, 20.0, [10.0]),
        served=[],
        latency=[],
        target_models={"on": "a", "off": "b"},
        reference_models={"on": "c", "off": "d"},
        handover=costs,
    )
    text = render(results)
    assert "## An 8-NPU host from these costs (bench/studies/npu_host_model.py)" in text
    assert "| HTTP | 150 KB | " in text and "| HTTP | 600 KB | " in text


def test_grpc_aio_is_reported_beside_the_default_grpc_server() -> None:
    from bench.cpu_side_by_side import AIO, Sample, SideBySide, verdicts

    side = SideBySide(
        samples=[
            Sample("ascend-serve", "py_add", "grpc", 1, 900.0, 300.0, switches=7.0),
            Sample(AIO, "py_add", "grpc", 1, 500.0, 600.0, switches=11.0),
        ]
    )
    assert (
        "- The same with `--grpc-server aio`: **not met** — 11.0 switches, 600 µs CPU per "
        "inference, 2.00x the CPU of the default"
    ) in verdicts(side)
