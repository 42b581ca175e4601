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


def _desc_dims(acl, om_path) -> dict:
    """What get_input_dims / get_input_dims_v2 / get_input_size_by_index say for input 0."""
    acl.init()
    desc = acl.mdl.create_desc()
    try:
        assert acl.mdl.get_desc_from_file(desc, str(om_path)) == 0
        v1, _ = acl.mdl.get_input_dims(desc, 0)
        v2, _ = acl.mdl.get_input_dims_v2(desc, 0)
        return {
            "v1": v1["dims"],
            "v2": v2["dims"],
            "size": acl.mdl.get_input_size_by_index(desc, 0),
        }
    finally:
        acl.mdl.destroy_desc(desc)
        acl.finalize()


def test_dynamic_aipp_input_reads_n_and_minus_ones_as_ge_reports_it(acl_emu, tmp_path):
    batched = _desc_dims(acl_emu, omf.aipp_model(tmp_path / "b.om", mode="dynamic"))
    assert batched == {"v1": [-1, -1, -1, -1], "v2": [-1, -1, -1, -1], "size": 4 * 3 * 256}
    static = omf.aipp_model(tmp_path / "s.om", mode="dynamic", gears=None, max_src_image_size=1000)
    assert _desc_dims(acl_emu, static) == {
        "v1": [1, -1, -1, -1],
        "v2": [1, -1, -1, -1],
        "size": 1000,
    }


def test_dynamic_aipp_with_a_static_batch_loads_and_runs(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, DYNAMIC_AIPP, om=omf.aipp_model, mode="dynamic", gears=None)
    config = prepared[0]
    assert config.max_batch_size == 1
    assert [(i.name, list(i.dims)) for i in config.input] == [("image", [24, 16, 1])]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"image": yuv(1, value=3)})
    np.testing.assert_array_equal(out["total"][:, 0], [(3 - 1) * 0.5 * 384])
    instance_thread.run(instance.unload)


SOURCE_32 = DYNAMIC_AIPP.replace('"16" }', '"32" }')


def test_dynamic_aipp_output_other_than_the_model_input_fails_the_load(
    acl_emu, tmp_path, instance_thread
):
    prepared = prepare(tmp_path, SOURCE_32, om=omf.aipp_model, mode="dynamic", max_size=(32, 32))
    assert list(prepared[0].input[0].dims) == [48, 32, 1]  # the 32x32 source the client sends
    with pytest.raises(
        BackendError,
        match=r"acl.mdl.set_input_aipp failed with error 100000 .*batch 4, a 32x32 "
        r"YUV420SP_U8 source and an output of 32x32 .*ModelAippOutputW = 16",
    ):
        instance_thread.run(backend(prepared).load)


def test_dynamic_aipp_crop_to_the_model_input_runs(acl_emu, tmp_path, instance_thread):
    text = SOURCE_32 + (
        'parameters { key: "aipp_crop_params" value { string_value: "1,8,8,16,16" } }\n'
    )
    prepared = prepare(tmp_path, text, om=omf.aipp_model, mode="dynamic", max_size=(32, 32))
    instance = backend(prepared)
    instance_thread.run(instance.load)
    image = np.full((2, 48, 32, 1), 2, dtype=np.uint8)
    out = instance_thread.run(instance.execute, {"image": image})
    assert out["total"].shape == (2, 1)  # the emulator sums the source: no crop emulated
    instance_thread.run(instance.unload)


def test_dynamic_aipp_sources_beyond_max_src_image_size_are_refused(acl_emu, tmp_path):
    with pytest.raises(
        BackendError,
        match=r"4 32x32 YUV420SP_U8 source image\(s\) take 6144 bytes, more than the "
        r"model's max_src_image_size of 3072",
    ):
        prepare(tmp_path, SOURCE_32, om=omf.aipp_model, mode="dynamic", max_size=(16, 16))


def test_dynamic_aipp_yuv420sp_of_odd_size_is_refused(acl_emu, tmp_path):
    width = 'aipp_src_image_size_w" value { string_value: '
    text = DYNAMIC_AIPP.replace(width + '"16"', width + '"15"')
    with pytest.raises(
        BackendError, match="YUV420SP_U8 source must have an even width and height, not 15x16"
    ):
        prepare(tmp_path, text, om=omf.aipp_model, mode="dynamic")


@pytest.mark.parametrize(
    ("fmt", "dims", "row"), [("XRGB8888_U8", [16, 16, 4], 1024), ("YUV400_U8", [16, 16, 1], 256)]
)
def test_dynamic_aipp_takes_the_formats_the_binding_accepts(
    acl_emu, tmp_path, instance_thread, fmt, dims, row
):
    # GE's aipp_param_check.cpp and the aclAippInputFormat docs accept all four for dynamic AIPP
    text = DYNAMIC_AIPP.replace('"YUV420SP_U8"', f'"{fmt}"').replace("aipp_csc_params", "aipp_x")
    text = text[: text.index('parameters { key: "aipp_x"')]
    prepared = prepare(
        tmp_path, text, om=omf.aipp_model, mode="dynamic", max_src_image_size=4 * 1024
    )
    assert list(prepared[0].input[0].dims) == dims
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"image": np.full([1, *dims], 3, np.uint8)})
    np.testing.assert_array_equal(out["total"][:, 0], [(3 - 1) * 0.5 * row])
    instance_thread.run(instance.unload)


def test_dynamic_aipp_with_image_size_gears_is_refused_with_the_reason(acl_emu, tmp_path):
    om = omf.with_fields(
        omf.hw_model, aipp={"mode": "dynamic", "input": "image", "format": 1, "src": [32, 24]}
    )
    with pytest.raises(
        BackendError, match="dynamic AIPP in a model compiled with --dynamic_image_size"
    ):
        prepare(tmp_path, DYNAMIC_AIPP, om=om)


# -- 2b. static AIPP YUV420SP with --dynamic_image_size ----------------------------------------
def test_yuv_image_size_model_reports_minus_ones_and_the_source_channels(acl_emu, tmp_path):
    dims = _desc_dims(acl_emu, omf.yuv_hw_model(tmp_path / "m.om"))
    assert dims == {"v1": [1, -1, -1, 3], "v2": [1, -1, -1, 1], "size": 48 * 24}


def yuv_planes(h: int, w: int, y: int = 1, uv: int = 2) -> np.ndarray:
    image = np.full((1, h * 3 // 2, w, 1), uv, dtype=np.uint8)
    image[:, :h] = y
    return image


def test_yuv_image_size_gears_use_the_yuv_layout(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=omf.yuv_hw_model)
    config = prepared[0]
    assert config.max_batch_size == 1
    assert [list(i.dims) for i in config.input] == [[-1, -1, 1]]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    model_id = instance._model.model_id
    out = instance_thread.run(instance.execute, {"image": yuv_planes(16, 16)})
    assert out["total"][0, 0] == 16 * 16 * 1 + 8 * 16 * 2
    assert acl_emu._emu.last_execution(model_id)["shape_gear"] == (16, 16)  # H, not 1.5 x H
    out = instance_thread.run(instance.execute, {"image": yuv_planes(12, 10)})
    seen = acl_emu._emu.last_execution(model_id)
    assert seen["shape_gear"] == (16, 16) and out["total"][0, 0] == 12 * 10 + 6 * 10 * 2
    planes = seen["inputs"]["image"].reshape(24, 16)
    assert (planes[:12, :10] == 1).all() and (planes[16:22, :10] == 2).all()  # planes apart
    assert planes[12:16].sum() == 0 and planes[22:].sum() == 0 and planes[:, 10:].sum() == 0
    out = instance_thread.run(instance.execute, {"image": yuv_planes(32, 24)})
    assert acl_emu._emu.last_execution(model_id)["shape_gear"] == (32, 24)
    with pytest.raises(
        InvalidArgument, match=r"YUV420SP image: 25 rows of 16 bytes.*multiple of 3"
    ):
        instance_thread.run(instance.execute, {"image": np.zeros((1, 25, 16, 1), np.uint8)})
    with pytest.raises(
        InvalidArgument,
        match=r"\[1, 60, 16, 1\] fit none of the model's compiled image sizes "
        r"\(HxW\): 16x16, 32x24",
    ):
        instance_thread.run(instance.execute, {"image": np.zeros((1, 60, 16, 1), np.uint8)})
    instance_thread.run(instance.unload)


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
