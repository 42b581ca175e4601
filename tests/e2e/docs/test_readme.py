"""The README's examples, run as written against a fresh server over the example repository.

Every fenced `console`, `bash` (`sh`, `shell`) and `python` block of README.md is either run
here or marked, on the line before its fence, `<!-- docs-check: skip: <why> -->` (it needs
hardware, docker, a cluster, or serves until stopped). A `console` block is a session: each `$ `
line is run with bash and what it prints must be the lines under it, up to the next `$ ` line.
A `python` block is run as a script, and when a `console` block without `$ ` lines follows it,
that block is what it must print; a `bash` block must exit 0. The blocks run in README order on
one server, as a user following the README would run them, with the README's ports
(localhost:8000, 8001, 8002) pointed at the test's, from a folder holding `examples/requests/`
(examples/request_files.py). Blocks of other languages (yaml, json) show data, not commands.

What may differ (nothing else): the `date:` header, the last digits of floating-point numbers
(another CPU or ONNX Runtime build rounds differently), and lines of an expected output that
start with `# `, which are the README's notes (`# (HTTP 400)`). `make docs-check` runs this file.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.serverproc import ROOT, ServerProcess
from tests.conftest import serving_examples

README = ROOT / "README.md"
SKIP = re.compile(r"<!--\s*docs-check:\s*skip:\s*(?P<why>.+?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")
README_PORTS = {"8000": "http_port", "8001": "grpc_port", "8002": "metrics_port"}
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
COMMAND_TIMEOUT = 120


@dataclass
class Block:
    lang: str
    line: int  # of the opening fence, 1-based
    text: str
    skip: str | None = None
    output: Block | None = None  # the console block that shows what a python block prints

    @property
    def is_output(self) -> bool:
        return self.lang == "console" and not any(
            line.startswith("$ ") for line in self.text.splitlines()
        )


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks, each with the skip marker before it and a python block's output."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None or not match["lang"]:
            index += 1
            continue
        start = index
        index += 1
        body = []
        while not lines[index].startswith("```"):
            body.append(lines[index])
            index += 1
        before = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        marker = SKIP.search(before)
        block = Block(match["lang"], start + 1, "\n".join(body), marker["why"] if marker else None)
        follows = start > 0 and lines[start - 1].startswith("```")
        if block.is_output and blocks and blocks[-1].lang == "python" and follows:
            blocks[-1].output = block
        else:
            blocks.append(block)
        index += 1
    return blocks


BLOCKS = [
    block
    for block in readme_blocks(README.read_text())
    if block.lang in ("console", "bash", "sh", "shell", "python")
]


def session(text: str) -> Iterator[tuple[str, str]]:
    """A console block's (command, expected output) pairs."""
    command: str | None = None
    output: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, "\n".join(output)
            command, output = line[2:], []
        elif command is not None:
            output.append(line)
    if command is not None:
        yield command, "\n".join(output)


def normalise(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    lines = [re.sub(r"^date: .*", "date: <date>", line) for line in lines]
    lines = [line for line in lines if not line.startswith("# ")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def same_line(actual: str, expected: str) -> bool:
    """Equal but for the last digits of decimal numbers (relative 1e-5)."""
    if NUMBER.sub("0.0", actual) != NUMBER.sub("0.0", expected):
        return False
    pairs = zip(NUMBER.findall(actual), NUMBER.findall(expected), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-5, abs_tol=1e-7) for a, b in pairs)


def assert_prints(actual: str, expected: str, what: str) -> None:
    got, want = normalise(actual), normalise(expected)
    same = len(got) == len(want) and all(map(same_line, got, want))
    assert same, f"{what}\n--- README shows:\n" + "\n".join(want) + "\n--- got:\n" + "\n".join(got)


def local(text: str, server: ServerProcess) -> str:
    """The README's ports pointed at the test server's."""
    for port, attribute in README_PORTS.items():
        text = text.replace(f"localhost:{port}", f"127.0.0.1:{getattr(server, attribute)}")
    return text


@pytest.fixture(scope="module")
def readme_server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of its own: the README's outputs (metrics counts) assume a fresh one."""
    with serving_examples(example_repository, tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the README's commands run: a folder with the request files under examples/."""
    from examples.request_files import write_request_files

    folder = tmp_path_factory.mktemp("readme")
    write_request_files(folder / "examples" / "requests")
    return folder


def run(args: list[str], cwd: Path, what: str) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_every_block_is_run_or_says_why_not() -> None:
    for block in BLOCKS:
        if block.lang == "console":
            assert block.skip or not block.is_output, (
                f"README.md:{block.line}: an output block that follows no python block"
            )
    checked = [block for block in BLOCKS if block.skip is None]
    assert len(checked) >= 7, "fewer README examples are checked than were"


@pytest.mark.parametrize(
    "block",
    [pytest.param(block, id=f"line{block.line}-{block.lang}") for block in BLOCKS],
)
def test_readme_block(block: Block, readme_server: ServerProcess, workdir: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"README.md:{block.line}: {block.skip}")
    where = f"README.md:{block.line}"
    if block.lang == "console":
        for command, expected in session(block.text):
            printed = run(["bash", "-c", local(command, readme_server)], workdir, command)
            assert_prints(printed, expected, f"{where}: $ {command}")
    elif block.lang != "python":  # bash, sh, shell
        run(["bash", "-e", "-c", local(block.text, readme_server)], workdir, f"{where} (bash)")
    else:
        printed = run([sys.executable, "-c", local(block.text, readme_server)], workdir, where)
        if block.output is not None:
            assert_prints(printed, block.output.text, f"{where} (python)")
