"""Start ascend-serve as a subprocess on free 127.0.0.1 ports, and stop it by its pid.

Shared by the e2e tests and the benchmarks. Every server started here is stopped (SIGTERM, then
SIGKILL) when its context exits, so no process is left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode


# What a server that lost a port to another process logs (server/net/listeners.py's
# ServiceStartError, in Triton's words).
PORT_RACE = ("already in use",)
PORT_ATTEMPTS = 3


def start_server(
    repositories: Sequence[Path | str],
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    wait_ready: bool | str = True,
    timeout: float = 60.0,
) -> ServerProcess:
    """`wait_ready`: wait for readiness (True), liveness (False), or a 200 from that path.

    A free port is only free when it is picked: another process (any client's outgoing
    connection, from the same range) may take it before the server binds. A server that exits
    for that reason is started again on fresh ports, up to PORT_ATTEMPTS times."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            return _start_once(repositories, extra_args, env, log_dir, wait_ready, timeout)
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


# Runs the suite's servers on the other gRPC server (--grpc-server aio) unless a test
# chooses itself.
GRPC_SERVER_ENV = "ASCEND_TEST_GRPC_SERVER"


def wait_until_ready(
    base: str, process: subprocess.Popen, timeout: float, path: str = "/v2/health/ready"
) -> bool:
    """Poll `base + path` until it answers 200 (True); False once `process` has exited or
    `timeout` seconds have passed (the caller says what that means and shows its log)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(base + path, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def _grpc_server_choice(extra_args: Sequence[str]) -> list[str]:
    choice = os.environ.get(GRPC_SERVER_ENV, "")
    if not choice or any(str(a).startswith("--grpc-server") for a in extra_args):
        return []
    return ["--grpc-server", choice]


def loopback_listeners(http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
    """The server flags that put its three listeners on 127.0.0.1 at these ports (tests and
    benchmarks never listen beyond the machine)."""
    return [
        "--http-address",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--grpc-address",
        "127.0.0.1",
        "--grpc-port",
        str(grpc_port),
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
    ]


class _PortTaken(RuntimeError):
    pass


def _start_once(
    repositories: Sequence[Path | str],
    extra_args: Sequence[str],
    env: dict[str, str] | None,
    log_dir: Path | None,
    wait_ready: bool | str,
    timeout: float,
) -> ServerProcess:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    args = [sys.executable, "-m", "server"]
    for repository in repositories:
        args += ["--model-repository", str(repository)]
    args += [
        *loopback_listeners(http_port, grpc_port, metrics_port),
        *extra_args,
        *_grpc_server_choice(extra_args),
    ]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else [])
    )
    full_env.update(env or {})
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_path = log_dir / f"ascend-serve-{http_port}.log"
    log_file = open(log_path, "wb")
    process = subprocess.Popen(
        args, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=str(ROOT)
    )
    log_file.close()
    server = ServerProcess(process, http_port, grpc_port, metrics_port, log_path)
    deadline = time.monotonic() + timeout
    path = (
        wait_ready
        if isinstance(wait_ready, str)
        else "/v2/health/ready"
        if wait_ready
        else "/v2/health/live"
    )
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = server.log()
            kind = _PortTaken if any(text in log for text in PORT_RACE) else RuntimeError
            raise kind(f"server exited with {process.returncode}:\n{log}")
        try:
            if httpx.get(server.base + path, timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(
        f"server did not become {'ready' if wait_ready else 'live'} in {timeout}s:\n{server.log()}"
    )


@contextmanager
def running_server(
    repositories: Sequence[Path | str],
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    wait_ready: bool | str = True,
    log_dir: Path | None = None,
) -> Iterator[ServerProcess]:
    server = start_server(repositories, extra_args, env, log_dir=log_dir, wait_ready=wait_ready)
    try:
        yield server
    finally:
        server.stop()
