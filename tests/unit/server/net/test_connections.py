"""server/net/connections.py and the connection settings: defaults, flags, gRPC server options.
(The behaviour on the wire is in tests/e2e/http/test_connection_limits.py.)"""

from __future__ import annotations

import logging

import pytest

from server.cli import settings_from_args
from server.grpc.listener import server_options
from server.http.fast_path import BoundedHttpProtocol, protocol_class
from server.net import connections
from server.net.connections import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
    RateLimitedLog,
    resolve_max_connections,
)
from server.settings import DEFAULT_MAX_INPUT_SIZE, GRPC_MAX_MESSAGE, ServerSettings


def test_default_connection_limit_fits_the_descriptor_limit() -> None:
    assert resolve_max_connections(None, 16, 1_048_576) == DEFAULT_MAX_CONNECTIONS
    limit = resolve_max_connections(None, 16, 4096)
    assert 1000 <= limit < 4096 - 16 - connections.MIN_DESCRIPTOR_MARGIN + 1
    assert resolve_max_connections(None, 16, None) == DEFAULT_MAX_CONNECTIONS


def test_default_limits_share_the_descriptors_between_listeners() -> None:
    assert resolve_max_connections(None, 16, 1_048_576, share=2) == DEFAULT_MAX_CONNECTIONS
    limit = resolve_max_connections(None, 16, 8192, share=2)
    assert 2 * (limit + 16) + connections.descriptor_margin(8192) <= 8192


def test_explicit_connection_limit_is_kept_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_max_connections(5000, 16, 1024) == 5000
    assert "ulimit -n" in caplog.text


def test_rate_limited_log_says_once_then_counts(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(connections.time, "monotonic", lambda: now[0])
    limited = RateLimitedLog(logging.getLogger("test.rate"), interval=5.0)
    with caplog.at_level(logging.WARNING):
        for _ in range(10):
            limited.warning("refused %s", "x")
        now[0] += 5.0
        limited.warning("refused %s", "y")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["refused x", "refused y (and 9 more like it since the last report)"]


def test_flags_and_defaults() -> None:
    defaults = settings_from_args(["--model-repository", "/tmp"])
    assert (
        defaults.http_header_timeout_secs,
        defaults.http_idle_timeout_secs,
        defaults.http_keep_alive_timeout_secs,
    ) == (30.0, 60.0, 60.0)
    assert defaults.http_max_connections is None
    assert defaults.http_health_reserved_connections == 16
    assert defaults.grpc_max_input_size is None
    given = settings_from_args(
        [
            "--model-repository",
            "/tmp",
            "--http-header-timeout-secs",
            "5",
            "--http-idle-timeout-secs",
            "7",
            "--http-keep-alive-timeout-secs",
            "9",
            "--http-max-connections",
            "100",
            "--http-health-reserved-connections",
            "0",
            "--grpc-max-input-size",
            "1024",
            "--grpc-keepalive-time",
            "1000",
            "--grpc-max-connection-idle",
            "2000",
            "--grpc-max-concurrent-streams",
            "8",
            "--grpc-handshake-timeout",
            "3000",
            "--grpc-keepalive-permit-without-calls",
        ]
    )
    assert (
        given.http_header_timeout_secs,
        given.http_idle_timeout_secs,
        given.http_keep_alive_timeout_secs,
    ) == (5.0, 7.0, 9.0)
    assert (given.http_max_connections, given.http_health_reserved_connections) == (100, 0)
    assert given.grpc_max_input_size == 1024 and given.grpc_keepalive_time_ms == 1000
    assert given.grpc_max_connection_idle_ms == 2000 and given.grpc_max_concurrent_streams == 8
    assert given.grpc_handshake_timeout_ms == 3000
    assert given.grpc_keepalive_permit_without_calls is True
    for bad in (["--http-max-connections", "0"], ["--http-idle-timeout-secs", "-1"]):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", *bad])


def test_grpc_options_bound_requests_and_connections() -> None:
    options = dict(server_options(ServerSettings()))
    # Requests (compressed or not) stop at the HTTP input limit; responses keep Triton's 2 GiB.
    assert options["grpc.max_receive_message_length"] == DEFAULT_MAX_INPUT_SIZE
    assert options["grpc.max_send_message_length"] == GRPC_MAX_MESSAGE
    assert options["grpc.keepalive_time_ms"] == 7_200_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.http2.max_pings_without_data"] == 2
    assert options["grpc.max_connection_idle_ms"] == 60_000
    assert options["grpc.max_concurrent_streams"] == 1000
    assert options["grpc.server_handshake_timeout_ms"] == 30_000
    assert 1 <= options["grpc.max_allowed_incoming_connections"] <= DEFAULT_MAX_CONNECTIONS
    assert (
        dict(server_options(ServerSettings(grpc_max_connections=7)))[
            "grpc.max_allowed_incoming_connections"
        ]
        == 7
    )
    small = dict(server_options(ServerSettings(grpc_max_message_size=1024)))
    assert small["grpc.max_receive_message_length"] == 1024  # never above the message limit
    given = dict(server_options(ServerSettings(grpc_max_input_size=5 * 2**20)))
    assert given["grpc.max_receive_message_length"] == 5 * 2**20


def test_protocol_class_binds_the_limits() -> None:
    limits = ConnectionLimits(
        max_connections=3, health_reserve=1, idle_timeout=2.0, header_timeout=1.0
    )
    bound = protocol_class(object(), limits)
    assert issubclass(bound, BoundedHttpProtocol) and bound.limits is limits
    assert protocol_class(object()).limits == ConnectionLimits()


def test_body_flags_and_defaults() -> None:
    from server.net.listeners import http_limits

    defaults = settings_from_args(["--model-repository", "/tmp"])
    assert defaults.http_body_timeout_secs == 60.0
    assert defaults.http_max_inflight_body_size is None  # 1 GiB, at least 2 x the body limit
    assert http_limits(defaults).body_timeout == 60.0
    given = settings_from_args(
        [
            "--model-repository",
            "/tmp",
            "--http-body-timeout-secs",
            "2.5",
            "--http-max-input-size",
            "1000",
            "--http-max-inflight-body-size",
            "1000",
        ]
    )
    assert given.http_body_timeout_secs == 2.5 and given.http_max_inflight_body_size == 1000
    assert http_limits(given).body_timeout == 2.5
    for bad in (
        ["--http-body-timeout-secs", "0"],
        ["--http-max-inflight-body-size", "0"],
        # a budget below one body's limit would refuse valid bodies as if the server were busy
        ["--http-max-input-size", "1000", "--http-max-inflight-body-size", "999"],
    ):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", *bad])
