"""The response cache: Triton's `--cache-config local,size=N` with a model's `response_cache`.

One cache for the whole server, bounded in bytes, least recently used entries evicted first; an
answer larger than the whole cache is not stored. Each loaded copy of a model version that
enables `response_cache` gets a `VersionCache` (built by the model manager when the copy loads):
its generation number is part of every key, so a reloaded copy (even with the same version
number) never answers from the entries of the copy it replaced, and closing it (unload,
replacement) drops its entries and refuses the inserts still on their way.

The key is a SHA-256 digest (faster than BLAKE2b where the CPU has SHA instructions) over
length-prefixed fields, so no two requests alias: the model name, the copy's generation,
every input's name, datatype, shape and bytes (by name order), the request parameters a model
can read (those only the server reads are left out: `UNKEYED_PARAMETERS`), and the names of
the outputs asked for (a Python model may compute only those). Hashing and storing cost time
proportional to the tensors, so above the offload threshold they run in a thread, never on the
event loop (server/core/inference_path.py).

Stored answers are copies, read-only, never the backend's own buffers; a hit hands out new
Tensor objects over those arrays, which no layer above writes into.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

import numpy as np

from protocol.types import InferRequest, InferResponse, Tensor

# Request parameters that only the server reads (scheduling and encoding): two requests that
# differ in them alone get the same answer. Every other parameter is part of the key.
UNKEYED_PARAMETERS = frozenset(
    {"priority", "timeout", "binary_data_output", "triton_enable_empty_final_response"}
)
# What an entry costs besides its tensors' bytes: the key, the bookkeeping, each tensor's name.
ENTRY_OVERHEAD = 256
TENSOR_OVERHEAD = 64
# Bytes counted per BYTES element (its length prefix and the object itself).
ELEMENT_OVERHEAD = 8
# A BYTES tensor with more elements than threshold // this is hashed or stored in a thread
# without summing its lengths on the loop (a sum over the elements is itself that much work).
ELEMENT_ESTIMATE = 16
# Tensor bytes up to this are joined with the other fields before hashing; larger ones are
# hashed where they lie.
JOINED_BYTES = 4096


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "little", signed=True)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    return str(item).encode("utf-8")


def _raw(data: np.ndarray) -> memoryview:
    """A numeric array's bytes, row-major, without a copy when it is contiguous already."""
    flat = np.ascontiguousarray(data).reshape(-1)
    return flat.view(np.uint8).data


def tensor_bytes(tensors: Iterable[Tensor], threshold: int) -> int:
    """About how many bytes the tensors hold; more than `threshold` as soon as that is known
    (a BYTES tensor with many elements counts as over it without summing them)."""
    total = 0
    for tensor in tensors:
        data = tensor.data
        if data.dtype.hasobject:
            if data.size > threshold // ELEMENT_ESTIMATE:
                return threshold + 1
            total += sum(len(_as_bytes(item)) for item in data.flat)
        else:
            total += data.nbytes
        if total > threshold:
            return total
    return total


def request_key(model: str, generation: int, request: InferRequest) -> bytes:
    """The digest that names `request`'s answer from one loaded copy (see the module text).
    Small fields are joined and hashed at once (one call instead of dozens); a large tensor's
    bytes go to the hash as they are, never copied."""
    digest = sha256()
    parts: list[bytes | memoryview] = []
    add = parts.append

    def field(value: bytes | memoryview) -> None:
        add(_u64(len(value)))
        add(value)

    field(model.encode("utf-8"))
    add(_u64(generation))
    inputs = request.inputs if len(request.inputs) < 2 else sorted(request.inputs, key=_name)
    add(_u64(len(inputs)))
    for tensor in inputs:
        field(tensor.name.encode("utf-8"))
        field(tensor.datatype.encode("ascii", "replace"))
        add(_u64(len(tensor.shape)))
        add(b"".join(_u64(int(dim)) for dim in tensor.shape))
        data = tensor.data
        if data.dtype.hasobject:
            add(_u64(int(data.size)))
            for item in data.flat:
                field(_as_bytes(item))
        else:
            raw = _raw(data)
            add(_u64(raw.nbytes))
            if raw.nbytes > JOINED_BYTES:
                digest.update(b"".join(parts))
                parts.clear()
                digest.update(raw)
            else:
                add(raw)
    keyed = sorted(
        (key, value) for key, value in request.parameters.items() if key not in UNKEYED_PARAMETERS
    )
    add(_u64(len(keyed)))
    for key, value in keyed:
        field(key.encode("utf-8"))
        field(type(value).__name__.encode("ascii"))
        field(_as_bytes(value))
    if request.outputs is None:
        add(b"\x00")
    else:
        add(b"\x01")
        names = sorted(output.name for output in request.outputs)
        add(_u64(len(names)))
        for name in names:
            field(name.encode("utf-8"))
    digest.update(b"".join(parts))
    return digest.digest()


def _name(tensor: Tensor) -> str:
    return tensor.name


@dataclass(slots=True, eq=False)
class Entry:
    """One stored answer: read-only copies of its outputs, and what it costs the cache."""

    owner: VersionCache
    model_name: str
    model_version: str
    outputs: tuple[Tensor, ...]
    parameters: dict[str, Any]
    size: int

    def answer(self, request: InferRequest) -> InferResponse:
        """A new response to `request` over the stored arrays (nothing above writes into
        them: they are read-only)."""
        return InferResponse(
            self.model_name,
            self.model_version,
            request.id,
            [Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters)) for t in self.outputs],
            dict(self.parameters),
        )


def stored_copy(owner: VersionCache, response: InferResponse) -> Entry:
    """A cache entry holding copies of `response`'s outputs (the backend may reuse its
    buffers, and the caller still owns the response)."""
    outputs: list[Tensor] = []
    size = ENTRY_OVERHEAD
    for tensor in response.outputs:
        data = np.array(tensor.data, copy=True)
        data.setflags(write=False)
        if data.dtype.hasobject:
            size += sum(len(_as_bytes(item)) + ELEMENT_OVERHEAD for item in data.flat)
        else:
            size += data.nbytes
        size += TENSOR_OVERHEAD + len(tensor.name)
        outputs.append(
            Tensor(tensor.name, tensor.datatype, tuple(tensor.shape), data, dict(tensor.parameters))
        )
    return Entry(
        owner,
        response.model_name,
        response.model_version,
        tuple(outputs),
        dict(response.parameters),
        size,
    )


class ResponseCache:
    """Answers by key, least recently used first out, at most `capacity` bytes in all. Safe
    from any thread (lookups and inserts take one lock, held for dictionary work only)."""

    def __init__(self, capacity: int, offload_threshold: int) -> None:
        self.capacity = capacity
        self.offload_threshold = offload_threshold
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._generations = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def bind(self, name: str, enabled: bool) -> VersionCache | None:
        """The cache of one loaded copy of `name`, or None when its config does not enable
        `response_cache` (the infer path then checks one attribute and moves on)."""
        if not enabled:
            return None
        return VersionCache(self, name, next(self._generations))

    def lookup(self, key: bytes) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def insert(self, key: bytes, entry: Entry) -> bool:
        """Store `entry` (evicting the least recently used ones to make room); False when it
        is larger than the whole cache, its copy was closed meanwhile, or an identical request
        stored its answer first (that one is kept)."""
        if entry.size > self.capacity:
            return False
        owner = entry.owner
        with self._lock:
            if owner.closed:
                return False
            if key in self._entries:
                self._entries.move_to_end(key)
                return False
            while self.used + entry.size > self.capacity and self._entries:
                old_key, old = self._entries.popitem(last=False)
                self.used -= old.size
                old.owner.keys.discard(old_key)
                self.evictions += 1
            self._entries[key] = entry
            self.used += entry.size
            owner.keys.add(key)
            return True

    def drop(self, owner: VersionCache) -> int:
        """Remove every entry of one copy; how many there were."""
        with self._lock:
            owner.closed = True
            keys, owner.keys = owner.keys, set()
            for key in keys:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self.used -= entry.size
            return len(keys)


class VersionCache:
    """The response cache as one loaded copy of a model version sees it."""

    __slots__ = ("cache", "model", "generation", "keys", "closed")

    def __init__(self, cache: ResponseCache, model: str, generation: int) -> None:
        self.cache = cache
        self.model = model
        self.generation = generation
        self.keys: set[bytes] = set()
        self.closed = False

    def heavy(self, tensors: Iterable[Tensor]) -> bool:
        """Whether hashing or copying these tensors is work for a thread, not the loop."""
        threshold = self.cache.offload_threshold
        return tensor_bytes(tensors, threshold) > threshold

    def key(self, request: InferRequest) -> bytes:
        return request_key(self.model, self.generation, request)

    def lookup(self, key: bytes) -> Entry | None:
        return self.cache.lookup(key)

    def store(self, key: bytes, response: InferResponse) -> bool:
        """Copy `response` into the cache under `key` (see ResponseCache.insert)."""
        capacity = self.cache.capacity
        if self.closed or tensor_bytes(response.outputs, capacity) > capacity:
            return False  # an answer that cannot fit is not even copied
        return self.cache.insert(key, stored_copy(self, response))

    def close(self) -> None:
        """The copy stopped serving: its entries go, and no answer of it is stored again."""
        self.cache.drop(self)
