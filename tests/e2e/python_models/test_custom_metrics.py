"""Issue 28 item 10: a Python model's custom metrics can no longer break /metrics for every
scraper. The `probe` model (harness/testmodels.py) tries each bad case (a newline in a
description, bad label keys, a family named like Triton's, a non-ASCII name, another model's
family with another kind, ...): each raises TritonModelException in model.py with its reason,
the server logs a warning, and the page still parses, with the good families on it and none
of the bad ones."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.serverproc import ServerProcess, running_server
from harness.testmodels import build_metrics_probe

pytestmark = pytest.mark.e2e

EXPECTED = {
    "newline in description": "holds a control character",
    "Triton's family name": "reserved",
    "non-ASCII name": "invalid metric family name",
    "dash in name": "invalid metric family name",
    "digit first": "invalid metric family name",
    "other model's kind": "already a gauge (declared by model 'first')",
    "clashing samples": "clashes with family 'probe_latency'",
    "bad label key": "invalid label key 'bad-key'",
    "reserved label key": "invalid label key '__name__'",
    "non-ASCII label key": "invalid label key",
    "newline in label value": "holds a control character",
    "too many labels": "--custom-metric-max-labels",
    "le on a histogram": "reserved for a histogram's buckets",
    "too many series": "--custom-metric-max-series",
}

SAMPLE = re.compile(
    r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? \S+'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("repo")
    build_metrics_probe(repo)
    args = [
        "--model-control-mode",
        "explicit",
        "--load-model",
        "first",
        "--custom-metric-max-series",
        "3",
    ]
    with running_server([repo], args) as proc:
        load = httpx.post(f"{proc.base}/v2/repository/models/probe/load", json={}, timeout=120)
        assert load.status_code == 200, load.text
        yield proc


def _results(server: ServerProcess) -> dict[str, str]:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    reply = httpx.post(f"{server.base}/v2/models/probe/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return json.loads(reply.json()["outputs"][0]["data"][0])


def test_each_bad_case_raised_in_model_py(server: ServerProcess) -> None:
    results = _results(server)
    assert set(results) == set(EXPECTED)
    for case, words in EXPECTED.items():
        seen = results[case]
        assert seen.startswith("TritonModelException: ") and words in seen, (case, seen)
    log = server.log()
    assert log.count("custom metric refused") >= len(EXPECTED), log[-3000:]


def test_the_page_parses_with_the_good_families_and_none_of_the_bad(
    server: ServerProcess,
) -> None:
    _results(server)
    page = httpx.get(server.metrics_url, timeout=10).text
    for line in page.splitlines():
        assert line.startswith(("# HELP ", "# TYPE ")) or SAMPLE.fullmatch(line), line
    families = {f.name: f for f in text_string_to_metric_families(page)}
    good = families["probe_good"]  # the parser drops a counter's _total
    assert good.type == "counter" and good.documentation == 'calls, "quoted" \\ help'
    [sample] = [s for s in good.samples if s.name == "probe_good_total"]
    assert sample.labels == {"model": "probe", "path": 'a"b\\c'} and sample.value >= 1
    assert families["probe_latency"].type == "histogram"
    assert families["shared_family"].type == "gauge"  # the first model's, unchanged
    assert len(families["probe_many"].samples) == 3  # --custom-metric-max-series 3
    names = {s.name for f in families.values() for s in f.samples}
    for bad in ("desc_injected", "injected_sample", "bad-name", "9lives", "probe_latency_count"):
        assert bad not in families
    assert not any(name.startswith("caf") for name in names)
    assert "injected_sample" not in page
    # Triton's own family is still Triton's, with its per-model series.
    assert families["nv_inference_count"].type == "counter"
    assert all("model" in s.labels for s in families["nv_inference_count"].samples)
