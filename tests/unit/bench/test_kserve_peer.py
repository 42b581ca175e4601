"""The KServe peer's report, without kserve installed: the rows, the ratio and the verdict a
reader of `make bench`'s report sees, and what it says when KServe was not measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import kserve_peer
from bench.kserve_peer import AIO, KSERVE_LABEL, OURS, PeerRun, PeerSample


def _run() -> PeerRun:
    samples = []
    for round_no, (ours, peer) in enumerate(((3000.0, 1500.0), (3400.0, 1700.0)), start=1):
        samples += [
            PeerSample(OURS, "grpc", 8, round_no, ours, 200.0),
            PeerSample(AIO, "grpc", 8, round_no, 2 * ours, 100.0),
            PeerSample(KSERVE_LABEL, "grpc", 8, round_no, peer, 400.0),
            PeerSample(OURS, "http", 1, round_no, 1000.0, 300.0),
            PeerSample(KSERVE_LABEL, "http", 1, round_no, 1250.0, 500.0),
        ]
    samples.append(PeerSample(KSERVE_LABEL, "http", 8, 2, error="client loop failed: x"))
    return PeerRun(samples=samples, kserve="`kserve==0.21.0` (.venv-kserve)")


def test_report_has_kserve_rows_with_ratios_and_verdict() -> None:
    text = "\n".join(kserve_peer.report(_run()))
    assert "| grpc | 8 | 3,200 (200) | 1,600 (400) | 2.00x |" in text
    assert "| http | 1 | 1,000 (300) | 1,250 (500) | 0.80x |" in text
    assert "- failed: round 2 KServe 0.21 (Python) http c8: client loop failed: x" in text
    assert f"ascend-serve >= 1.5x {KSERVE_LABEL}: **met** — 3,200 vs 1,600" in text
    assert "| grpc, `--grpc-server aio` | 8 | 6,400 (100) | 1,600 (400) | 4.00x |" in text
    assert f"aio >= 1.5x {KSERVE_LABEL}: **met** — 6,400 vs 1,600 inferences/s (4.00x)" in text


def test_verdict_not_met_below_the_target() -> None:
    run = PeerRun(
        samples=[
            PeerSample(OURS, "grpc", 8, 1, 1591.0, 605.0),
            PeerSample(KSERVE_LABEL, "grpc", 8, 1, 2182.0, 394.0),
        ]
    )
    assert "**not met** — 1,591 vs 2,182 inferences/s (0.73x)" in kserve_peer.verdicts(run)[0]


def test_without_kserve_the_report_says_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kserve_peer, "find_kserve", lambda: None)
    monkeypatch.setattr(kserve_peer.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(kserve_peer.os, "cpu_count", lambda: 2)
    run = kserve_peer.run(tmp_path, rounds=1, progress=lambda _line: None)
    assert run.samples == []
    text = "\n".join(kserve_peer.report(run))
    assert "KServe: not measured: no kserve (install `kserve==0.21.0` into .venv-kserve)" in text
    assert "| protocol |" not in text
    assert f"- gRPC c=8 against {KSERVE_LABEL}: not measured" in text
