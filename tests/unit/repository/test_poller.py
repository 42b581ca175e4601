"""The poller's fingerprints and stability rule, driven by explicit poll() calls over real files
and a fake manager that records what it is asked to do."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from repository.fingerprint import ContentHasher, scan_model
from repository.layout import DUPLICATE_REASON
from repository.poller import RepositoryPoller


class FakeManager:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail_loads = False
        self.gate: asyncio.Event | None = None

    async def load_model(
        self,
        name: str,
        override: None = None,
        *,
        versions: Collection[int] | None = None,
        keep: Collection[int] = (),
    ) -> None:
        self.calls.append(("load", name, sorted(versions or ()), sorted(keep)))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_loads:
            raise RuntimeError("broken model")

    async def remove_model(self, name: str, reason: str) -> None:
        self.calls.append(("remove", name, reason))


def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)


def make_model(repo: Path, name: str = "m", versions: tuple[int, ...] = (1,)) -> Path:
    model = repo / name
    write(model / "config.pbtxt", 'backend: "onnxruntime"\n')
    for version in versions:
        write(model / str(version) / "model.onnx", f"weights {version}")
    return model


async def poll(poller: RepositoryPoller) -> None:
    await asyncio.gather(*await poller.poll())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


async def started(repo: Path, *repositories: Path) -> tuple[RepositoryPoller, FakeManager]:
    manager = FakeManager()
    poller = RepositoryPoller([repo, *repositories], manager, interval=1.0)
    await poller.prime()
    return poller, manager


async def test_an_unchanged_repository_causes_nothing(repo: Path) -> None:
    make_model(repo)
    poller, manager = await started(repo)
    for _ in range(3):
        await poll(poller)
    assert manager.calls == []


async def test_a_new_version_is_loaded_once_it_stayed_the_same_for_two_polls(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    write(model / "2" / "model.onnx", "weights 2")
    await poll(poller)
    assert manager.calls == []  # seen once: may still be copying
    await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1])]  # v1 unchanged: kept as it serves
    await poll(poller)
    assert len(manager.calls) == 1


async def test_a_growing_file_is_never_loaded_until_complete(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    target = model / "2" / "model.onnx"
    write(target, b"x")
    for size in range(2, 8):
        await poll(poller)
        with open(target, "ab") as handle:  # grows between every two polls
            handle.write(b"x")
        assert manager.calls == [], f"loaded while the file was {size - 1} bytes"
    await poll(poller)
    assert manager.calls == []
    await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1])]


async def test_an_empty_version_directory_is_not_a_version(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    (model / "2").mkdir()
    for _ in range(3):
        await poll(poller)
    assert manager.calls == []


async def test_a_removed_version_reloads_keeping_the_rest(repo: Path) -> None:
    model = make_model(repo, versions=(1, 2))
    poller, manager = await started(repo)
    shutil.rmtree(model / "1")
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("load", "m", [2], [2])]


async def test_config_and_label_changes_reload_every_version(repo: Path) -> None:
    """A config change leaves unchanged versions to the manager, which keeps them only when the
    config is the same but for the version policy; any other model-level file reloads all."""
    model = make_model(repo, versions=(1, 2))
    poller, manager = await started(repo)
    write(model / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 4\n')
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1, 2])]
    write(model / "labels.txt", "cat\ndog\n")
    await poll(poller)
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1, 2], [])


async def test_same_size_content_with_a_preserved_mtime_is_still_a_change(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    target = model / "1" / "model.onnx"
    before = target.stat()
    write(target, "weights 9")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p would
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("load", "m", [1], [])]


async def test_rewriting_identical_bytes_with_a_new_mtime_reloads(repo: Path) -> None:
    """Touching a file is the usual way to ask a polling server for a reload."""
    model = make_model(repo)
    poller, manager = await started(repo)
    target = model / "1" / "model.onnx"
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("load", "m", [1], [])]


async def test_a_new_model_appears_only_when_complete_and_leaves_after_two_polls(
    repo: Path,
) -> None:
    make_model(repo)
    poller, manager = await started(repo)
    write(repo / "late" / "config.pbtxt", 'backend: "onnxruntime"\n')
    await poll(poller)
    await poll(poller)
    assert manager.calls == []  # a config without any version is not loadable yet
    write(repo / "late" / "1" / "model.onnx", "weights")
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("load", "late", [1], [])]
    shutil.rmtree(repo / "late")
    await poll(poller)
    assert manager.calls[-1][0] == "load"
    await poll(poller)
    assert manager.calls[-1] == ("remove", "late", "unloaded")
    await poll(poller)
    assert len(manager.calls) == 2


async def test_a_model_in_two_repositories_is_removed_with_triton_reason(
    repo: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    make_model(repo)
    poller, manager = await started(repo, other)
    make_model(other)
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("remove", "m", DUPLICATE_REASON)]
    await poll(poller)
    assert len(manager.calls) == 1
    shutil.rmtree(other / "m")
    await poll(poller)
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1], [])


async def test_a_failed_load_is_not_retried_but_later_changes_are_seen(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    manager.fail_loads = True
    write(model / "2" / "model.onnx", "corrupt")
    for _ in range(4):
        await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1])]
    manager.fail_loads = False
    write(model / "2" / "model.onnx", "fixed weights")
    await poll(poller)
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1, 2], [1])
    assert len(manager.calls) == 2


async def test_a_version_rewritten_in_place_waits_until_it_settles(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    target = model / "1" / "model.onnx"
    for _ in range(3):
        with open(target, "ab") as handle:
            handle.write(b"more")
        await poll(poller)
    assert manager.calls == []
    await poll(poller)
    assert manager.calls == [("load", "m", [1], [])]


async def test_a_model_busy_loading_is_looked_at_again_when_done(repo: Path) -> None:
    model = make_model(repo)
    poller, manager = await started(repo)
    manager.gate = asyncio.Event()
    write(model / "2" / "model.onnx", "weights 2")
    await poller.poll()
    running = await poller.poll()
    assert len(running) == 1
    write(model / "3" / "model.onnx", "weights 3")
    await poller.poll()
    assert await poller.poll() == []  # busy: the new version waits
    manager.gate.set()
    await asyncio.gather(*running)
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1, 2, 3], [1, 2])


async def test_polling_survives_a_repository_that_vanishes(repo: Path) -> None:
    make_model(repo)
    poller, manager = await started(repo)
    shutil.rmtree(repo)
    await poll(poller)
    await poll(poller)
    assert manager.calls == [("remove", "m", "unloaded")]
    make_model(repo)
    await poll(poller)
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1], [])


def test_scan_groups_files_into_model_level_and_versions(tmp_path: Path) -> None:
    model = make_model(tmp_path, versions=(1, 3))
    write(model / "labels.txt", "a\n")
    write(model / "warmup" / "in.bin", b"\0" * 4)
    write(model / "07" / "ignored.onnx", "x")
    scanned = scan_model(model)
    assert scanned.versions == [1, 3]
    assert sorted(scanned.units[None]) == [
        "07/ignored.onnx",
        "config.pbtxt",
        "labels.txt",
        "warmup/in.bin",
    ]
    assert list(scanned.units[3]) == ["3/model.onnx"]


def test_hashes_are_cached_by_stat_and_forgotten_when_unused(tmp_path: Path, monkeypatch) -> None:
    model = make_model(tmp_path)
    hasher = ContentHasher()
    files = scan_model(model).units[1]
    reads: list[str] = []
    real_open = open

    def counting_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    first = hasher.fingerprint(model, files)
    second = hasher.fingerprint(model, files)
    assert first == second and len(reads) == 1
    hasher.end_round()
    hasher.end_round()  # a round without the file forgets it
    hasher.fingerprint(model, files)
    assert len(reads) == 2


async def test_a_symlink_loop_and_an_unreadable_model_do_not_stop_polling(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(repo)
    os.symlink(".", model / "1" / "loop")
    poller, manager = await started(repo)
    write(model / "2" / "model.onnx", "weights 2")
    locked = make_model(repo, "locked")
    real_digest = ContentHasher.digest

    def digest(self: ContentHasher, path: Path, key: tuple) -> str:  # type: ignore[type-arg]
        if str(path).startswith(str(locked)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_digest(self, path, key)

    monkeypatch.setattr(ContentHasher, "digest", digest)
    for _ in range(3):
        await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1])]
    monkeypatch.setattr(ContentHasher, "digest", real_digest)
    await poll(poller)
    assert manager.calls[-1] == ("load", "locked", [1], [])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def settling(repo: Path, settle: float) -> tuple[RepositoryPoller, FakeManager, FakeClock]:
    manager, clock = FakeManager(), FakeClock()
    poller = RepositoryPoller([repo], manager, interval=1.0, settle=settle, clock=clock)
    await poller.prime()
    return poller, manager, clock


async def test_a_version_loads_only_once_unchanged_for_the_settle_time(repo: Path) -> None:
    """Issue #13 item 8: a model.py copied in two parts 5 s apart loaded its first half."""
    model = make_model(repo)
    poller, manager, clock = await settling(repo, settle=10.0)
    write(model / "2" / "model.py", "def first_half(): pass\n")
    await poll(poller)  # first seen
    clock.now += 5
    await poll(poller)  # the same in two polls, 5 s apart: not long enough
    assert manager.calls == []
    write(model / "2" / "model.py", "def first_half(): pass\ndef second_half(): pass\n")
    clock.now += 9
    await poll(poller)  # changed: the wait starts again
    clock.now += 9
    await poll(poller)
    assert manager.calls == []
    clock.now += 1
    await poll(poller)  # 10 s unchanged
    assert manager.calls == [("load", "m", [1, 2], [1])]


async def test_the_settle_time_also_holds_back_config_changes(repo: Path) -> None:
    model = make_model(repo)
    poller, manager, clock = await settling(repo, settle=10.0)
    write(model / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 4\n')
    for _ in range(3):
        clock.now += 3
        await poll(poller)  # first seen at +3, then unchanged for 3 and 6 s
    assert manager.calls == []
    clock.now += 4
    await poll(poller)  # unchanged for 10 s
    assert manager.calls == [("load", "m", [1], [1])]  # the manager judges the config


async def test_a_ready_marker_written_last_loads_the_version_at_once(repo: Path) -> None:
    model = make_model(repo)
    poller, manager, clock = await settling(repo, settle=60.0)
    write(model / "2" / "model.onnx", "weights 2")
    await poll(poller)
    assert manager.calls == []
    write(model / "2" / ".ready", "")
    await poll(poller)
    assert manager.calls == [("load", "m", [1, 2], [1])]
    write(model / "2" / ".ready", "written again")  # the marker is not part of the contents
    clock.now += 120
    await poll(poller)
    await poll(poller)
    assert len(manager.calls) == 1
    time.sleep(0.05)  # a later ctime than the marker's, whatever the clock's granularity
    write(model / "2" / "model.onnx", "weights 2, rewritten in place")  # the marker is stale now
    await poll(poller)
    clock.now += 30
    await poll(poller)
    assert len(manager.calls) == 1
    clock.now += 30
    await poll(poller)
    assert manager.calls[-1] == ("load", "m", [1, 2], [1])


async def test_a_new_model_with_ready_markers_loads_without_the_settle_time(repo: Path) -> None:
    make_model(repo)
    poller, manager, _ = await settling(repo, settle=60.0)
    write(repo / "late" / "config.pbtxt", 'backend: "onnxruntime"\n')
    write(repo / "late" / "1" / "model.onnx", "weights")
    write(repo / "late" / "1" / ".ready", "")
    await poll(poller)  # a model's presence still needs two polls
    assert manager.calls == []
    await poll(poller)
    assert manager.calls == []  # the model-level files have no marker: they settle
    write(repo / "late" / ".ready", "")
    await poll(poller)
    assert manager.calls == [("load", "late", [1], [])]


def test_ready_markers_are_kept_apart_from_the_contents(tmp_path: Path) -> None:
    model = make_model(tmp_path, versions=(1, 2))
    write(model / "1" / ".ready", "")
    write(model / ".ready", "")
    write(model / "3" / ".ready", "")  # a marker alone is not a version
    scanned = scan_model(model)
    assert scanned.versions == [1, 2]
    assert list(scanned.units[1]) == ["1/model.onnx"]
    assert sorted(scanned.units[None]) == ["config.pbtxt"]
    assert scanned.marked_complete(1) and scanned.marked_complete(None)
    assert not scanned.marked_complete(2)


async def test_refresh_runs_before_each_scan_so_a_poll_sees_what_it_brought(
    tmp_path: Path,
) -> None:
    """A mirrored repository (repository/s3_mirror.py) is brought up to date by `refresh`; the
    scan of the same poll must see the result, never a mirror mid-update."""
    repo = tmp_path / "mirror"
    repo.mkdir()
    arrivals = [lambda: make_model(repo, "m", (1,)), lambda: None]
    refreshed: list[int] = []

    def refresh() -> None:
        refreshed.append(1)
        if arrivals:
            arrivals.pop(0)()

    manager = FakeManager()
    poller = RepositoryPoller([repo], manager, 0.1, settle=0.0, refresh=refresh)
    await poller.prime()
    assert refreshed == []  # startup synced before prime; prime does not sync again
    await poll(poller)  # the model arrives with this poll's refresh: seen once
    await poll(poller)  # seen twice in a row: loaded
    assert refreshed == [1, 1]
    assert manager.calls == [("load", "m", [1], [])]
