"""server/restricted.py: every path alias and RPC has its category; specifications parse as
Triton's flags do."""

from __future__ import annotations

import pytest

from server.restricted import (
    GRPC_HEADER_PREFIX,
    HttpGuard,
    Restriction,
    grpc_category,
    http_category,
    parse_restrictions,
)


@pytest.mark.parametrize(
    "path, category",
    [
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/2/ready", "health"),
        ("/v2", "metadata"),
        ("/v2/", "metadata"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/3", "metadata"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/1/infer", "inference"),
        ("/v2/models/m/generate", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/m/versions/1/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/models/m/versions/1/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/repository/r/index", "model-repository"),
        ("/v2/repository/r/models/m/unload", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/cudasharedmemory/region/x/register", "shared-memory"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/metrics", None),
        ("/v2/nope/x", None),
        ("/v2/models/m/traffic", "model-repository"),
    ],
)
def test_http_categories(path: str, category: str) -> None:
    assert http_category(path) == category


def test_grpc_categories() -> None:
    assert grpc_category("/inference.GRPCInferenceService/ModelInfer") == "inference"
    assert grpc_category("/inference.GRPCInferenceService/ModelStreamInfer") == "inference"
    assert (
        grpc_category("/inference.GRPCInferenceService/RepositoryModelLoad") == "model-repository"
    )
    assert grpc_category("/inference.GRPCInferenceService/LogSettings") == "logging"
    assert grpc_category("/grpc.health.v1.Health/Check") == "health"
    assert grpc_category("/ascend.traffic.v1.TrafficService/SetTraffic") == "model-repository"
    assert grpc_category("/other.Service/ModelInfer") is None


def test_parse_and_guard() -> None:
    parsed = parse_restrictions(["health, inference:My-Key=v=1"], "--x", GRPC_HEADER_PREFIX)
    assert parsed["inference"] == Restriction("triton-grpc-protocol-my-key", "v=1")
    guard = HttpGuard(parse_restrictions(["logging:k=v"], "--x"))
    assert guard.refusal("/v2/logging", [(b"K", b"v")]) is None
    assert (
        guard.refusal("/v2/logging", [(b"k", b"w")])
        == "This API is restricted, expecting header 'k'"
    )
    assert guard.refusal("/v2/health/live", []) is None
