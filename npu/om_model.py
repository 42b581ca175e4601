"""An `.om` model on the device: its description, and one loaded copy with its IO memory.

`read_description` turns a pyACL model desc into plain data (names normalised, dims, dtypes,
dynamic-batch gears). `OmModel` is one loaded copy in the current context whose input and
output device buffers and datasets are made once at load and reused by every batch, so a
request never allocates device memory. Batches are padded to the smallest gear that fits.
"""
from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

import numpy as np

from backends.base import BackendError
from npu import acl as npu_acl
from npu import constants as K
from npu.device import DeviceSession
from npu.errors import AclError, check, unwrap

log = logging.getLogger(__name__)


def normalise_output_name(raw: str) -> str:
    """ATC names outputs `op:edge:name` (from ONNX) or `op:edge` (from TF); keep `name` / `op`."""
    parts = raw.split(":")
    if len(parts) >= 3 and parts[1].isdigit():
        return ":".join(parts[2:])
    if len(parts) == 2 and parts[1].isdigit():
        return parts[0]
    return raw


@dataclass(frozen=True)
class TensorInfo:
    index: int  # position among the model's inputs (gear tensor counted) or outputs
    name: str  # the name a config uses (outputs normalised)
    raw_name: str  # the name the model reports
    acl_type: K.AclType
    dims: tuple[int, ...]  # -1 on the batch axis of a dynamic-batch model
    size: int  # bytes the model reports (at the largest gear)

    @property
    def row_dims(self) -> tuple[int, ...]:
        return self.dims[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_dims, dtype=np.int64)) * self.acl_type.numpy.itemsize

    @property
    def static_bytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * self.acl_type.numpy.itemsize


@dataclass(frozen=True)
class ModelDescription:
    inputs: tuple[TensorInfo, ...]  # without the gear tensor
    outputs: tuple[TensorInfo, ...]
    gears: tuple[int, ...] = ()  # ascending; empty for a static model
    gear_index: Optional[int] = None  # index of ascend_mbatch_shape_data among the inputs
    num_inputs: int = 0  # as the desc counts them (gear tensor included)

    @property
    def dynamic(self) -> bool:
        return bool(self.gears)

    @property
    def static_batch(self) -> Optional[int]:
        """The compiled batch of a static model: the first dim shared by every tensor."""
        if self.dynamic:
            return None
        firsts = {t.dims[0] if t.dims else None for t in self.inputs + self.outputs}
        if len(firsts) != 1:
            return None
        first = firsts.pop()
        return first if first is not None and first > 0 else None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the device accepts: the gears, or the one compiled batch."""
        if self.gears:
            return self.gears
        return (self.static_batch,) if self.static_batch else ()


def _tensor_dims(acl: ModuleType, result: tuple, call: str, dynamic: bool) -> tuple[int, ...]:
    info = unwrap(acl, result, call)
    dims = tuple(int(d) for d in info["dims"][:info.get("dimCount", len(info["dims"]))])
    if dynamic and dims:
        dims = (-1,) + dims[1:]  # some CANN versions report the largest gear here
    return dims


def _acl_type(acl_dtype: int, what: str) -> K.AclType:
    if acl_dtype not in K.ACL_TYPES:
        raise BackendError(f"{what} has aclDataType {acl_dtype}, which the Ascend backend does "
                           "not support")
    return K.ACL_TYPES[acl_dtype]


def read_description(acl: ModuleType, desc: int) -> ModelDescription:
    """Everything the backend needs from a filled model desc."""
    mdl = acl.mdl
    num_inputs, num_outputs = mdl.get_num_inputs(desc), mdl.get_num_outputs(desc)
    # Scan the names for the gear tensor (asking by name logs an error on a static model).
    names = [mdl.get_input_name_by_index(desc, i) for i in range(num_inputs)]
    gear_index = names.index(K.DYNAMIC_TENSOR_NAME) if K.DYNAMIC_TENSOR_NAME in names else None
    gears: tuple[int, ...] = ()
    if gear_index is not None:
        batch = unwrap(acl, mdl.get_dynamic_batch(desc), "acl.mdl.get_dynamic_batch")
        gears = tuple(sorted({int(g) for g in batch["batch"][:batch["batchCount"]]}))
        if not gears:
            raise BackendError("the model was compiled with dynamic image size or dynamic dims; "
                               "only --dynamic_batch_size (or static shapes) is supported")
    dynamic = bool(gears)
    inputs = []
    for i, name in enumerate(names):
        if i == gear_index:
            continue
        dims = _tensor_dims(acl, mdl.get_input_dims(desc, i), f"acl.mdl.get_input_dims({i})",
                            dynamic)
        inputs.append(TensorInfo(i, name, name,
                                 _acl_type(mdl.get_input_data_type(desc, i), f"input '{name}'"),
                                 dims, mdl.get_input_size_by_index(desc, i)))
    raw_outputs = [mdl.get_output_name_by_index(desc, i) for i in range(num_outputs)]
    short = [normalise_output_name(n) for n in raw_outputs]
    outputs = []
    for i, raw in enumerate(raw_outputs):
        name = short[i] if short.count(short[i]) == 1 else raw  # keep raw names on a clash
        dims = _tensor_dims(acl, mdl.get_output_dims(desc, i), f"acl.mdl.get_output_dims({i})",
                            dynamic)
        outputs.append(TensorInfo(i, name, raw,
                                  _acl_type(mdl.get_output_data_type(desc, i), f"output '{name}'"),
                                  dims, mdl.get_output_size_by_index(desc, i)))
    for tensor in inputs + outputs:
        rest = tensor.row_dims if dynamic else tensor.dims
        if any(d < 0 for d in rest):
            raise BackendError(f"tensor '{tensor.raw_name}' has dynamic dims {list(tensor.dims)}: "
                               "only the batch axis may be dynamic (ATC --dynamic_batch_size)")
    return ModelDescription(tuple(inputs), tuple(outputs), gears, gear_index, num_inputs)


def describe_file(path: Path, device_id: int) -> ModelDescription:
    """Load the model once on a short-lived thread of its own (pyACL needs a context to read a
    desc, and the caller's thread must not be left holding one), read it, unload it."""
    acl = npu_acl.load()
    if not path.is_file():
        raise BackendError(f"model file {path} does not exist")
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
            model.load_description(path)
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
        self._inputs: Optional[_Dataset] = None
        self._outputs: Optional[_Dataset] = None

    @classmethod
    def load(cls, session: DeviceSession, path: Path) -> "OmModel":
        model = cls(session)
        try:
            model.load_description(path)
            model._allocate_io()
        except BaseException:
            for problem in model.close():
                log.warning("cleaning up a failed load of %s: %s", path, problem)
            raise
        return model

    def load_description(self, path: Path) -> None:
        acl = self.acl
        self.model_id = unwrap(acl, acl.mdl.load_from_file(str(path)),
                               f"acl.mdl.load_from_file({path})")
        self.desc = acl.mdl.create_desc()
        if not self.desc:
            raise BackendError("acl.mdl.create_desc returned a null desc")
        check(acl, acl.mdl.get_desc(self.desc, self.model_id), "acl.mdl.get_desc")
        self.info = read_description(acl, self.desc)

    def _allocate_io(self) -> None:
        mdl = self.acl.mdl
        rows = max(self.info.batch_sizes, default=1)
        for tensor in self.info.inputs + self.info.outputs:
            need = tensor.row_bytes * rows if self.info.batch_sizes else tensor.static_bytes
            if tensor.size < need:
                raise BackendError(f"tensor '{tensor.raw_name}' reports {tensor.size} bytes, its "
                                   f"dims {list(tensor.dims)} need {need}")
        self._inputs = _Dataset(0)
        self._fill(self._inputs, [mdl.get_input_size_by_index(self.desc, i)
                                  for i in range(self.info.num_inputs)], "input")
        self._outputs = _Dataset(0)
        self._fill(self._outputs, [t.size for t in self.info.outputs], "output")

    def _fill(self, dataset: _Dataset, sizes: list[int], label: str) -> None:
        acl = self.acl
        dataset.handle = acl.mdl.create_dataset()
        if not dataset.handle:
            raise BackendError(f"acl.mdl.create_dataset returned a null {label} dataset")
        for index, size in enumerate(sizes):
            if size <= 0:
                raise BackendError(f"{label} {index} reports a size of {size} bytes")
            ptr = unwrap(acl, acl.rt.malloc(size, K.MALLOC_HUGE_FIRST),
                         f"acl.rt.malloc({size}) for {label} {index}")
            slot = _Slot(ptr, size)
            dataset.slots.append(slot)
            slot.buffer = acl.create_data_buffer(ptr, size)
            if not slot.buffer:
                raise BackendError(f"acl.create_data_buffer returned null for {label} {index}")
            _, ret = acl.mdl.add_dataset_buffer(dataset.handle, slot.buffer)
            check(acl, ret, f"acl.mdl.add_dataset_buffer ({label} {index})")

    # -- per batch ----------------------------------------------------------------------------
    def gear_for(self, rows: int) -> int:
        """The smallest compiled batch that holds `rows`."""
        sizes = self.info.batch_sizes
        position = bisect.bisect_left(sizes, rows)
        if rows < 1 or position == len(sizes):
            raise BackendError(f"a batch of {rows} rows does not fit the model's compiled batch "
                               f"sizes {list(sizes)}")
        return sizes[position]

    def run(self, arrays: Sequence[np.ndarray], rows: Optional[int]) -> list[np.ndarray]:
        """One execution. `arrays` are C-contiguous, one per model input in order; with `rows`
        they carry that many rows and are zero-padded on the device up to the gear, without
        it they are the exact static shapes. Returns one array per output, padding dropped."""
        acl, session = self.acl, self.session
        assert self._inputs is not None and self._outputs is not None, "model not loaded"
        session.bind()
        gear = self.gear_for(rows) if rows is not None else None
        for tensor, array in zip(self.info.inputs, arrays):
            slot = self._inputs.slots[tensor.index]
            check(acl, acl.rt.memcpy(slot.ptr, slot.size, array.ctypes.data, array.nbytes,
                                     session.h2d), f"acl.rt.memcpy (input '{tensor.name}')")
            if gear is not None and rows < gear:
                check(acl, acl.rt.memset(slot.ptr + array.nbytes, slot.size - array.nbytes, 0,
                                         (gear - rows) * tensor.row_bytes),
                      f"acl.rt.memset (padding of input '{tensor.name}')")
        if self.info.dynamic:
            check(acl, acl.mdl.set_dynamic_batch_size(self.model_id, self._inputs.handle,
                                                      self.info.gear_index, gear),
                  f"acl.mdl.set_dynamic_batch_size({gear})")
        check(acl, acl.mdl.execute_async(self.model_id, self._inputs.handle,
                                         self._outputs.handle, session.stream),
              "acl.mdl.execute_async")
        session.synchronize()
        results = []
        for tensor, slot in zip(self.info.outputs, self._outputs.slots):
            shape = (rows,) + tensor.row_dims if rows is not None else tensor.dims
            out = np.empty(shape, dtype=tensor.acl_type.numpy)
            check(acl, acl.rt.memcpy(out.ctypes.data, out.nbytes, slot.ptr, out.nbytes,
                                     session.d2h), f"acl.rt.memcpy (output '{tensor.name}')")
            results.append(out)
        return results

    # -- teardown -----------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Free each buffer's memory, destroy the buffer, then the dataset; then unload the model
        and destroy its desc (the documented order). Goes on past failures and returns them."""
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
