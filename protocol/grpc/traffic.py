"""The traffic policy's gRPC form (traffic_service.proto) <-> the JSON document of the HTTP API.

A SetTraffic message becomes the same document a PUT body is, so protocol/traffic.py checks
both with the same error texts; the GET document becomes a TrafficPolicy message.
"""

from __future__ import annotations

from typing import Any

from protocol.proto import traffic_service_pb2 as pb


def policy_document(message: pb.TrafficPolicy) -> dict[str, Any]:
    """A SetTraffic policy as the PUT body it stands for (an unset part is left out)."""
    document: dict[str, Any] = {}
    if message.weights:
        document["weights"] = dict(message.weights)
    if message.HasField("shadow"):
        document["shadow"] = {
            "version": message.shadow.version,
            "fraction": message.shadow.fraction,
        }
    if message.HasField("canary"):
        document["canary"] = _canary_document(message.canary)
    return document


def _canary_document(canary: pb.Canary) -> dict[str, Any]:
    document: dict[str, Any] = {"baseline": canary.baseline, "candidate": canary.candidate}
    if canary.steps:
        document["steps"] = list(canary.steps)
    for key in ("step_seconds", "min_requests", "max_error_rate", "max_p99_ms"):
        if canary.HasField(key):
            document[key] = getattr(canary, key)
    if canary.no_latency_gate:
        document["max_p99_ms"] = None
    # Reported by the server: sent back, they are refused as over HTTP.
    if canary.state:
        document["state"] = canary.state
    if canary.step:
        document["step"] = canary.step
    if canary.reason:
        document["reason"] = canary.reason
    return document


def encode_policy(body: dict[str, Any]) -> pb.TrafficPolicy:
    """The GET document (protocol/traffic_json.encode_traffic) as a TrafficPolicy."""
    message = pb.TrafficPolicy(model=body["model"], weights=body["weights"] or {})
    shadow = body["shadow"]
    if shadow is not None:
        message.shadow.CopyFrom(pb.Shadow(version=shadow["version"], fraction=shadow["fraction"]))
    canary = body["canary"]
    if canary is not None:
        p99 = canary["max_p99_ms"]
        message.canary.CopyFrom(
            pb.Canary(
                baseline=canary["baseline"],
                candidate=canary["candidate"],
                steps=canary["steps"],
                step_seconds=canary["step_seconds"],
                min_requests=canary["min_requests"],
                max_error_rate=canary["max_error_rate"],
                max_p99_ms=p99,
                no_latency_gate=p99 is None,
                state=canary["state"],
                step=canary["step"],
                reason=canary["reason"],
            )
        )
    return message
