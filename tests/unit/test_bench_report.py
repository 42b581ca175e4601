"""bench/report.py writes no machine paths: reports from different machines diff cleanly."""
from __future__ import annotations

from pathlib import Path

from bench.offline import Latency
from bench.report import ROOT, Results, portable, render
from bench.served import Point

PA = "/root/.cache/perf-analyzer/perf_analyzer"


def test_checkout_paths_become_relative_and_perf_analyzer_a_variable() -> None:
    root = Path("/work/main")
    text = (f"{root}/.venv/bin/python -m server --model-repository {root}/bench/out/models\n"
            f"{PA} -m simple -f {root}/bench/out/perf_analyzer/simple-http-c1.csv\n"
            f"cwd {root}; not {root}2/x nor /x{root}/y")
    assert portable(text, PA, root) == (
        ".venv/bin/python -m server --model-repository bench/out/models\n"
        "$PERF_ANALYZER -m simple -f bench/out/perf_analyzer/simple-http-c1.csv\n"
        f"cwd .; not {root}2/x nor /x{root}/y")


def test_a_perf_analyzer_found_on_path_is_left_as_its_name() -> None:
    assert portable("perf_analyzer -m simple", "perf_analyzer") == "perf_analyzer -m simple"


def test_the_rendered_report_has_no_machine_paths() -> None:
    python = str(ROOT / ".venv" / "bin" / "python")
    point = Point("simple", "http", 1, [PA, "-m", "simple", "-f",
                                       str(ROOT / "bench/out/perf_analyzer/simple-http-c1.csv")],
                  error="exit 1: failed")
    results = Results(
        machine={"Python": f"3.11.7 ({python})", "perf_analyzer": f"Perf Analyzer ({PA})"},
        commands=[f"# started as: {python} bench/run.py",
                  f"# server (log: {ROOT}/bench/out/ascend-serve-1.log):"],
        offline={}, offline_of={}, direct=Latency(1, 10, 10.0, 20.0, [10.0]), served=[],
        latency=[point], target_models={"on": "a", "off": "b"},
        reference_models={"on": "c", "off": "d"}, perf_analyzer=PA)
    text = render(results)
    assert str(ROOT) not in text and PA not in text
    assert "- Python: 3.11.7 (.venv/bin/python)" in text
    assert "- perf_analyzer: Perf Analyzer ($PERF_ANALYZER)" in text
    assert "# server (log: bench/out/ascend-serve-1.log):" in text
    assert "$PERF_ANALYZER -m simple -f bench/out/perf_analyzer/simple-http-c1.csv" in text
