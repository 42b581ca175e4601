"""server/core/client_shm.py: regions opened once, tensors read and written through the
descriptor (a file that shrinks is an error naming the region, never SIGBUS), bounds checked
before any access, large inputs left for a thread, and an unregister that never closes a
descriptor under a request."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from protocol.errors import InvalidArgument, NotFound, TooLarge, Unavailable
from protocol.shared_memory import placeholder
from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor
from server.core.client_shm import SHM_DIR, SharedMemoryRegistry


@pytest.fixture
def key() -> Iterator[str]:
    name = f"ascend_unit_{uuid.uuid4().hex[:12]}"
    with open(os.path.join(SHM_DIR, name), "wb") as handle:
        handle.write(np.arange(64, dtype=np.int32).tobytes())  # 256 bytes
    yield "/" + name
    os.unlink(os.path.join(SHM_DIR, name))


def _request(region: str, offset: int = 0, size: int = 16) -> InferRequest:
    tensor = Tensor(
        "x",
        "INT32",
        (4,),
        placeholder(np.int32),
        {
            "shared_memory_region": region,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": size,
        },
    )
    out = RequestedOutput(
        "y",
        parameters={
            "shared_memory_region": region,
            "shared_memory_offset": 128,
            "shared_memory_byte_size": 16,
        },
    )
    return InferRequest("m", inputs=[tensor], outputs=[out])


def test_inputs_are_private_copies_and_outputs_are_written(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    request = _request("r", offset=16)
    binding = registry.bind(request)
    data = request.inputs[0].data
    assert list(data) == [4, 5, 6, 7]
    os.truncate(os.path.join(SHM_DIR, key[1:]), 0)
    assert list(data) == [4, 5, 6, 7]  # a copy: the file shrinking cannot fault it
    os.truncate(os.path.join(SHM_DIR, key[1:]), 256)
    assert request.inputs[0].parameters == {}
    response = binding.finish(
        InferResponse(
            "m", "1", outputs=[Tensor("y", "INT32", (4,), np.array([9, 9, 9, 9], np.int32))]
        )
    )
    assert response.outputs[0].data.size == 0
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as handle:
        assert list(np.frombuffer(handle.read(), np.int32)[32:36]) == [9, 9, 9, 9]


@pytest.mark.parametrize("size", [0, 20, 140])
def test_a_shrunk_file_is_an_error_naming_the_region(key: str, size: int) -> None:
    """Truncated under the region: the input (at 0..16) or the output (at 128..144) past the
    file's new end is refused with the region's name; the part still there is read."""
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    os.truncate(os.path.join(SHM_DIR, key[1:]), size)
    request = _request("r")
    if size < 16:
        with pytest.raises(InvalidArgument, match="shared memory region 'r' no longer holds"):
            registry.bind(request)
        return
    binding = registry.bind(request)
    assert binding is not None
    response = InferResponse(
        "m", "1", outputs=[Tensor("y", "INT32", (4,), np.array([9, 9, 9, 9], np.int32))]
    )
    if size < 144:
        with pytest.raises(InvalidArgument, match="shared memory region 'r' no longer holds"):
            binding.finish(response)
    else:
        binding.finish(response)
    binding.release()


def test_large_inputs_are_left_for_a_thread_and_held_to_the_request_limit(key: str) -> None:
    registry = SharedMemoryRegistry(max_input_bytes=32, offload_threshold=8)
    registry.register("r", key, 0, 256)
    request = _request("r", offset=16)
    binding = registry.bind(request)
    assert binding is not None and len(binding.deferred) == 1
    binding.read_deferred()
    assert list(request.inputs[0].data) == [4, 5, 6, 7] and not binding.deferred
    binding.release()
    big = _request("r", size=64)
    big.inputs[0].shape = (16,)
    with pytest.raises(TooLarge, match="shared memory region 'r'.*--http-max-input-size"):
        registry.bind(big)
    assert registry.regions["r"].users == 0


def test_the_descriptor_goes_with_the_last_holder(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    region = registry.regions["r"]
    fd = region.fd
    registry.unregister("r")
    os.fstat(fd)  # still open: the object is alive
    del region
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_shared_memory_no_binding() -> None:
    request = InferRequest("m", inputs=[Tensor("x", "INT32", (1,), np.zeros(1, np.int32))])
    assert SharedMemoryRegistry().bind(request) is None


def test_unregister_waits_for_the_requests_using_a_region(key: str) -> None:
    """As in Triton: a region unregistered while in use stays (listed and usable) until its
    last request is done; tensors read from it stay valid after that."""
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    first, second = _request("r"), _request("r")
    binding = registry.bind(first)
    registry.unregister()
    assert [r["name"] for r in registry.status()] == ["r"]
    later = registry.bind(second)  # still usable, as Triton allows
    binding.finish(
        InferResponse("m", "1", outputs=[Tensor("y", "INT32", (4,), np.ones(4, np.int32))])
    )
    binding.release()
    binding.release()  # idempotent
    assert [r["name"] for r in registry.status()] == ["r"]
    later.release()
    assert registry.status() == []
    assert list(first.inputs[0].data) == [0, 1, 2, 3]  # a copy: still valid
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"):
        registry.bind(_request("r"))


def test_a_failed_bind_holds_nothing(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    with pytest.raises(NotFound):
        registry.bind(
            _request("r").__class__(
                "m",
                inputs=_request("r").inputs,
                outputs=[
                    RequestedOutput(
                        "y",
                        parameters={"shared_memory_region": "nope", "shared_memory_byte_size": 4},
                    )
                ],
            )
        )
    registry.unregister("r")
    assert registry.status() == []


@pytest.mark.parametrize(
    "offset, size, text",
    [
        (256, 4, "Invalid offset for shared memory region: 'r'"),
        (250, 16, "Invalid offset + byte size for shared memory region: 'r'"),
        (
            32,
            2**64 - 32,
            "Integer overflow detected: byte_size (18446744073709551584) + offset "
            "(32) exceeds maximum value (18446744073709551615) for region 'r'",
        ),
    ],
)
def test_bounds_checked_before_access(key: str, offset: int, size: int, text: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 256)
    with pytest.raises(InvalidArgument, match=re.escape(text)):
        registry.bind(_request("r", offset, size))


def test_register_limits_and_refusals(key: str, tmp_path) -> None:
    registry = SharedMemoryRegistry(max_regions=1)
    with pytest.raises(InvalidArgument, match="invalid args"):
        registry.register("r", key, 0, 0)
    with pytest.raises(InvalidArgument, match="invalid args"):
        registry.register("r", key, 200, 57)
    registry.register("r", key, 200, 56)  # unaligned offset: mapped from the page below
    with pytest.raises(Unavailable, match="--max-shared-memory-regions"):
        registry.register("s", key, 0, 8)
    link = os.path.join(SHM_DIR, f"ascend_link_{uuid.uuid4().hex[:8]}")
    os.symlink(os.path.join(SHM_DIR, key[1:]), link)
    try:
        with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
            SharedMemoryRegistry().register("l", "/" + os.path.basename(link), 0, 8)
    finally:
        os.unlink(link)
