"""The bounds of one ModelStreamInfer call and of calls per connection, from the command line
to what the gRPC frontend is built with (the behaviour: tests/e2e/grpc/test_stream_flow.py)."""

from __future__ import annotations

import pytest

from server.cli import settings_from_args
from server.grpc.listener import server_options
from server.grpc.services import StreamLimits
from server.settings import ServerSettings


def test_stream_limits_defaults() -> None:
    limits = StreamLimits.of(settings_from_args(["--model-repository", "/tmp"]))
    assert limits == StreamLimits(16 * 1024 * 1024, 60.0)


def test_stream_limits_flags() -> None:
    given = settings_from_args(
        [
            "--model-repository",
            "/tmp",
            "--grpc-max-stream-pending-size",
            "1000",
            "--grpc-stream-first-request-timeout",
            "2500",
        ]
    )
    assert StreamLimits.of(given) == StreamLimits(1000, 2.5)
    no_timeout = ["--grpc-stream-first-request-timeout", "0"]
    assert StreamLimits.of(settings_from_args(["--model-repository", "/tmp", *no_timeout])) == (
        StreamLimits(16 * 1024 * 1024, None)
    )
    for bad in (
        ["--grpc-max-stream-pending-size", "0"],
        ["--grpc-stream-first-request-timeout", "-1"],
    ):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", *bad])


def test_concurrent_streams_limit_counts_open_streams() -> None:
    """grpc-core's overload protection would refuse calls the client queued (item 7)."""
    options = dict(server_options(ServerSettings()))
    assert options["grpc.max_concurrent_streams"] == 1000
    assert options["grpc.http.overload_protection"] == 0
