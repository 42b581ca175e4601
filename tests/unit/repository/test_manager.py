"""The manager's hot swap, failure handling, keep/versions filters, file overrides, warm-up and
dependents, with a fake scheduler whose copies are told apart by a `tag` file in the version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError
from examples.build_repository import simple_config
from protocol.config_json import config_from_json
from protocol.errors import Unavailable
from protocol.types import InferRequest, InferResponse, Tensor
from repository.manager import LoadError, ManagerSettings, ModelManager
from repository.overrides import PREFIX
from repository.registry import ModelRegistry, ModelState
from scheduler.interface import Scheduler, VersionSpec
from scheduler.stats import VersionStatistics


class FakeScheduler(Scheduler):
    """Answers at once with its tag, or holds requests while `hold` is set."""

    instances: list[FakeScheduler] = []

    def __init__(self, spec: VersionSpec, stats: VersionStatistics, **_: object) -> None:
        super().__init__(spec, stats)
        tag_file = spec.version_dir / "tag"
        self.tag = tag_file.read_text() if tag_file.exists() else "untagged"
        self.hold = False
        self.held: list[asyncio.Future] = []
        self.accepting = False
        self.stopped = False
        self.submitted = 0
        FakeScheduler.instances.append(self)

    async def start(self) -> None:
        if (self.spec.version_dir / "fail").exists():
            raise BackendError("corrupt weights")
        self.accepting = True

    def healthy(self) -> bool:
        return True

    def _answer(self) -> InferResponse:
        return InferResponse(
            self.spec.name,
            str(self.spec.version),
            outputs=[Tensor("TAG", "BYTES", (1,), np.array([self.tag.encode()], dtype=object))],
        )

    def submit(self, request: InferRequest) -> asyncio.Future:
        """No validation: these tests are about loading and swapping, not requests."""
        return self._admit(request)

    def _admit(self, request: InferRequest) -> asyncio.Future:
        if not self.accepting:
            raise Unavailable(
                f"'{self.spec.name}' version {self.spec.version} is not at ready state"
            )
        self.submitted += 1
        self._stats.record_execution(1, 0, 0, 0)
        future = asyncio.get_running_loop().create_future()
        if self.spec.config.parameters.get("warmup_fails") and request.id.startswith("warmup"):
            future.set_exception(Unavailable("warm-up blew up"))
        elif self.hold:
            self.held.append(future)
        else:
            future.set_result(self._answer())
        return future

    def release(self) -> None:
        for future in self.held:
            if not future.done():
                future.set_result(self._answer())

    async def drain(self, timeout: float) -> None:
        self.accepting = False
        for _ in range(int(timeout * 100)):
            if all(f.done() for f in self.held):
                break
            await asyncio.sleep(0.01)
        for future in self.held:
            if not future.done():
                future.set_exception(Unavailable("not at ready state"))

    async def stop(self) -> None:
        self.stopped = True


class Hooks:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def version_loaded(self, name: str, version: int, load_seconds: float) -> None:
        self.events.append(("loaded", name, version))

    def version_unloaded(self, name: str, version: int) -> None:
        self.events.append(("unloaded", name, version))


def model(
    repo: Path, name: str = "m", versions: dict[int, str] | None = None, extra: str = ""
) -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(simple_config(name, 8) + extra)
    for version, tag in (versions or {1: "a"}).items():
        version_dir = model_dir / str(version)
        version_dir.mkdir(exist_ok=True)
        (version_dir / "model.onnx").write_bytes(b"weights")
        (version_dir / "tag").write_text(tag)
    return model_dir


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


def manager_for(repo: Path, **settings) -> tuple[ModelManager, ModelRegistry, Hooks]:  # type: ignore[no-untyped-def]
    registry = ModelRegistry()
    hooks = Hooks()
    manager = ModelManager(
        ManagerSettings([repo], auto_complete=False, drain_timeout=5.0, **settings),
        registry,
        hooks,  # type: ignore[arg-type]
        scheduler_factory=FakeScheduler,
    )
    return manager, registry, hooks


def serving(registry: ModelRegistry, name: str = "m", version: str = "") -> FakeScheduler:
    return registry.resolve(name, version).scheduler  # type: ignore[return-value]


def states(registry: ModelRegistry, name: str = "m") -> dict[int, tuple[str, str]]:
    return {v: (r.state.value, r.reason) for v, r in registry.get(name).versions.items()}


async def test_reload_publishes_the_new_copy_while_the_old_one_finishes_its_requests(
    repo: Path,
) -> None:
    manager, registry, hooks = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    old = serving(registry)
    old.hold = True
    admitted = [old.submit(InferRequest("m")) for _ in range(3)]
    (repo / "m" / "1" / "tag").write_text("b")
    reload = asyncio.create_task(manager.load_model("m"))
    while serving(registry) is old:
        await asyncio.sleep(0.01)
    new = serving(registry)
    assert new.tag == "b" and not reload.done()  # published; the old copy is still draining
    assert not any(f.done() for f in admitted)
    with pytest.raises(Unavailable):
        old.submit(InferRequest("m"))  # the old copy admits nothing new
    old.release()
    await reload
    assert [f.result().outputs[0].data[0] for f in admitted] == [b"a"] * 3
    assert old.stopped and not new.stopped
    assert hooks.events == [("loaded", "m", 1), ("unloaded", "m", 1), ("loaded", "m", 1)]
    assert states(registry) == {1: ("READY", "")}


async def test_a_failed_new_version_leaves_the_old_one_serving(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    model(repo, versions={2: "b"})
    (repo / "m" / "2" / "fail").touch()
    with pytest.raises(
        LoadError,
        match="load failed for model 'm': version 2 is at UNAVAILABLE state: corrupt weights;",
    ):
        await manager.load_model("m")
    assert states(registry) == {1: ("READY", ""), 2: ("UNAVAILABLE", "corrupt weights")}
    assert serving(registry).tag == "a"
    (repo / "m" / "2" / "fail").unlink()
    await manager.load_model("m")
    assert states(registry) == {1: ("UNAVAILABLE", "unloaded"), 2: ("READY", "")}
    assert serving(registry).tag == "b"


async def test_a_failed_reload_of_the_same_version_keeps_the_old_copy(repo: Path) -> None:
    manager, registry, hooks = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    (repo / "m" / "1" / "fail").touch()
    with pytest.raises(LoadError):
        await manager.load_model("m")
    version = registry.get("m").versions[1]
    assert version.state is ModelState.READY
    assert version.reason == "reload failed, still serving the previous copy: corrupt weights"
    assert hooks.events == [("loaded", "m", 1)]


async def test_a_broken_config_edit_keeps_the_old_copy_and_says_why(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    (repo / "m" / "config.pbtxt").write_text("max_batch_size: [[[\n")
    with pytest.raises(LoadError, match="config.pbtxt:1"):
        await manager.load_model("m")
    ((state, reason),) = states(registry).values()
    assert state == "READY" and reason.startswith("reload failed, still serving the previous copy")
    assert serving(registry).tag == "a"


async def test_unchanged_versions_are_kept_and_the_filter_hides_unfinished_ones(repo: Path) -> None:
    manager, registry, hooks = manager_for(repo)
    model(repo, versions={1: "a"}, extra="version_policy { all { } }\n")
    await manager.load_model("m")
    first = serving(registry, version="1")
    model(repo, versions={2: "b", 3: "c"}, extra="version_policy { all { } }\n")
    await manager.load_model("m", versions={1, 2}, keep={1})
    assert serving(registry, version="1") is first
    assert serving(registry, version="2").tag == "b"
    assert 3 not in registry.get("m").versions
    assert hooks.events == [("loaded", "m", 1), ("loaded", "m", 2)]


async def test_unload_then_load_again(repo: Path) -> None:
    manager, registry, hooks = manager_for(repo)
    model(repo, versions={1: "a", 2: "b"}, extra="version_policy { all { } }\n")
    await manager.load_model("m")
    await manager.unload_model("m")
    assert states(registry) == {1: ("UNAVAILABLE", "unloaded"), 2: ("UNAVAILABLE", "unloaded")}
    assert all(s.stopped for s in FakeScheduler.instances[-2:])
    assert sorted(hooks.events[-2:]) == [("unloaded", "m", 1), ("unloaded", "m", 2)]
    with pytest.raises(Unavailable):
        registry.resolve("m")
    await manager.load_model("m")
    assert serving(registry).tag == "b"


async def test_unknown_models_leave_no_trace(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    with pytest.raises(
        LoadError, match="failed to load 'nope', failed to poll from model repository"
    ):
        await manager.load_model("nope")
    await manager.unload_model("nope")
    assert registry.models == {}
    # Nor any state per name: a client trying a million names leaves the memory as it was.
    for name in ("nope", "nope2", "nope3"):
        with pytest.raises(LoadError):
            await manager.load_model(name)
    assert manager.lock_count() == 0


async def test_concurrent_loads_of_one_name_share_its_lock_and_then_drop_it(repo: Path) -> None:
    model(repo)
    manager, registry, _ = manager_for(repo)
    await asyncio.gather(*(manager.load_model("m") for _ in range(3)))
    assert manager.lock_count() == 0
    assert serving(registry).tag


async def test_a_model_in_two_repositories_is_unavailable(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    model(repo)
    model(other)
    manager, registry, _ = manager_for(repo)
    manager.settings.repositories.append(other)
    with pytest.raises(LoadError, match="model appears in two or more repositories"):
        await manager.load_model("m")
    record = registry.get("m")
    assert (record.state, record.reason) == (
        ModelState.UNAVAILABLE,
        "model appears in two or more repositories",
    )


async def test_file_overrides_load_from_a_private_directory_removed_when_replaced(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    private_root = tmp_path / "tmp"
    private_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_root))
    manager, registry, _ = manager_for(repo)
    config = config_from_json(
        '{"backend": "onnxruntime", "max_batch_size": 8, '
        '"input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}],'
        '"output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]}]}'
    )
    await manager.load_model("private", config, files={"1/model.onnx": b"w", "1/tag": b"p1"})
    first = serving(registry, "private")
    assert first.tag == "p1" and first.spec.model_dir.name.startswith(PREFIX)
    await manager.load_model("private", config, files={"1/model.onnx": b"w", "1/tag": b"p2"})
    assert serving(registry, "private").tag == "p2"
    assert not first.spec.model_dir.exists()  # the replaced copy's directory is gone
    with pytest.raises(LoadError, match="escapes"):
        await manager.load_model("private", config, files={"1/../../../x": b"w"})
    assert serving(registry, "private").tag == "p2"
    await manager.unload_model("private")
    assert list(private_root.iterdir()) == []


async def test_warmup_runs_before_ready_and_its_counts_are_forgotten(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    warmup = (
        'model_warmup [ { name: "zeros" batch_size: 3 count: 2 inputs [\n'
        '  { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [16] zero_data: true } },\n'
        '  { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [16] random_data: true } } ]\n'
        "} ]\n"
    )
    model(repo, extra=warmup)
    await manager.load_model("m")
    scheduler = serving(registry)
    assert scheduler.submitted == 6
    assert scheduler.statistics.inference_count == 0 and scheduler.statistics.execution_count == 0


async def test_a_failing_warmup_fails_the_load(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    warmup = (
        'model_warmup [ { name: "boom" batch_size: 1 inputs [\n'
        '  { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [16] zero_data: true } },\n'
        '  { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [16] zero_data: true } } ]\n'
        '} ]\nparameters { key: "warmup_fails" value: { string_value: "1" } }\n'
    )
    model(repo, extra=warmup)
    with pytest.raises(LoadError, match="failed to run warmup sample 'boom': warm-up blew up"):
        await manager.load_model("m")
    assert states(registry) == {
        1: ("UNAVAILABLE", "failed to run warmup sample 'boom': warm-up blew up")
    }
    assert FakeScheduler.instances[-1].stopped


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "INPUT0" value: "IN" }
    input_map { key: "INPUT1" value: "IN" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "b" model_version: -1 input_map { key: "INPUT0" value: "mid" }
    input_map { key: "INPUT1" value: "mid" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


async def test_explicit_ensemble_loads_its_members_and_unload_dependents_unloads_them(
    repo: Path,
) -> None:
    manager, registry, _ = manager_for(repo, load_dependencies=True)
    model(repo, "a")
    model(repo, "b")
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    await manager.load_model("b")  # already loaded: not a dependent of the ensemble
    await manager.load_model("ens")
    assert registry.get("a").ready_versions() == [1] and registry.get("ens").ready_versions() == [1]
    await manager.unload_model("ens", unload_dependents=True)
    assert registry.get("a").ready_versions() == []
    assert registry.get("b").ready_versions() == [1]


async def test_shutdown_retires_everything_and_refuses_new_loads(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    scheduler = serving(registry)
    await manager.shutdown(drain_timeout=0)
    assert scheduler.stopped
    with pytest.raises(LoadError, match="shutting down"):
        await manager.load_model("m")


@pytest.fixture(autouse=True)
def _forget_instances() -> None:
    FakeScheduler.instances.clear()


async def test_labels_are_read_when_a_copy_loads_and_again_on_reload(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    model_dir = model(repo)
    config = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(
        config.replace('"OUTPUT0"', '"OUTPUT0" label_filename: "labels.txt"')
    )
    (model_dir / "labels.txt").write_text("cat\ndog\n")
    await manager.load_model("m")
    assert registry.resolve("m").labels == {"OUTPUT0": ["cat", "dog"]}
    (model_dir / "labels.txt").write_text("emu\n")
    assert registry.resolve("m").labels == {"OUTPUT0": ["cat", "dog"]}  # the loaded copy's
    (model_dir / "1" / "tag").write_text("b")  # a change, so the reload builds a new copy
    await manager.load_model("m")
    assert registry.resolve("m").labels == {"OUTPUT0": ["emu"]}


def _strict_core(manager: ModelManager, registry: ModelRegistry):  # type: ignore[no-untyped-def]
    from server.core.inference_core import InferenceCore
    from server.core.inference_path import InferencePath
    from server.settings import ServerSettings

    core = InferenceCore(ServerSettings(), registry, manager, InferencePath(registry))
    core.started = True
    return core


async def _version_1_loaded_with_auto_complete(repo: Path):  # type: ignore[no-untyped-def]
    """Model `m` version 1 (a real ONNX model) loaded with auto-complete, which reads the
    model files; returns (manager, registry, model_dir, strict core)."""
    from examples.variants import model_bytes

    manager, registry, _ = manager_for(repo)
    manager.settings.auto_complete = True
    model_dir = model(repo)
    (model_dir / "1" / "model.onnx").write_bytes(model_bytes(0))
    await manager.load_model("m")
    return manager, registry, model_dir, _strict_core(manager, registry)


async def test_a_new_version_that_fails_before_it_is_built_shows_unavailable_beside_the_old(
    repo: Path,
) -> None:
    """Issue #13 item 9: auto-complete cannot read the new version's model file."""
    from examples.variants import model_bytes

    manager, registry, model_dir, core = await _version_1_loaded_with_auto_complete(repo)
    assert core.ready()
    model(repo, versions={2: "b"})  # 2/model.onnx holds no ONNX model
    with pytest.raises(LoadError, match="auto-complete failed"):
        await manager.load_model("m")
    versions = states(registry)
    assert versions[1][0] == "READY" and versions[1][1].startswith("reload failed, still serving")
    assert versions[2][0] == "UNAVAILABLE"
    assert "auto-complete failed" in versions[2][1] and "2/model.onnx" in versions[2][1]
    assert serving(registry).tag == "a"
    entries = {e.version: (e.state, e.reason) for e in core.repository_index() if e.name == "m"}
    assert entries["1"][0] == "READY" and entries["2"] == versions[2]
    assert not core.ready()  # the version the policy wants is unavailable
    (model_dir / "2" / "model.onnx").write_bytes(model_bytes(1))
    await manager.load_model("m")
    assert states(registry) == {1: ("UNAVAILABLE", "unloaded"), 2: ("READY", "")}
    assert core.ready()


async def test_a_failed_version_leaves_the_index_once_gone_or_no_longer_wanted(repo: Path) -> None:
    from examples.variants import model_bytes

    manager, registry, model_dir, core = await _version_1_loaded_with_auto_complete(repo)
    model(repo, versions={2: "b"})
    with pytest.raises(LoadError):
        await manager.load_model("m", versions={1, 2}, keep={1})  # as the poller asks
    assert states(registry)[2][0] == "UNAVAILABLE"
    (model_dir / "2" / "model.onnx").unlink()
    (model_dir / "2" / "tag").unlink()
    (model_dir / "2").rmdir()  # the deploy was taken back
    await manager.load_model("m", versions={1}, keep={1})
    assert states(registry) == {1: ("READY", "")} and core.ready()
    # a version that fails after it was built stays in the index until the policy moves on
    model(repo, versions={2: "b"})
    (model_dir / "2" / "model.onnx").write_bytes(model_bytes(2))
    (model_dir / "2" / "fail").touch()  # the version is built, then fails to start
    with pytest.raises(LoadError, match="version 2 is at UNAVAILABLE state: corrupt weights;"):
        await manager.load_model("m")
    assert states(registry)[2] == ("UNAVAILABLE", "corrupt weights") and not core.ready()
    model(repo, versions={3: "c"})
    (model_dir / "3" / "model.onnx").write_bytes(model_bytes(3))
    await manager.load_model("m")  # latest 1 now wants version 3: version 2 is forgotten
    assert states(registry) == {1: ("UNAVAILABLE", "unloaded"), 3: ("READY", "")}
    assert core.ready()


async def test_a_broken_config_names_no_version(repo: Path) -> None:
    manager, registry, _ = manager_for(repo)
    model(repo)
    await manager.load_model("m")
    model(repo, versions={2: "b"})
    (repo / "m" / "config.pbtxt").write_text("max_batch_size: [[[\n")
    with pytest.raises(LoadError):
        await manager.load_model("m")
    assert list(states(registry)) == [1]  # no policy to read: the reason shows on version 1


async def test_a_kept_version_survives_a_version_policy_change_but_not_another_config_change(
    repo: Path,
) -> None:
    """What the poller asks to keep stays only while the config is the same but for the
    version policy (Triton's reload rule)."""
    manager, registry, hooks = manager_for(repo)
    model(repo, versions={1: "a", 2: "b"}, extra="version_policy { specific { versions: [1] } }\n")
    await manager.load_model("m", versions={1, 2}, keep=())
    first = serving(registry, version="1")
    model(repo, versions={1: "a", 2: "b"}, extra="version_policy { all { } }\n")
    await manager.load_model("m", versions={1, 2}, keep={1, 2})
    assert serving(registry, version="1") is first  # kept: only the policy changed
    assert serving(registry, version="2").tag == "b"
    model(
        repo, versions={1: "a", 2: "b"}, extra="version_policy { all { } }\ndynamic_batching { }\n"
    )
    await manager.load_model("m", versions={1, 2}, keep={1, 2})
    assert serving(registry, version="1") is not first  # rebuilt: the config changed
