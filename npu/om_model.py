"""An `.om` model on the device: one loaded copy with its IO memory, and reading a model's
description without loading it.

`OmModel` is one loaded copy in the current context whose input and output device buffers and
datasets (hidden gear and dynamic-AIPP inputs included) are made once at load and reused by
every batch, so a request never allocates device memory. Each batch runs at the smallest gear
that holds it (npu/gears.py), padded on the way in and cut back on the way out.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import npu.teardown  # noqa: F401  (importing it arms the ordered NPU teardown at exit)
from backends.base import BackendError
from npu import acl as npu_acl
from npu import aipp as npu_aipp
from npu import constants as K
from npu import gears
from npu.description import ModelDescription, read_description
from npu.device import DeviceSession, ensure_initialised
from npu.errors import AclError, check, unwrap

log = logging.getLogger(__name__)

# Where an output's bytes go: called with (shape, dtype), returns an empty array to fill.
Allocate = Callable[[tuple[int, ...], Any], np.ndarray]


def describe_file(path: Path, device_id: int, input_shape: str | None = None) -> ModelDescription:
    """The model's description without loading it (acl.mdl.get_desc_from_file, which reads the
    file and needs no device memory), falling back to a load on a short-lived thread of its own
    where the binding lacks that call or it fails (pyACL needs a context to load, and the
    caller's thread must not be left holding one)."""
    acl = npu_acl.load()
    if not path.is_file():
        raise BackendError(missing_model(path))
    if hasattr(acl.mdl, "get_desc_from_file"):
        ensure_initialised(acl)
        desc = acl.mdl.create_desc()
        if desc:
            try:
                if acl.mdl.get_desc_from_file(desc, str(path)) == K.SUCCESS:
                    return read_description(acl, desc, input_shape)
                log.info("acl.mdl.get_desc_from_file(%s) failed; loading it to describe it", path)
            finally:
                acl.mdl.destroy_desc(desc)
    return _describe_by_loading(acl, path, device_id, input_shape)


def missing_model(path: Path) -> str:
    """The message for a missing .om, saying what to do with an ONNX / TF graph found instead
    (what a config written for the npu_ge backend, which compiles graphs itself, points at)."""
    message = f"model file {path} does not exist"
    graphs = sorted(p.name for p in path.parent.glob("*") if p.suffix in (".onnx", ".pb"))
    if graphs:
        message += (
            f"; the directory holds {', '.join(graphs[:3])}: this backend runs ATC-compiled "
            ".om files, so compile it with atc (--framework=5 for ONNX) and name the result "
            "model.om (or set default_model_filename), or serve the ONNX with backend "
            '"onnxruntime"'
        )
    return message


def _describe_by_loading(
    acl, path: Path, device_id: int, input_shape: str | None
) -> ModelDescription:
    outcome: list = []

    def probe() -> None:
        try:
            session = DeviceSession.open(acl, device_id, stream=False, telemetry=False)
        except BaseException as exc:
            outcome.append(exc)
            return
        model = None
        try:
            model = OmModel(session)
            model.load_description(path, input_shape)
            outcome.append(model.info)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            problems = (model.close() if model else []) + session.close()
            for problem in problems:
                log.warning("releasing the description probe of %s: %s", path, problem)

    thread = threading.Thread(target=probe, name=f"ascend-describe-{device_id}", daemon=True)
    thread.start()
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _load_hint(acl) -> str:
    """pyACL's own text, plus what a failed load most often means on a working device."""
    from npu.errors import recent_message

    try:
        soc = acl.get_soc_name()
    except Exception:  # an old binding: the code still speaks
        soc = ""
    hint = (
        f"check that the .om was compiled by ATC with --soc_version={soc} (this device) and "
        "by a CANN no newer than the one installed"
        if soc
        else ""
    )
    return "; ".join(p for p in (recent_message(acl), hint) if p)


@dataclass
class _Slot:
    """One device buffer of a dataset."""

    ptr: int
    size: int
    buffer: int = 0


@dataclass
class _Dataset:
    handle: int
    slots: list[_Slot] = field(default_factory=list)


class OmModel:
    """One loaded copy of a model in a DeviceSession's context. Not thread-safe: the instance's
    own thread is its only user, which is also what pyACL requires of a model id."""

    def __init__(self, session: DeviceSession) -> None:
        self.session = session
        self.acl = session.acl
        self.model_id = 0
        self.desc = 0
        self.info = ModelDescription((), ())
        self._inputs: _Dataset | None = None
        self._outputs: _Dataset | None = None
        self._allocate: Allocate = np.empty

    @classmethod
    def load(
        cls,
        session: DeviceSession,
        path: Path,
        aipp: npu_aipp.AippSettings | None = None,
        input_shape: str | None = None,
    ) -> OmModel:
        """Load a copy; `input_shape` is ATC's --input_shape where dims gears need it."""
        model = cls(session)
        session.models.append(model)  # teardown at exit finds it here if nobody unloads it
        try:
            model.load_description(path, input_shape)
            model.info = npu_aipp.describe_with(model.info, aipp)
            model._allocate_io()
            model._outputs_from_gears()
            if model.info.aipp_index is not None and aipp is not None:
                assert model._inputs is not None  # allocated just above
                npu_aipp.apply(
                    model.acl,
                    model.model_id,
                    model._inputs.handle,
                    model.info.aipp_index,
                    max(model.info.batch_sizes, default=1),
                    aipp,
                )
        except BaseException:
            for problem in model.close():
                log.warning("cleaning up a failed load of %s: %s", path, problem)
            raise
        return model

    def load_description(self, path: Path, input_shape: str | None = None) -> None:
        acl = self.acl
        model_id, ret = acl.mdl.load_from_file(str(path))
        if ret != K.SUCCESS:
            raise AclError(f"acl.mdl.load_from_file({path})", ret, _load_hint(acl))
        self.model_id = model_id
        self.desc = acl.mdl.create_desc()
        if not self.desc:
            raise BackendError("acl.mdl.create_desc returned a null desc")
        check(acl, acl.mdl.get_desc(self.desc, self.model_id), "acl.mdl.get_desc")
        self.info = read_description(acl, self.desc, input_shape)

    def _allocate_io(self) -> None:
        mdl = self.acl.mdl
        info = self.info
        rows = max(info.batch_sizes, default=1)
        if not info.shape_kind:
            for tensor in info.inputs + info.outputs:
                need = tensor.row_bytes * rows if tensor.batched else tensor.static_bytes
                if tensor.size < need:
                    raise BackendError(
                        f"tensor '{tensor.raw_name}' reports {tensor.size} bytes, "
                        f"its dims {list(tensor.dims)} need {need}"
                    )
        self._inputs = _Dataset(0)
        self._fill(
            self._inputs,
            [mdl.get_input_size_by_index(self.desc, i) for i in range(info.num_inputs)],
            "input",
        )
        self._outputs = _Dataset(0)
        self._fill(self._outputs, [t.size for t in info.outputs], "output")

    def _outputs_from_gears(self) -> None:
        """Which outputs of a dynamic-batch model are batched, from the model's own table of
        output dims per gear (GE answers get_cur_output_dims from it after each
        set_dynamic_batch_size, without an execution): batched when axis 0 is the gear at
        every gear, static when the dims never change. The desc reports batched outputs at the
        largest gear, so a static output whose first dim equals it looks the same there.
        Where the binding cannot answer, the guess from the desc stays."""
        info, acl = self.info, self.acl
        if not info.gears or info.gear_index is None or self._inputs is None:
            return
        seen: dict[int, list[tuple[int, ...]]] = {t.index: [] for t in info.outputs}
        for gear in info.gears:
            check(
                acl,
                acl.mdl.set_dynamic_batch_size(
                    self.model_id, self._inputs.handle, info.gear_index, gear
                ),
                f"acl.mdl.set_dynamic_batch_size({gear})",
            )
            for index, shapes in seen.items():
                dims, ret = acl.mdl.get_cur_output_dims(self.desc, index)
                if ret != K.SUCCESS or not isinstance(dims, dict) or "dims" not in dims:
                    log.info(
                        "acl.mdl.get_cur_output_dims(%d) failed with %s: which outputs are "
                        "batched stays guessed from their first dim",
                        index,
                        ret,
                    )
                    return
                count = int(dims.get("dimCount", len(dims["dims"])))
                shapes.append(tuple(int(d) for d in dims["dims"][:count]))
        outputs = []
        for tensor in info.outputs:
            shapes = seen[tensor.index]
            if all(s[:1] == (g,) for s, g in zip(shapes, info.gears, strict=True)) and (
                len({s[1:] for s in shapes}) == 1
            ):
                outputs.append(
                    dataclasses.replace(tensor, dims=(-1,) + shapes[0][1:], batched=True)
                )
            elif len(set(shapes)) == 1:
                outputs.append(dataclasses.replace(tensor, dims=shapes[0], batched=False))
            else:
                at = ", ".join(f"{list(s)} at {g}" for s, g in zip(shapes, info.gears, strict=True))
                raise BackendError(
                    f"output '{tensor.raw_name}' changes with the batch gear other than on its "
                    f"first axis ({at}): the Ascend backend cannot split it per request"
                )
        self.info = dataclasses.replace(info, outputs=tuple(outputs))

    def _fill(self, dataset: _Dataset, sizes: list[int], label: str) -> None:
        acl = self.acl
        dataset.handle = acl.mdl.create_dataset()
        if not dataset.handle:
            raise BackendError(f"acl.mdl.create_dataset returned a null {label} dataset")
        for index, size in enumerate(sizes):
            if size <= 0:
                raise BackendError(f"{label} {index} reports a size of {size} bytes")
            ptr = unwrap(
                acl,
                acl.rt.malloc(size, K.MALLOC_HUGE_FIRST),
                f"acl.rt.malloc({size}) for {label} {index}",
            )
            slot = _Slot(ptr, size)
            dataset.slots.append(slot)
            slot.buffer = acl.create_data_buffer(ptr, size)
            if not slot.buffer:
                raise BackendError(f"acl.create_data_buffer returned null for {label} {index}")
            _, ret = acl.mdl.add_dataset_buffer(dataset.handle, slot.buffer)
            check(acl, ret, f"acl.mdl.add_dataset_buffer ({label} {index})")

    # -- per batch ----------------------------------------------------------------------------
    def run(
        self, arrays: Sequence[np.ndarray], rows: int | None, allocate: Allocate | None = None
    ) -> list[np.ndarray]:
        """One execution. `arrays` are C-contiguous, one per model input in order; with `rows`
        the batched ones carry that many rows and are zero-padded up to the gear, the others
        have their static shapes. Returns one array per output, padding dropped. `allocate`
        gives each output's destination (the NPU executor's shared memory), np.empty if None."""
        session = self.session
        self._allocate = allocate or np.empty
        with session.running():
            if self._inputs is None or self._outputs is None:
                raise BackendError("this copy of the model has been released")
            session.bind()
            if self.info.shape_kind:
                return self._run_shaped(arrays, rows)
            return self._run_batch(arrays, rows)

    def _copy_in(self, index: int, array: np.ndarray, what: str) -> _Slot:
        assert self._inputs is not None
        slot = self._inputs.slots[index]
        check(
            self.acl,
            self.acl.rt.memcpy(
                slot.ptr, slot.size, array.ctypes.data, array.nbytes, self.session.h2d
            ),
            f"acl.rt.memcpy (input '{what}')",
        )
        return slot

    def _execute(self) -> None:
        assert self._inputs is not None and self._outputs is not None
        check(
            self.acl,
            self.acl.mdl.execute_async(
                self.model_id, self._inputs.handle, self._outputs.handle, self.session.stream
            ),
            "acl.mdl.execute_async",
        )
        self.session.synchronize()

    def _copy_out(self, index: int, shape: tuple[int, ...], what: str, dtype) -> np.ndarray:
        assert self._outputs is not None
        out = self._allocate(shape, dtype)
        check(
            self.acl,
            self.acl.rt.memcpy(
                out.ctypes.data,
                out.nbytes,
                self._outputs.slots[index].ptr,
                out.nbytes,
                self.session.d2h,
            ),
            f"acl.rt.memcpy (output '{what}')",
        )
        return out

    def _run_batch(self, arrays: Sequence[np.ndarray], rows: int | None) -> list[np.ndarray]:
        acl, info = self.acl, self.info
        gear = gears.batch_gear(info, rows) if rows is not None else None
        for tensor, array in zip(info.inputs, arrays, strict=False):
            slot = self._copy_in(tensor.index, array, tensor.name)
            if gear is not None and rows is not None and tensor.batched and rows < gear:
                check(
                    acl,
                    acl.rt.memset(
                        slot.ptr + array.nbytes,
                        slot.size - array.nbytes,
                        0,
                        (gear - rows) * tensor.row_bytes,
                    ),
                    f"acl.rt.memset (padding of input '{tensor.name}')",
                )
        if info.dynamic:
            assert self._inputs is not None
            check(
                acl,
                acl.mdl.set_dynamic_batch_size(
                    self.model_id, self._inputs.handle, info.gear_index, gear
                ),
                f"acl.mdl.set_dynamic_batch_size({gear})",
            )
        self._execute()
        return [
            self._copy_out(
                i,
                (rows,) + t.row_dims if rows is not None and t.batched else t.dims,
                t.name,
                t.acl_type.numpy,
            )
            for i, t in enumerate(info.outputs)
        ]

    def _run_shaped(self, arrays: Sequence[np.ndarray], rows: int | None) -> list[np.ndarray]:
        """A --dynamic_image_size / --dynamic_dims model: pad to the gear's shapes, set the gear,
        and read each output's dims at that gear back from the device."""
        acl, info = self.acl, self.info
        gear = gears.shape_gear(info, [a.shape for a in arrays], rows)
        assert self._inputs is not None
        for tensor, array, shape in zip(info.inputs, arrays, gear, strict=False):
            self._copy_in(
                tensor.index,
                np.ascontiguousarray(gears.pad_input(tensor, array, shape)),
                tensor.name,
            )
        if info.shape_kind == "hw":
            h, w = gears.hw_of(info, gear)
            check(
                acl,
                acl.mdl.set_dynamic_hw_size(
                    self.model_id, self._inputs.handle, info.gear_index, h, w
                ),
                f"acl.mdl.set_dynamic_hw_size({h}, {w})",
            )
        else:
            dims = gears.dims_of(info, gear)
            check(
                acl,
                acl.mdl.set_input_dynamic_dims(
                    self.model_id, self._inputs.handle, info.gear_index, dims
                ),
                f"acl.mdl.set_input_dynamic_dims({dims['dims']})",
            )
        self._execute()
        results = []
        for i, tensor in enumerate(info.outputs):
            shape = unwrap(
                acl, acl.mdl.get_cur_output_dims(self.desc, i), f"acl.mdl.get_cur_output_dims({i})"
            )["dims"]
            out = self._copy_out(
                i, tuple(int(d) for d in shape), tensor.name, tensor.acl_type.numpy
            )
            results.append(out[:rows] if rows is not None and tensor.batched else out)
        return results

    # -- teardown -----------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Free each buffer's memory, destroy the buffer, then the dataset; then unload the model
        and destroy its desc (the documented order). Goes on past failures and returns them."""
        with self.session.lock:
            if self in self.session.models:
                self.session.models.remove(self)
            return self._close()

    def _close(self) -> list[str]:
        acl = self.acl
        problems: list[str] = []

        def step(ret: int, call: str) -> None:
            try:
                check(acl, ret, call)
            except AclError as exc:
                problems.append(exc.message)

        if self.model_id or self.desc or self._inputs or self._outputs:
            try:
                self.session.bind()
            except AclError as exc:
                problems.append(exc.message)
        for dataset in (self._inputs, self._outputs):
            if dataset is None:
                continue
            for slot in dataset.slots:
                step(acl.rt.free(slot.ptr), "acl.rt.free")
                if slot.buffer:
                    step(acl.destroy_data_buffer(slot.buffer), "acl.destroy_data_buffer")
            if dataset.handle:
                step(acl.mdl.destroy_dataset(dataset.handle), "acl.mdl.destroy_dataset")
        self._inputs = self._outputs = None
        if self.model_id:
            step(acl.mdl.unload(self.model_id), "acl.mdl.unload")
            self.model_id = 0
        if self.desc:
            step(acl.mdl.destroy_desc(self.desc), "acl.mdl.destroy_desc")
            self.desc = 0
        return problems
