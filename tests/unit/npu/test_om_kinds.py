"""The `.om` kinds people compile, through the Ascend backend on the pyACL emulator: static side
inputs beside a dynamic batch, static and dynamic AIPP, dynamic image size and dynamic dims,
and reading a description without loading the model."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import BackendError
from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import DataType
from tests.support import om_fixtures as omf
from tests.support.npu_harness import backend, prepare

IM_INFO = np.array([[2.0, 0.5, 9.0]], dtype=np.float32)


def images(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) + 1


def executions(acl, instance) -> int:
    return acl._emu.last_execution(instance._model.model_id)["count"]


# -- 1. dynamic batch with static side inputs --------------------------------------------------
def test_side_input_model_is_described_with_its_own_dims(acl_emu, tmp_path):
    config, _, _ = prepare(tmp_path, om=omf.side_input_model)
    assert config.max_batch_size == 8
    assert {i.name: list(i.dims) for i in config.input} == {"images": [4], "im_info": [3]}
    assert {o.name: list(o.dims) for o in config.output} == {"boxes": [4], "score": [1]}


def test_side_input_rows_that_agree_run_as_one_execution(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, om=omf.side_input_model))
    instance_thread.run(instance.load)
    x = images(3)
    out = instance_thread.run(instance.execute, {"images": x, "im_info": np.repeat(IM_INFO, 3, 0)})
    np.testing.assert_array_equal(out["boxes"], x * 2.0)
    np.testing.assert_array_equal(out["score"], x.sum(axis=1, keepdims=True))
    seen = acl_emu._emu.last_execution(instance._model.model_id)
    assert seen["count"] == 1 and seen["gear"] == 4
    np.testing.assert_array_equal(seen["inputs"]["im_info"], IM_INFO)  # fed once, as compiled
    instance_thread.run(instance.unload)


def test_side_input_rows_that_differ_run_separately(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, om=omf.side_input_model))
    instance_thread.run(instance.load)
    x = images(4)
    info = np.array([[2, 0, 0], [2, 0, 0], [3, 0, 0], [2, 0, 0]], dtype=np.float32)
    out = instance_thread.run(instance.execute, {"images": x, "im_info": info})
    np.testing.assert_array_equal(out["boxes"], x * info[:, :1])
    assert executions(acl_emu, instance) == 3  # rows 0-1, row 2, row 3
    instance_thread.run(instance.unload)


def test_side_input_without_a_leading_one_is_served_unbatched(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=omf.side_input_model, side_dims=(2, 3))
    config = prepared[0]
    assert config.max_batch_size == 0
    assert {i.name: list(i.dims) for i in config.input} == {"images": [-1, 4], "im_info": [2, 3]}
    instance = backend(prepared)
    instance_thread.run(instance.load)
    side = np.array([[4, 0, 0], [1, 1, 1]], dtype=np.float32)
    out = instance_thread.run(instance.execute, {"images": images(3), "im_info": side})
    np.testing.assert_array_equal(out["boxes"], images(3) * 4)
    assert out["boxes"].shape == (3, 4)
    instance_thread.run(instance.unload)


def test_side_input_without_a_leading_one_refuses_batching(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, "max_batch_size: 8", om=omf.side_input_model, side_dims=(2, 3))
    with pytest.raises(
        BackendError,
        match=r"cannot be stacked .*im_info have no leading 1.*"
        r"max_batch_size: 0",
    ):
        instance_thread.run(backend(prepared).load)


def test_outputs_reported_at_the_largest_gear_are_batched(acl_emu, tmp_path):
    from npu.om_model import describe_file

    info = describe_file(omf.side_input_model(tmp_path / "m.om"), 0)
    assert [(t.name, t.dims, t.batched) for t in info.outputs] == [
        ("boxes", (-1, 4), True),
        ("score", (-1, 1), True),
    ]
    assert [(t.name, t.dims, t.batched) for t in info.inputs] == [
        ("images", (-1, 4), True),
        ("im_info", (1, 3), False),
    ]


# -- 2. AIPP ----------------------------------------------------------------------------------
def yuv(n: int, value: int = 3) -> np.ndarray:
    return np.full((n, 24, 16, 1), value, dtype=np.uint8)  # 16x16 YUV420SP: h * 1.5 rows


def test_static_aipp_takes_the_source_image(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=omf.aipp_model)
    config = prepared[0]
    assert config.max_batch_size == 4
    assert [list(i.dims) for i in config.input] == [[24, 16, 1]]  # get_input_dims_v2
    assert DataType.Name(config.input[0].data_type) == "TYPE_UINT8"
    instance = backend(prepared)
    instance_thread.run(instance.load)
    x = yuv(3)
    x[1] = 1
    out = instance_thread.run(instance.execute, {"image": x})
    np.testing.assert_array_equal(out["total"][:, 0], [3 * 384, 384, 3 * 384])
    instance_thread.run(instance.unload)


DYNAMIC_AIPP = """
parameters { key: "aipp_input_format" value { string_value: "YUV420SP_U8" } }
parameters { key: "aipp_src_image_size_w" value { string_value: "16" } }
parameters { key: "aipp_src_image_size_h" value { string_value: "16" } }
parameters { key: "aipp_dtc_pixel_mean" value { string_value: "1,0,0,0" } }
parameters { key: "aipp_pixel_var_reci" value { string_value: "0.5,1,1,1" } }
parameters { key: "aipp_csc_params" value { string_value:
  "1,256,443,0,256,-86,-178,256,0,350,0,0,0,0,128,128" } }
"""


def test_dynamic_aipp_is_set_from_the_config(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, DYNAMIC_AIPP, om=omf.aipp_model, mode="dynamic", max_size=(32, 32))
    config = prepared[0]
    assert [i.name for i in config.input] == ["image"]  # ascend_dynamic_aipp_data is hidden
    assert list(config.input[0].dims) == [24, 16, 1]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"image": yuv(2, value=5)})
    np.testing.assert_array_equal(out["total"][:, 0], [(5 - 1) * 0.5 * 384] * 2)
    assert acl_emu._emu.stats()["aipp_sets"] == 0  # created, applied and destroyed at load
    instance_thread.run(instance.unload)


def test_dynamic_aipp_without_parameters_says_which(acl_emu, tmp_path, instance_thread):
    config, model_dir, version_dir = prepare(
        tmp_path, om=omf.aipp_model, mode="dynamic", complete=False
    )
    from npu.backend import AscendBackend

    with pytest.raises(
        BackendError,
        match="input 'image' takes dynamic AIPP: set the model config parameters aipp_input_format",
    ):
        AscendBackend.auto_complete(config, model_dir, version_dir)


def test_dynamic_aipp_rejects_a_bad_parameter(acl_emu, tmp_path):
    text = DYNAMIC_AIPP.replace('"0.5,1,1,1"', '"0.5,1"')
    with pytest.raises(BackendError, match="'aipp_pixel_var_reci' must be 4 comma-separated"):
        prepare(tmp_path, text, om=omf.aipp_model, mode="dynamic", max_size=(32, 32))


# -- 3. dynamic image size and dynamic dims ----------------------------------------------------
def test_dynamic_hw_runs_the_smallest_gear_that_fits(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=omf.hw_model)
    config = prepared[0]
    assert config.max_batch_size == 1
    assert [list(i.dims) for i in config.input] == [[3, -1, -1]]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    exact = np.ones((1, 3, 16, 16), dtype=np.float32)
    out = instance_thread.run(instance.execute, {"image": exact})
    assert out["grid"].shape == (1, 3, 4, 4) and out["total"][0, 0] == 3 * 256
    smaller = np.ones((1, 3, 20, 10), dtype=np.float32)  # padded into the 32x24 gear
    out = instance_thread.run(instance.execute, {"image": smaller})
    assert out["grid"].shape == (1, 3, 8, 6) and out["total"][0, 0] == 3 * 200
    assert acl_emu._emu.last_execution(instance._model.model_id)["shape_gear"] == (32, 24)
    with pytest.raises(
        InvalidArgument,
        match=r"'image' \[1, 3, 40, 8\] fit none of the model's "
        r"compiled image sizes \(HxW\): 16x16, 32x24",
    ):
        instance_thread.run(instance.execute, {"image": np.ones((1, 3, 40, 8), np.float32)})
    instance_thread.run(instance.unload)


def test_dynamic_dims_runs_the_smallest_gear_that_fits(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=omf.dims_model)
    assert [list(i.dims) for i in prepared[0].input] == [[-1]]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    tokens = np.arange(1, 6, dtype=np.float32).reshape(1, 5)
    out = instance_thread.run(instance.execute, {"tokens": tokens})
    np.testing.assert_array_equal(out["echo"], np.pad(tokens, ((0, 0), (0, 3))))
    assert out["total"][0, 0] == 15
    with pytest.raises(
        InvalidArgument,
        match=r"fit none of the model's compiled dims: "
        r"\[1, 8\]; \[1, 16\]; \[1, 32\]",
    ):
        instance_thread.run(instance.execute, {"tokens": np.ones((1, 33), np.float32)})
    instance_thread.run(instance.unload)


# -- 4. describe without a device load ---------------------------------------------------------
def test_auto_complete_reads_the_file_without_loading(acl_emu, tmp_path, monkeypatch):
    loads = []
    real = acl_emu.mdl.load_from_file
    monkeypatch.setattr(
        acl_emu.mdl, "load_from_file", lambda path: loads.append(path) or real(path)
    )
    config, _, _ = prepare(tmp_path, om=omf.side_input_model)
    assert loads == [] and config.max_batch_size == 8
    monkeypatch.delattr(acl_emu.mdl, "get_desc_from_file")  # an older binding: load to describe
    prepare(tmp_path / "old", om=omf.side_input_model)
    assert len(loads) == 1


# -- 5. dynamic dims over several inputs: GE's gears follow ATC's --input_shape ----------------
def test_dims_gears_follow_the_input_shape_order(acl_emu, tmp_path, instance_thread):
    """--input_shape="weights:-1,2;tokens:1,-1" (bias left out): each gear is weights' dims
    then tokens', so gear [2, 2, 1, 8] is weights [2, 2] and tokens [1, 8]."""
    prepared = prepare(tmp_path, om=omf.dims_pair_model)
    config = prepared[0]
    assert config.max_batch_size == 0
    assert {i.name: list(i.dims) for i in config.input} == {
        "tokens": [1, -1],
        "weights": [-1, 2],
        "bias": [3],
    }
    instance = backend(prepared)
    instance_thread.run(instance.load)
    assert instance._model.info.shape_gears == (
        ((1, 8), (2, 2), (3,)),
        ((1, 16), (4, 2), (3,)),
    )
    tokens = np.arange(1, 6, dtype=np.float32).reshape(1, 5)
    weights = np.arange(6, dtype=np.float32).reshape(3, 2)
    bias = np.array([7.0, 8.0, 9.0], dtype=np.float32)
    out = instance_thread.run(
        instance.execute, {"tokens": tokens, "weights": weights, "bias": bias}
    )
    assert acl_emu._emu.last_execution(instance._model.model_id)["shape_gear"] == (4, 16)
    np.testing.assert_array_equal(out["echo"], np.pad(tokens, ((0, 0), (0, 11))))
    np.testing.assert_array_equal(out["wsum"], [[1.0], [5.0], [9.0], [0.0]])
    np.testing.assert_array_equal(out["bias_out"], bias)
    with pytest.raises(InvalidArgument, match=r"'weights' \[5, 2\]"):
        instance_thread.run(
            instance.execute,
            {"tokens": tokens, "weights": np.ones((5, 2), np.float32), "bias": bias},
        )
    instance_thread.run(instance.unload)


def test_dims_gears_two_orders_explain_need_the_input_shape_parameter(
    acl_emu, tmp_path, instance_thread
):
    with pytest.raises(BackendError, match=r"fit more than one order of its inputs \(a;b or b;a\)"):
        prepare(tmp_path / "plain", om=omf.dims_twin_model)
    text = 'parameters { key: "input_shape" value { string_value: "b:1,-1;a:1,-1" } }'
    prepared = prepare(tmp_path, text, om=omf.dims_twin_model)
    instance = backend(prepared)
    instance_thread.run(instance.load)
    a = np.ones((1, 3), np.float32)
    b = np.full((1, 7), 2.0, np.float32)
    out = instance_thread.run(instance.execute, {"a": a, "b": b})
    assert acl_emu._emu.last_execution(instance._model.model_id)["shape_gear"] == (8, 4)
    np.testing.assert_array_equal(out["a_echo"], np.pad(a, ((0, 0), (0, 1))))
    np.testing.assert_array_equal(out["b_echo"], np.pad(b, ((0, 0), (0, 1))))
    instance_thread.run(instance.unload)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "tokens;weights",
            r"gear 0 \[2, 2, 1, 8\] gives input 'tokens' 2 on axis 0 \(position 0\), "
            r"the model has 1 there",
        ),
        (
            "weights:-1,2",
            r"lists weights \[-1, 2\]: 2 dims, but each of the model's --dynamic_dims gears "
            r"has 4 \(first gear \[2, 2, 1, 8\]\)",
        ),
        ("weights:-1,3;tokens:1,-1", r"gives input 'weights' dims \[-1, 3\], the model has"),
        ("weights;mask", r"names 'mask', which is not an input of the model"),
    ],
)
def test_an_input_shape_parameter_the_gears_refute_is_refused(acl_emu, tmp_path, value, message):
    text = f'parameters {{ key: "input_shape" value {{ string_value: "{value}" }} }}'
    with pytest.raises(BackendError, match=message):
        prepare(tmp_path, text, om=omf.dims_pair_model)


# -- 6. batched or not, from the model's gear table --------------------------------------------
def test_a_static_output_at_the_largest_gear_is_not_split_per_request(
    acl_emu, tmp_path, instance_thread
):
    """`priors` [8, 2] looks like a batched output at the largest gear in the desc; each gear's
    output dims say it is static, so a stacking config is refused with what to write instead,
    and served unbatched it comes back whole."""
    prepared = prepare(tmp_path / "guess", om=omf.static_output_model)
    assert prepared[0].max_batch_size == 8  # auto-complete reads the file: the guess remains
    with pytest.raises(
        BackendError, match=r"output\(s\) priors have no batch axis\): set max_batch_size: 0"
    ):
        instance_thread.run(backend(prepared).load)
    text = 'input [ { name: "images" dims: [ -1, 4 ] } ]'  # full rank: no batching
    prepared = prepare(tmp_path, text, om=omf.static_output_model)
    assert prepared[0].max_batch_size == 0
    instance = backend(prepared)
    instance_thread.run(instance.load)
    assert [(t.name, t.dims, t.batched) for t in instance._model.info.outputs] == [
        ("boxes", (-1, 4), True),
        ("priors", (8, 2), False),
    ]
    out = instance_thread.run(instance.execute, {"images": images(3)})
    np.testing.assert_array_equal(out["boxes"], images(3) + 1)
    np.testing.assert_array_equal(out["priors"], np.array(omf.PRIORS, dtype=np.float32))
    instance_thread.run(instance.unload)


def test_a_side_input_whose_first_dim_is_the_largest_gear_is_not_batched(acl_emu, tmp_path):
    """The desc shows batched inputs at -1 (GE's origin dims): anchors [8, 2] beside images
    [-1, 4] is a static side input, so requests cannot be stacked."""
    from npu.om_model import describe_file

    info = describe_file(omf.side_input_model(tmp_path / "m.om", side_dims=(8, 2)), 0)
    assert [(t.name, t.dims, t.batched) for t in info.inputs] == [
        ("images", (-1, 4), True),
        ("im_info", (8, 2), False),
    ]
    config, _, _ = prepare(tmp_path, om=omf.side_input_model, side_dims=(8, 2))
    assert config.max_batch_size == 0
    assert {i.name: list(i.dims) for i in config.input} == {"images": [-1, 4], "im_info": [8, 2]}


def test_where_the_binding_cannot_tell_the_guess_remains(
    acl_emu, tmp_path, instance_thread, monkeypatch
):
    """A binding whose get_cur_output_dims fails for dynamic models (runtime 2.0) leaves the
    guess from the desc: an output at the largest gear counts as batched."""
    monkeypatch.setattr(acl_emu.mdl, "get_cur_output_dims", lambda desc, index: ({}, 100000))
    text = 'input [ { name: "images" dims: [ -1, 4 ] } ]'
    instance = backend(prepare(tmp_path, text, om=omf.static_output_model))
    instance_thread.run(instance.load)
    assert [(t.name, t.batched) for t in instance._model.info.outputs] == [
        ("boxes", True),
        ("priors", True),
    ]
    instance_thread.run(instance.unload)
