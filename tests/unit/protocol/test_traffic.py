"""protocol/traffic.py: the traffic policy's wire form, and its error texts."""

from __future__ import annotations

import pytest

from protocol.errors import InvalidArgument
from protocol.traffic import CanarySpec, ShadowSpec, TrafficSpec, decode_traffic, encode_traffic


def test_a_full_policy_decodes_and_names_its_versions() -> None:
    spec = decode_traffic(
        {"weights": {"1": 90, "2": 10}, "shadow": {"version": "3", "fraction": 0.25}}
    )
    assert spec == TrafficSpec({"1": 90, "2": 10}, ShadowSpec("3", 0.25), None)
    assert spec.versions == ("1", "2", "3")
    assert decode_traffic({}).empty and decode_traffic({"weights": None}).empty


def test_canary_defaults_and_given_values() -> None:
    spec = decode_traffic({"canary": {"baseline": "1", "candidate": 2}})
    assert spec.canary == CanarySpec("1", "2")
    spec = decode_traffic(
        {
            "canary": {
                "baseline": "1",
                "candidate": "2",
                "steps": [50, 100],
                "step_seconds": 0.5,
                "min_requests": 5,
                "max_error_rate": 0,
                "max_p99_ms": None,
            }
        }
    )
    assert spec.canary == CanarySpec("1", "2", (50, 100), 0.5, 5, 0.0, None)


@pytest.mark.parametrize(
    "document, message",
    [
        ([], "traffic policy must be a JSON object"),
        ({"foo": 1}, "traffic policy: unknown key 'foo'"),
        ({"weights": {"1": -1}}, "traffic policy: weight of version '1' is negative (-1)"),
        ({"weights": {"1": 0, "2": 0}}, "traffic policy: 'weights' are all zero"),
        ({"weights": {"1": 1.5}}, "weight of version '1' must be a non-negative integer, got 1.5"),
        ({"weights": {"1": True}}, "weight of version '1' must be a non-negative integer"),
        ({"weights": {"v1": 1}}, "expected a model version (a string of digits), got 'v1'"),
        ({"weights": {}}, "'weights' must be a non-empty JSON object"),
        (
            {"shadow": {"version": "3", "fraction": 1.5}},
            "shadow 'fraction' must be a number in [0, 1], got 1.5",
        ),
        ({"shadow": {"version": "3", "fraction": -0.1}}, "got -0.1"),
        ({"shadow": {"version": "3"}}, "'shadow' needs 'fraction'"),
        ({"shadow": {"version": "3", "fraction": 0.1, "x": 1}}, "'shadow': unknown key 'x'"),
        (
            {"canary": {"baseline": "1", "candidate": "2", "state": "running"}},
            "canary 'state' is reported by the server and cannot be set",
        ),
        ({"canary": {"baseline": "1"}}, "'canary' needs 'candidate'"),
        ({"canary": {"baseline": "1", "candidate": "1"}}, "are both version '1'"),
        (
            {"canary": {"baseline": "1", "candidate": "2", "steps": [50, 10, 100]}},
            "canary 'steps' must be a list of increasing integer percentages",
        ),
        ({"canary": {"baseline": "1", "candidate": "2", "steps": [10, 50]}}, "ending with 100"),
        (
            {"canary": {"baseline": "1", "candidate": "2", "step_seconds": 0}},
            "canary 'step_seconds' must be a positive number, got 0",
        ),
        (
            {"canary": {"baseline": "1", "candidate": "2", "min_requests": 0}},
            "canary 'min_requests' must be an integer >= 1, got 0",
        ),
        (
            {"canary": {"baseline": "1", "candidate": "2", "max_error_rate": 2}},
            "canary 'max_error_rate' must be a number in [0, 1], got 2",
        ),
        (
            {"canary": {"baseline": "1", "candidate": "2", "bogus": 2}},
            "'canary': unknown key 'bogus'",
        ),
        (
            {"weights": {"1": 1}, "canary": {"baseline": "1", "candidate": "2"}},
            "'weights' and 'canary' cannot both be set",
        ),
    ],
)
def test_bad_policies_are_refused_naming_the_problem(document: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_traffic(document)
    assert message in caught.value.message


def test_the_get_body_has_the_issue_shape() -> None:
    canary = CanarySpec("1", "2", (10, 50, 100), 30, 50, 0.05, 200.0)
    body = encode_traffic("M", {"1": 90, "2": 10}, ShadowSpec("3", 0.25), canary, "running", 0, "")
    assert body == {
        "model": "M",
        "weights": {"1": 90, "2": 10},
        "shadow": {"version": "3", "fraction": 0.25},
        "canary": {
            "baseline": "1",
            "candidate": "2",
            "steps": [10, 50, 100],
            "step_seconds": 30,
            "min_requests": 50,
            "max_error_rate": 0.05,
            "max_p99_ms": 200.0,
            "state": "running",
            "step": 0,
            "reason": "",
        },
    }
    assert encode_traffic("M", None, None, None) == {
        "model": "M",
        "weights": None,
        "shadow": None,
        "canary": None,
    }
