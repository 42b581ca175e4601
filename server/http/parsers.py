"""Large HTTP bodies are parsed in parser processes, never on the event loop (issue #13, item 1).

Why processes and not a thread: the expensive steps are single C calls that hold the GIL from
start to end (`orjson.loads` of a 5-million-number body about 0.2 s, `np.array` of its list
0.07 s, the nesting-depth check's regex over a hostile 64 MiB body over 2 s), and a thread
holding the GIL stalls the loop just as well. So bodies over `--http-offload-threshold` bytes
go to a small pool of parser processes (`--http-parser-processes`, started on first use; our own,
in server/http/parser_pool.py, so that they end with the server however it ends):

- the body reaches a worker through a file in /dev/shm, written by a loop-side thread with
  `os.write` (which releases the GIL), so neither the loop nor the GIL copies it;
- the worker decompresses, checks the nesting depth, parses and converts exactly as the inline
  path does (the same functions, so the same errors and limits) and returns the decoded request:
  numeric tensors as numpy arrays (one memcpy to unpickle), BYTES tensors packed as lengths
  plus one blob, rebuilt in a thread by a Python loop that yields the GIL every few ms;
- large JSON responses are encoded by a worker too; large payloads are compressed in a thread
  (zlib releases the GIL).

The loop itself does O(number of tensors) work per offloaded request. Workers run at a lower
CPU priority (`os.nice`) so a stream of hostile bodies cannot starve the loop of CPU either.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import orjson

from protocol import compression
from protocol.errors import InternalError, InvalidArgument, TooLarge
from protocol.rest import decode as rest_decode
from protocol.rest import encode as rest_encode
from protocol.text import echo_limit
from protocol.types import InferRequest, InferResponse, RequestedOutput
from server.http.parser_pool import ParserPool

log = logging.getLogger(__name__)

WORKER_NICE = 19  # parser processes yield the CPU to the server's event loop
_UNPACK_CHUNK = 1 << 16  # BYTES elements rebuilt per step (the GIL can switch between steps)
_SPILL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

Parts = Sequence[Any]  # the body as it arrived: bytes-like chunks, in order


# --------------------------------------------------------------------------- worker side


def _take(path: str) -> bytes:
    """The spilled body, read once; the file is gone afterwards."""
    with open(path, "rb") as spilled:
        data = spilled.read()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return data


def parse_json_document(
    body: Any, content_encoding: str | None, max_size: int, max_depth: int
) -> Any:
    """A repository route's JSON body, decompressed and parsed (None when blank): the one
    parse, inline for small bodies and in a parser process for large ones."""
    body = compression.decompress(body, content_encoding, max_size)
    if not body.strip():
        return None
    rest_decode.check_json_depth(body, max_depth)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None


def _json_job(
    path: str,
    content_encoding: str | None,
    max_size: int,
    max_depth: int,
    decoder: Callable[..., Any],
    args: tuple,
) -> Any:
    document = parse_json_document(_take(path), content_encoding, max_size, max_depth)
    return decoder(*args, document)


class PackedBytes:
    """A BYTES tensor in transit: element lengths and their concatenation (cheap to pickle)."""

    __slots__ = ("lengths", "blob", "shape")

    def __init__(self, array: np.ndarray, step: int | None = None) -> None:
        """`step`: pack that many elements at a time (on a thread beside the loop, so that no
        single C call holds the GIL for long); None: all at once (in a parser process)."""
        flat_array = array.reshape(-1)
        count = flat_array.size
        step = step or max(count, 1)
        lengths, blobs = [], []
        for first in range(0, count, step):
            flat = [_as_bytes(item) for item in flat_array[first : first + step].tolist()]
            lengths.append(np.fromiter(map(len, flat), dtype=np.int64, count=len(flat)))
            blobs.append(b"".join(flat))
        self.lengths = np.concatenate(lengths) if lengths else np.empty(0, dtype=np.int64)
        self.blob = b"".join(blobs)
        self.shape = array.shape

    def __getstate__(self) -> tuple:
        return self.lengths, self.blob, self.shape

    def __setstate__(self, state: tuple) -> None:
        self.lengths, self.blob, self.shape = state

    def unpack(self) -> np.ndarray:
        """The object array again, built in steps so another thread gets the GIL between them."""
        count = len(self.lengths)
        out = np.empty(count, dtype=object)
        ends = np.cumsum(self.lengths)
        blob = self.blob
        start = 0
        for first in range(0, count, _UNPACK_CHUNK):
            stops = ends[first : first + _UNPACK_CHUNK].tolist()
            items = []
            for stop in stops:
                items.append(blob[start:stop])
                start = stop
            out[first : first + len(items)] = items
        return out.reshape(self.shape)


def _as_bytes(item: Any) -> bytes:
    if type(item) is bytes:
        return item
    return item.encode("utf-8") if isinstance(item, str) else bytes(item)


def _pack(request: InferRequest) -> InferRequest:
    for tensor in request.inputs:
        if isinstance(tensor.data, np.ndarray) and tensor.data.dtype == object:
            tensor.data = PackedBytes(tensor.data)  # type: ignore[assignment]  # unpacked on arrival
    return request


def _infer_job(
    path: str,
    content_encoding: str | None,
    max_size: int,
    header_length: int | None,
    model_name: str,
    model_version: str,
    max_depth: int,
) -> InferRequest:
    body = compression.decompress(_take(path), content_encoding, max_size)
    request = rest_decode.decode_infer_request(
        body, header_length, model_name, model_version, max_json_depth=max_depth, max_bytes=max_size
    )
    return _pack(request)


def _raw_job(path: str, content_encoding: str | None, max_size: int, args: tuple) -> InferRequest:
    body = compression.decompress(_take(path), content_encoding, max_size)
    return _pack(rest_decode.decode_raw_request(body, *args))


def _encode_job(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[bytes, int | None]:
    for tensor in response.outputs:
        if isinstance(tensor.data, PackedBytes):
            tensor.data = tensor.data.unpack()
    return rest_encode.encode_infer_response(response, requested, binary_default)


def _pack_outputs(response: InferResponse) -> InferResponse:
    """A copy of the response whose BYTES outputs are packed, a step at a time (in a thread)."""
    outputs = []
    for tensor in response.outputs:
        data = tensor.data
        if isinstance(data, np.ndarray) and data.dtype == object:
            tensor = copy.copy(tensor)
            tensor.data = PackedBytes(data, step=_UNPACK_CHUNK)  # type: ignore[assignment]  # as above
        outputs.append(tensor)
    packed = copy.copy(response)
    packed.outputs = outputs
    return packed


def _noop() -> None:
    return None


# --------------------------------------------------------------------------- loop side


def _spill(parts: Parts) -> str:
    """Write the body's chunks to a fresh file in /dev/shm (os.write releases the GIL)."""
    path = os.path.join(_SPILL_DIR, f"ascend-serve-body-{os.getpid()}-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for part in parts:
            view = memoryview(part).cast("B")
            while view.nbytes:
                written = os.write(fd, view)
                view = view[written:]
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    os.close(fd)
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unpack_all(request: InferRequest) -> InferRequest:
    for tensor in request.inputs:
        if isinstance(tensor.data, PackedBytes):
            tensor.data = tensor.data.unpack()
    return request


def _has_packed(request: InferRequest) -> bool:
    return any(isinstance(tensor.data, PackedBytes) for tensor in request.inputs)


class BodyOffload:
    """The parser processes of one HTTP frontend and the rule of what goes to them."""

    def __init__(self, threshold: int, processes: int, nice: int = WORKER_NICE) -> None:
        self.threshold = threshold
        self.processes = processes
        self.enabled = processes > 0
        self._nice = nice
        self._pool: ParserPool | None = None
        self._lock = threading.Lock()

    def wants(self, size: int) -> bool:
        """Whether a body (or a response) of `size` bytes is worked on off the loop."""
        return self.enabled and size > self.threshold

    # ----- the pool -----------------------------------------------------------------------
    def _executor(self) -> ParserPool:
        with self._lock:
            if self._pool is None:
                self._pool = ParserPool(self.processes, self._nice, __name__, echo_limit())
            return self._pool

    def _submit(
        self, parts: Parts | None, job: Callable[..., Any], *args: Any
    ) -> tuple[Future, str | None]:
        """Spill the body (if any) and submit; runs in a thread (the spill writes the body)."""
        path = _spill(parts) if parts is not None else None
        try:
            pool = self._executor()
            call_args = (path, *args) if path is not None else args
            return pool.submit(job, *call_args), path
        except BaseException:
            if path is not None:
                _unlink(path)
            raise

    async def _run(self, parts: Parts | None, job: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future, path = await loop.run_in_executor(None, self._submit, parts, job, *args)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:  # its process is started again for the next body
            raise InternalError("a request parser process died; try again") from None
        finally:
            if path is not None:
                _unlink(path)  # normally already gone: the worker removes it once read

    def start(self) -> None:
        """Start the workers now (optional: they also start on first use)."""
        if self.enabled:
            self._executor().submit(_noop).result()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # ----- jobs ---------------------------------------------------------------------------
    async def json_document(
        self,
        parts: Parts,
        content_encoding: str | None,
        max_size: int,
        max_depth: int,
        decoder: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """`decoder(*args, document)` of a large repository-route body, run in a worker."""
        return await self._run(
            parts, _json_job, content_encoding, max_size, max_depth, decoder, args
        )

    async def infer_request(
        self,
        parts: Parts,
        content_encoding: str | None,
        max_size: int,
        header_length: int | None,
        model_name: str,
        model_version: str,
        max_depth: int,
    ) -> InferRequest:
        request = await self._run(
            parts,
            _infer_job,
            content_encoding,
            max_size,
            header_length,
            model_name,
            model_version,
            max_depth,
        )
        return await self._unpacked(request)

    async def raw_request(
        self, parts: Parts, content_encoding: str | None, max_size: int, *args: Any
    ) -> InferRequest:
        request = await self._run(parts, _raw_job, content_encoding, max_size, args)
        return await self._unpacked(request)

    async def encode_response(
        self, response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
    ) -> tuple[bytes, int | None]:
        if any(isinstance(t.data, np.ndarray) and t.data.dtype == object for t in response.outputs):
            response = await asyncio.to_thread(_pack_outputs, response)
        return await self._run(None, _encode_job, response, requested, binary_default)

    async def _unpacked(self, request: InferRequest) -> InferRequest:
        if _has_packed(request):
            return await asyncio.to_thread(_unpack_all, request)
        return request


def inflate_small(
    body: Any, content_encoding: str | None, max_size: int, threshold: int
) -> Any | None:
    """The body decompressed inline when that yields at most `threshold` bytes (the usual small
    request); None when it would inflate past it (then the parser process does it, bounded by
    `max_size`). Inline inflation stops at the threshold, so it never costs more."""
    if threshold >= max_size:
        return compression.decompress(body, content_encoding, max_size)
    try:
        return compression.decompress(body, content_encoding, threshold)
    except TooLarge:
        return None


def output_sizes(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[int, int]:
    """About how many bytes of the response go out as JSON (BYTES elements count 8 each), and
    how many are binary BYTES outputs (serialized element by element; numeric binary outputs
    are one copy and do not count): the two sizes that send an answer's encoding off the loop.
    One pass over the outputs."""
    choices = {output.name: output.binary for output in requested} if requested else {}
    as_json = binary_objects = 0
    for tensor in response.outputs:
        data = tensor.data
        if not isinstance(data, np.ndarray):
            continue
        choice = choices.get(tensor.name)
        if binary_default if choice is None else choice:
            if data.dtype == object:
                binary_objects += data.nbytes
        else:
            as_json += data.nbytes
    return as_json, binary_objects
