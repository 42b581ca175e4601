"""bench/studies/npu_device.py on the emulator: the device-only loop per gear and the report files
(the served half needs perf_analyzer and is exercised on hardware runs)."""

from __future__ import annotations

import json

from bench.studies import npu_device
from tests.support import om_fixtures as omf


def test_device_only_measures_every_gear(acl_emu, tmp_path):
    results = npu_device.device_only(omf.scale_model(tmp_path / "m.om"), 0, 5, None)
    assert [(r["gear"], r["rows"], r["loops"]) for r in results] == [
        ("batch 1", 1, 5),
        ("batch 2", 2, 5),
        ("batch 4", 4, 5),
        ("batch 8", 8, 5),
    ]
    assert all(r["rows_per_sec"] > 0 for r in results)
    model_ids = [m for m in range(1, 10) if acl_emu._emu.last_execution(m)["count"]]
    assert acl_emu._emu.last_execution(model_ids[-1])["count"] == 4 * (5 + 1)


def test_report_without_perf_analyzer(acl_emu, tmp_path, monkeypatch):
    monkeypatch.delenv("PERF_ANALYZER", raising=False)
    monkeypatch.setattr(npu_device.shutil, "which", lambda name: None)
    om = omf.hw_model(tmp_path / "hw.om")
    assert npu_device.main([str(om), "--loops", "3", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "npu_device.json").read_text())
    assert [r["gear"] for r in report["device_only"]] == [
        "image[1, 3, 16, 16]",
        "image[1, 3, 32, 24]",
    ]
    assert "served: not measured (no perf_analyzer" in report["note"]
    text = (tmp_path / "out" / "npu_device.md").read_text()
    assert "| image[1, 3, 32, 24] |" in text
    # What the hung-NPU timeout would be for this model (fast here: the floor).
    assert all(r["sync_with_timeout"] for r in report["device_only"])
    assert "this pyACL has acl.rt.synchronize_stream_with_timeout" in text
    assert "the derived execution timeout is 5000 ms" in text
    assert "| image[1, 3, 32, 24] |" in (tmp_path / "out" / "npu_device.md").read_text()


def test_device_only_covers_dynamic_aipp_and_yuv_image_sizes(acl_emu, tmp_path):
    from google.protobuf import text_format

    from npu import aipp as npu_aipp
    from protocol.proto.model_config_pb2 import ModelConfig
    from tests.unit.npu.test_om_kinds import DYNAMIC_AIPP

    settings = npu_aipp.settings_from_config(text_format.Parse(DYNAMIC_AIPP, ModelConfig()))
    om = omf.aipp_model(tmp_path / "aipp.om", mode="dynamic")
    results = npu_device.device_only(om, 0, 3, settings)
    assert [(r["gear"], r["rows"]) for r in results] == [
        ("batch 1", 1),
        ("batch 2", 2),
        ("batch 4", 4),
    ]
    results = npu_device.device_only(omf.yuv_hw_model(tmp_path / "yuv.om"), 0, 3, None)
    assert [r["gear"] for r in results] == ["image[1, 24, 16, 1]", "image[1, 48, 24, 1]"]


def test_dims_models_over_several_inputs_are_measured_per_gear(acl_emu, tmp_path, monkeypatch):
    """A --dynamic_dims model whose gears follow --input_shape, and one that needs the
    input_shape parameter (given with --config), each gear measured; served unbatched."""
    results = npu_device.device_only(omf.dims_pair_model(tmp_path / "pair.om"), 0, 3, None)
    assert [r["gear"] for r in results] == [
        "tokens[1, 8] weights[2, 2] bias[3]",
        "tokens[1, 16] weights[4, 2] bias[3]",
    ]
    monkeypatch.delenv("PERF_ANALYZER", raising=False)
    monkeypatch.setattr(npu_device.shutil, "which", lambda name: None)
    extra = tmp_path / "extra.pbtxt"
    extra.write_text('parameters { key: "input_shape" value { string_value: "b;a" } }\n')
    om = omf.dims_twin_model(tmp_path / "twin.om")
    argv = [str(om), "--loops", "3", "--config", str(extra), "--out", str(tmp_path / "out")]
    assert npu_device.main(argv) == 0
    report = json.loads((tmp_path / "out" / "npu_device.json").read_text())
    assert [r["gear"] for r in report["device_only"]] == ["a[1, 4] b[1, 8]", "a[1, 8] b[1, 16]"]
    written = npu_device.write_repository(tmp_path / "repo", om, 0, "", batching=False)
    assert "dynamic_batching" not in (written / npu_device.MODEL_NAME / "config.pbtxt").read_text()
