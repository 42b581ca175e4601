"""Every process the server starts ends when the server ends, however it ends, and a model's
processes end when the model is unloaded (issue 28, items 8 and 11).

The server runs with every kind of process it can start: HTTP parser processes (bodies over
--http-offload-threshold), a second frontend process (--frontend-processes 2) with its own parser
processes, and a Python model whose model.py starts three processes of its own (harness
FORKER_MODEL: a `sleep`, a `sleep` in a new session, a fork of itself). The tree is recorded
before the server is stopped (orphans are re-parented, so it cannot be found from the server
afterwards): every descendant of the server, and every process carrying the test's mark in its
environment. Then no recorded pid may still run a few seconds later, nor any marked process.
Whatever is left is killed by pid, so a failing test leaves nothing behind."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.procutil import (
    command_line,
    descendants,
    kill_quietly,
    marked,
    wait_for,
    wait_gone,
)
from harness.serverproc import ServerProcess, start_server
from harness.testmodels import FORKER_MODEL, sleeper_config, write_python_model

pytestmark = pytest.mark.e2e

MARK = "ASCEND_SERVE_PROCESS_TREE_TEST"
ENDED_WITHIN_S = 10.0  # "a few seconds": the kernel and the supervisors act at once
THRESHOLD = 1024  # --http-offload-threshold: bodies over it go to a parser process
LARGE_INDEX_BODY = b'{"ready": true}' + b" " * (64 * 1024)


@pytest.fixture
def mark() -> Iterator[str]:
    """This test's mark; every process still carrying it at the end is killed."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked(MARK, value):
        kill_quietly(pid)


def forker_repo(root: Path) -> Path:
    write_python_model(root, "forker", FORKER_MODEL, sleeper_config("forker"))
    return root


def model_children(repo: Path) -> list[int]:
    path = repo / "forker" / "children.pid"
    wait_for(path.exists, "the model to write its children's pids", timeout=30)
    return [int(line) for line in path.read_text().split()]


def tree(server: ServerProcess, value: str) -> dict[int, str]:
    """The server's processes now, with their command lines: its descendants and whatever
    carries the mark."""
    pids = ({server.pid} | descendants(server.pid) | marked(MARK, value)) - {os.getpid()}
    return {pid: command_line(pid) for pid in pids}


def describe(pids: set[int] | dict[int, str]) -> str:
    names = pids if isinstance(pids, dict) else {pid: command_line(pid) for pid in pids}
    return "\n".join(f"  {pid}: {names[pid]}" for pid in sorted(names))


def use_parser_processes(server: ServerProcess) -> None:
    """Large bodies on fresh connections, so that each frontend process parses some."""
    for _ in range(12):
        with httpx.Client(timeout=30) as client:
            reply = client.post(server.base + "/v2/repository/index", content=LARGE_INDEX_BODY)
            assert reply.status_code == 200, reply.text


def start(repo: Path, log_dir: Path, value: str, extra: tuple[str, ...] = ()) -> ServerProcess:
    return start_server(
        [repo],
        [
            "--frontend-processes",
            "2",
            "--http-offload-threshold",
            str(THRESHOLD),
            "--http-parser-processes",
            "2",
            *extra,
        ],
        env={MARK: value},
        log_dir=log_dir,
    )


def assert_all_end(before: dict[int, str], value: str, server: ServerProcess) -> None:
    left = {pid for pid in before if not wait_gone(pid, ENDED_WITHIN_S)}
    left |= marked(MARK, value)
    assert not left, (
        f"processes outlived the server:\n{describe(left)}\nrecorded before:\n{describe(before)}"
        f"\nserver log:\n{server.log()[-3000:]}"
    )


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_every_process_the_server_started_ends_with_it(how: str, tmp_path: Path, mark: str) -> None:
    repo = forker_repo(tmp_path / "repo")
    server = start(repo, tmp_path, mark)
    try:
        children = model_children(repo)
        use_parser_processes(server)
        before = tree(server, mark)
        assert set(children) <= before.keys(), describe(before)
        assert len(before) >= 8, describe(before)  # server, frontend, parsers, worker, children
        os.kill(server.pid, getattr(signal, how))
        code = server.process.wait(60)
        if how != "SIGKILL":
            assert code == 0, server.log()[-3000:]
        assert_all_end(before, mark, server)
    finally:
        server.stop()


def test_a_models_processes_end_when_it_is_unloaded(tmp_path: Path, mark: str) -> None:
    repo = forker_repo(tmp_path / "repo")
    server = start(
        repo, tmp_path, mark, ("--model-control-mode", "explicit", "--load-model", "forker")
    )
    try:
        children = model_children(repo)
        ours = descendants(server.pid)
        frontends = {pid for pid in ours if "server.multiprocess.child" in command_line(pid)}
        model = (ours | marked(MARK, mark)) - frontends - {server.pid}
        for frontend in frontends:
            model -= descendants(frontend)
        assert set(children) <= model, describe(model)
        reply = httpx.post(server.base + "/v2/repository/models/forker/unload", timeout=60)
        assert reply.status_code == 200, reply.text
        left = {pid for pid in model if not wait_gone(pid, ENDED_WITHIN_S)}
        assert not left, f"processes outlived their model's unload:\n{describe(left)}"
        assert server.alive()
        assert httpx.get(server.base + "/v2/health/live", timeout=10).status_code == 200
    finally:
        server.stop()
    left = marked(MARK, mark)
    assert not left, f"processes outlived the server:\n{describe(left)}"
