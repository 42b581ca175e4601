"""The example repository builder: every model runs in ONNX Runtime and every config parses."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from examples import build_repository as br  # noqa: E402  (only where onnx is, see the skips)
from examples import common  # noqa: E402  (only where onnx is, see the skips)

MODELS = (
    "simple",
    "simple_batching",
    "classifier",
    "dense_compute",
    "dense_compute_nobatch",
    "conv_compute",
    "conv_compute_nobatch",
    "identity_bytes",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return br.build_repository(tmp_path_factory.mktemp("models"))


def _session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def _parse_config(pb, repo: Path, name: str):
    from google.protobuf import text_format

    text = (repo / name / "config.pbtxt").read_text()
    return text_format.Parse(text, pb.ModelConfig())


def test_layout(repo: Path) -> None:
    from examples.pipeline import PIPELINE_BUILDERS
    from examples.streaming import STREAMING_MODELS

    assert sorted(p.name for p in repo.iterdir()) == sorted(
        [*MODELS, *PIPELINE_BUILDERS, *STREAMING_MODELS]
    )
    assert (repo / "preprocess" / "1" / "model.py").is_file()
    assert (repo / "pipeline" / "config.pbtxt").is_file()
    for name in MODELS:
        assert (repo / name / "config.pbtxt").is_file()
        assert (repo / name / "1" / "model.onnx").is_file()
    labels = (repo / "classifier" / "labels.txt").read_text().splitlines()
    assert labels == list(br.CLASSIFIER_LABELS)
    assert len(labels) == 10


def test_build_is_deterministic_and_idempotent(repo: Path, tmp_path: Path) -> None:
    again = br.build_repository(tmp_path)
    br.build_repository(tmp_path)  # rebuilding over an existing repository rewrites in place
    for name in MODELS:
        for rel in ("config.pbtxt", "1/model.onnx"):
            assert (again / name / rel).read_bytes() == (repo / name / rel).read_bytes(), rel
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_models_use_compatible_opset(repo: Path) -> None:
    import onnx

    for name in MODELS:
        model = onnx.load(str(repo / name / "1" / "model.onnx"))
        assert model.ir_version == common.IR_VERSION
        assert [(o.domain, o.version) for o in model.opset_import] == [("", common.OPSET)]


@pytest.mark.parametrize("name", ["simple", "simple_batching"])
def test_simple_add_sub(repo: Path, name: str) -> None:
    sess = _session(repo, name)
    assert [(i.name, i.type, i.shape) for i in sess.get_inputs()] == [
        ("INPUT0", "tensor(int32)", ["batch", 16]),
        ("INPUT1", "tensor(int32)", ["batch", 16]),
    ]
    assert [o.name for o in sess.get_outputs()] == ["OUTPUT0", "OUTPUT1"]
    # Triton's simple client: INPUT0 = 0..15, INPUT1 = all ones; then a batch of 3.
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    out0, out1 = sess.run(None, {"INPUT0": in0, "INPUT1": in1})
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    np.testing.assert_array_equal(out0, np.arange(1, 17, dtype=np.int32).reshape(1, 16))
    np.testing.assert_array_equal(out1, np.arange(-1, 15, dtype=np.int32).reshape(1, 16))

    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    out0, out1 = sess.run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def test_classifier(repo: Path) -> None:
    sess = _session(repo, "classifier")
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("INPUT", "tensor(float)", ["batch", 3, 32, 32])
    assert (out.name, out.type, out.shape) == ("PROBABILITIES", "tensor(float)", ["batch", 10])

    images = np.random.default_rng(1).random((4, 3, 32, 32), dtype=np.float32)
    (probs,) = sess.run(None, {"INPUT": images})
    assert probs.shape == (4, 10) and probs.dtype == np.float32
    assert np.all(probs >= 0) and np.all(probs <= 1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)

    # Same input, same answer: batched or alone, and from a rebuilt model file.
    (again,) = sess.run(None, {"INPUT": images})
    np.testing.assert_array_equal(probs.argmax(axis=1), again.argmax(axis=1))
    (single,) = sess.run(None, {"INPUT": images[2:3]})
    np.testing.assert_allclose(single[0], probs[2], rtol=1e-5, atol=1e-6)
    assert single[0].argmax() == probs[2].argmax()
    # Real computation: different images do not all give the same distribution.
    assert not np.allclose(probs[0], probs[1])
    # Solid red, green and blue images are told apart (the seeded weights fix the classes).
    colours = np.eye(3, dtype=np.float32)[:, :, None, None] * np.ones((1, 1, 32, 32), np.float32)
    (colour_probs,) = sess.run(None, {"INPUT": colours})
    assert len(set(colour_probs.argmax(axis=1).tolist())) == 3


def test_dense_compute(repo: Path) -> None:
    for name in ("dense_compute", "dense_compute_nobatch"):
        assert (repo / name / "1" / "model.onnx").read_bytes() == (
            repo / "dense_compute" / "1" / "model.onnx"
        ).read_bytes()
    sess = _session(repo, "dense_compute")
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.shape) == ("INPUT", ["batch", 256])
    assert sess.get_outputs()[0].name == "OUTPUT"
    for batch in (1, 7, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
        (y,) = sess.run(None, {"INPUT": x})
        assert y.shape == (batch, 256) and y.dtype == np.float32
        assert np.all(np.isfinite(y)) and np.all(np.abs(y) <= 1.0)
        assert float(np.std(y)) > 0.05  # values stay bounded, not collapsed to zero


def test_conv_compute(repo: Path) -> None:
    for name in ("conv_compute", "conv_compute_nobatch"):
        assert (repo / name / "1" / "model.onnx").read_bytes() == (
            repo / "conv_compute" / "1" / "model.onnx"
        ).read_bytes()
    # Small file, real compute: 4 full-resolution 3x3 convolutions of 32 channels.
    assert (repo / "conv_compute" / "1" / "model.onnx").stat().st_size < 200_000
    import onnx

    model = onnx.load(str(repo / "conv_compute" / "1" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == [
        "Conv",
        "Relu",
        "Conv",
        "Relu",
        "Conv",
        "Relu",
        "Conv",
        "Relu",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
        "Softmax",
    ]

    sess = _session(repo, "conv_compute")
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("INPUT", "tensor(float)", ["batch", 3, 64, 64])
    assert (out.name, out.type, out.shape) == ("PROBABILITIES", "tensor(float)", ["batch", 10])

    images = np.random.default_rng(3).random((5, 3, 64, 64), dtype=np.float32)
    (probs,) = sess.run(None, {"INPUT": images})
    assert probs.shape == (5, 10) and probs.dtype == np.float32
    assert np.all(probs > 0) and np.all(probs < 1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # Deterministic, and a request's answer does not depend on the batch it is run in.
    (again,) = sess.run(None, {"INPUT": images})
    np.testing.assert_array_equal(probs, again)
    for i in (0, 4):
        (single,) = sess.run(None, {"INPUT": images[i : i + 1]})
        np.testing.assert_allclose(single[0], probs[i], rtol=1e-5, atol=1e-6)
    (batch64,) = sess.run(None, {"INPUT": np.concatenate([images] * 13)[:64]})
    assert batch64.shape == (64, 10)
    np.testing.assert_allclose(batch64[5:10], probs, rtol=1e-5, atol=1e-6)
    # Real computation: solid red, green and blue images give different distributions.
    colours = np.eye(3, dtype=np.float32)[:, :, None, None] * np.ones((1, 1, 64, 64), np.float32)
    (colour_probs,) = sess.run(None, {"INPUT": colours})
    assert not np.allclose(colour_probs[0], colour_probs[1], atol=1e-3)
    assert not np.allclose(colour_probs[1], colour_probs[2], atol=1e-3)
    # The same weights as a fresh build: fixed seeds, not a random model per build.
    rebuilt = ort.InferenceSession(
        br.make_conv_compute_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_array_equal(rebuilt.run(None, {"INPUT": colours})[0], colour_probs)


def test_mlp_compute_is_a_bench_model_with_server_default_ort_options(tmp_path: Path) -> None:
    # Not in the example repository (36 MB of weights): bench/run.py builds it on its own.
    assert "mlp_compute" not in br.BUILDERS and "mlp_compute" not in MODELS
    from examples.mlp_compute import BENCH_BUILDERS

    model_dir = BENCH_BUILDERS["mlp_compute"](tmp_path)
    assert model_dir == tmp_path / "mlp_compute"
    import onnx

    model = onnx.load(str(model_dir / "1" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == [
        "MatMul",
        "Relu",
        "MatMul",
        "Relu",
        "MatMul",
        "Relu",
        "MatMul",
    ]
    assert [tuple(t.dims) for t in model.graph.initializer] == [
        (256, 2048),
        (2048, 2048),
        (2048, 2048),
        (2048, 16),
    ]

    sess = _session(tmp_path, "mlp_compute")
    (inp,), (out,) = sess.get_inputs(), sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("INPUT", "tensor(float)", ["batch", 256])
    assert (out.name, out.type, out.shape) == ("OUTPUT", "tensor(float)", ["batch", 16])
    x = np.random.default_rng(5).standard_normal((4, 256)).astype(np.float32)
    (y,) = sess.run(None, {"INPUT": x})
    assert y.shape == (4, 16) and np.all(np.isfinite(y))
    assert float(np.std(y)) > 0.05  # He-scaled weights: activations neither vanish nor explode
    (single,) = sess.run(None, {"INPUT": x[2:3]})
    np.testing.assert_allclose(single[0], y[2], rtol=1e-4, atol=1e-4)

    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    cfg = _parse_config(pb, tmp_path, "mlp_compute")
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("mlp_compute", "onnxruntime_onnx", 64)
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16, 32, 64]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, pb.ModelInstanceGroup.KIND_CPU)]
    assert dict(cfg.parameters) == {}  # the server's ONNX Runtime defaults apply


def test_identity_bytes(repo: Path) -> None:
    sess = _session(repo, "identity_bytes")
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.type) == ("INPUT", "tensor(string)")
    data = np.array(["hello", "", "wörld", "a" * 1000], dtype=object)
    (out,) = sess.run(None, {"INPUT": data})
    assert list(out) == list(data)


def test_configs_parse_as_triton_model_config(repo: Path) -> None:
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    configs = {name: _parse_config(pb, repo, name) for name in MODELS}
    for name, cfg in configs.items():
        assert cfg.name == name
        assert cfg.platform == "onnxruntime_onnx"

    simple = configs["simple"]
    assert simple.max_batch_size == 8
    assert not simple.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in simple.input] == [
        ("INPUT0", pb.TYPE_INT32, [16]),
        ("INPUT1", pb.TYPE_INT32, [16]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in simple.output] == [
        ("OUTPUT0", pb.TYPE_INT32, [16]),
        ("OUTPUT1", pb.TYPE_INT32, [16]),
    ]

    batching = configs["simple_batching"]
    assert batching.max_batch_size == 64
    assert batching.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(batching.input) == list(simple.input)
    assert list(batching.output) == list(simple.output)

    classifier = configs["classifier"]
    assert classifier.max_batch_size == 8
    assert list(classifier.input[0].dims) == [3, 32, 32]
    assert classifier.input[0].data_type == pb.TYPE_FP32
    assert classifier.output[0].name == "PROBABILITIES"
    assert list(classifier.output[0].dims) == [10]
    assert classifier.output[0].label_filename == "labels.txt"

    dense, nobatch = configs["dense_compute"], configs["dense_compute_nobatch"]
    assert dense.dynamic_batching.max_queue_delay_microseconds == 2000
    assert not nobatch.HasField("dynamic_batching")
    for cfg in (dense, nobatch):
        assert cfg.max_batch_size == 64
        assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT", [256])]
        assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT", [256])]
        assert len(cfg.instance_group) == 1
        assert cfg.instance_group[0].count == 1
        assert cfg.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
        assert cfg.parameters["intra_op_thread_count"].string_value == "1"

    conv, conv_nobatch = configs["conv_compute"], configs["conv_compute_nobatch"]
    assert conv.dynamic_batching.max_queue_delay_microseconds == 2000
    assert not conv_nobatch.HasField("dynamic_batching")
    for cfg in (conv, conv_nobatch):
        assert cfg.max_batch_size == 64
        assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
            ("INPUT", pb.TYPE_FP32, [3, 64, 64])
        ]
        assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [
            ("PROBABILITIES", pb.TYPE_FP32, [10])
        ]
        assert len(cfg.instance_group) == 1
        assert cfg.instance_group[0].count == 1
        assert cfg.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
        assert cfg.parameters["intra_op_thread_count"].string_value == "1"

    identity = configs["identity_bytes"]
    assert identity.max_batch_size == 0
    assert [(i.name, i.data_type, list(i.dims)) for i in identity.input] == [
        ("INPUT", pb.TYPE_STRING, [-1])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in identity.output] == [
        ("OUTPUT", pb.TYPE_STRING, [-1])
    ]


def test_cli_builds_into_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert br.main(["--output", str(tmp_path / "repo")]) == 0
    from examples.pipeline import PIPELINE_BUILDERS
    from examples.streaming import STREAMING_MODELS

    names = sorted([*MODELS, *PIPELINE_BUILDERS, *STREAMING_MODELS])
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == names
    assert f"built {len(names)} models" in capsys.readouterr().out


def test_files_are_readable_by_other_users(tmp_path: Path) -> None:
    """The image's server runs as uid 1000: a repository built by another user and mounted at
    /models must be readable to it (mkstemp alone would leave every file 0600)."""
    old = os.umask(0o022)
    try:
        repo = br.build_repository(tmp_path / "models")
    finally:
        os.umask(old)
    files = [p for p in repo.rglob("*") if p.is_file()]
    assert files and {p.name for p in files} >= {"config.pbtxt", "model.onnx", "model.py"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o644)}
