"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1 on a free port.

`moto_subprocess()` runs it as its own process (the e2e tests; stopped by pid), `moto_thread()`
in a thread of the test process (the unit tests, which start no subprocess). Either way the
clients talk S3 over HTTP to it: nothing of boto3 is mocked. The credentials are made up and
unique per run, so a test can look for the secret in what the server wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.procutil import wait_for
from harness.serverproc import free_port


@dataclass
class S3Endpoint:
    port: int
    secret: str = field(default_factory=lambda: f"secret-{uuid.uuid4().hex}")
    token: str = field(default_factory=lambda: f"token-{uuid.uuid4().hex}")
    key_id: str = "AKIDTESTING0000000000"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What the server gets: Triton's variables, and nothing read from this machine."""
        return {
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_SESSION_TOKEN": self.token,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            aws_session_token=self.token,
            region_name="us-east-1",
        )

    def repository(self, bucket: str, prefix: str = "") -> str:
        """The --model-repository URL of `bucket/prefix` on this endpoint."""
        return f"s3://127.0.0.1:{self.port}/{bucket}" + (f"/{prefix}" if prefix else "")


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/moto-api/", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


@contextmanager
def moto_subprocess(log_dir: Path) -> Iterator[S3Endpoint]:
    endpoint = S3Endpoint(free_port())
    with open(log_dir / f"moto-{endpoint.port}.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(endpoint.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: process.poll() is not None or _answers(endpoint.url), "moto to listen")
        assert process.poll() is None, (log_dir / f"moto-{endpoint.port}.log").read_text()
        yield endpoint
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@contextmanager
def moto_thread() -> Iterator[S3Endpoint]:
    from moto.server import ThreadedMotoServer

    endpoint = S3Endpoint(free_port())
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=endpoint.port, verbose=False)
    server.start()
    try:
        yield endpoint
    finally:
        server.stop()


def upload_tree(client: Any, bucket: str, root: Path, prefix: str = "") -> None:
    """Every file under `root` as an object, keyed by its path below `root`."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(root).as_posix()
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
