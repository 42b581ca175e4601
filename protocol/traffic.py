"""The traffic policy's wire form (`/v2/models/M/traffic`, `traffic.json`): JSON <-> TrafficSpec.

Only the shape is checked here (known keys, types, ranges); whether the versions it names are
READY is the traffic controller's business (server/traffic/policy.py), since only it sees the
registry. Every error is an InvalidArgument whose text names the offending key and value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import InvalidArgument


@dataclass(frozen=True)
class ShadowSpec:
    """Send `fraction` of the requests that name no version also to `version`."""

    version: str
    fraction: float


@dataclass(frozen=True)
class CanarySpec:
    """A candidate earning its share step by step, or rolled back (server/traffic/canary.py)."""

    baseline: str
    candidate: str
    steps: tuple[int, ...] = (10, 50, 100)
    step_seconds: float = 30.0
    min_requests: int = 50
    max_error_rate: float = 0.05
    max_p99_ms: float | None = 200.0  # None: no latency gate


@dataclass(frozen=True)
class TrafficSpec:
    """A whole policy as PUT (or traffic.json) gives it; a key left out is None."""

    weights: dict[str, int] | None = None
    shadow: ShadowSpec | None = None
    canary: CanarySpec | None = None
    versions: tuple[str, ...] = field(default=(), compare=False)  # every version it names

    @property
    def empty(self) -> bool:
        return self.weights is None and self.shadow is None and self.canary is None


_TOP_KEYS = ("weights", "shadow", "canary")
_SHADOW_KEYS = ("version", "fraction")
_CANARY_KEYS = (
    "baseline",
    "candidate",
    "steps",
    "step_seconds",
    "min_requests",
    "max_error_rate",
    "max_p99_ms",
)
_CANARY_READ_ONLY = ("state", "step", "reason")


def decode_traffic(document: Any) -> TrafficSpec:
    """A PUT body (parsed JSON) -> TrafficSpec, or InvalidArgument naming the problem."""
    if not isinstance(document, dict):
        raise InvalidArgument(
            "traffic policy must be a JSON object with any of 'weights', 'shadow', 'canary'"
        )
    _known(document, _TOP_KEYS, "traffic policy")
    weights = _weights(document.get("weights"))
    shadow = _shadow(document.get("shadow"))
    canary = _canary(document.get("canary"))
    if weights is not None and canary is not None:
        raise InvalidArgument(
            "traffic policy: 'weights' and 'canary' cannot both be set "
            "(a canary sets the weights itself)"
        )
    named = list(weights or ())
    if shadow is not None:
        named.append(shadow.version)
    if canary is not None:
        named += [canary.baseline, canary.candidate]
    return TrafficSpec(weights, shadow, canary, tuple(dict.fromkeys(named)))


def encode_traffic(
    model: str,
    weights: dict[str, int] | None,
    shadow: ShadowSpec | None,
    canary: CanarySpec | None,
    state: str = "",
    step: int = 0,
    reason: str = "",
) -> dict[str, Any]:
    """The GET body: the policy in force, the canary with its state, step and reason."""
    return {
        "model": model,
        "weights": None if weights is None else dict(weights),
        "shadow": None
        if shadow is None
        else {"version": shadow.version, "fraction": shadow.fraction},
        "canary": None
        if canary is None
        else {
            "baseline": canary.baseline,
            "candidate": canary.candidate,
            "steps": list(canary.steps),
            "step_seconds": canary.step_seconds,
            "min_requests": canary.min_requests,
            "max_error_rate": canary.max_error_rate,
            "max_p99_ms": canary.max_p99_ms,
            "state": state,
            "step": step,
            "reason": reason,
        },
    }


# ----- parts ------------------------------------------------------------------------------
def _known(document: dict, keys: tuple[str, ...], where: str) -> None:
    for key in document:
        if key not in keys:
            raise InvalidArgument(
                f"{where}: unknown key '{key}' (expected any of {', '.join(repr(k) for k in keys)})"
            )


def _version(value: Any, where: str) -> str:
    """A version as a string of digits ("2"); a JSON integer is accepted too."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.isdigit():
        return str(int(value))
    raise InvalidArgument(
        f"{where}: expected a model version (a string of digits), got {_show(value)}"
    )


def _weights(value: Any) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise InvalidArgument(
            "traffic policy: 'weights' must be a non-empty JSON object "
            "mapping version strings to non-negative integers"
        )
    weights: dict[str, int] = {}
    for key, weight in value.items():
        version = _version(key, "traffic policy: 'weights'")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise InvalidArgument(
                f"traffic policy: weight of version '{version}' must be a "
                f"non-negative integer, got {_show(weight)}"
            )
        if weight < 0:
            raise InvalidArgument(
                f"traffic policy: weight of version '{version}' is negative ({weight})"
            )
        weights[version] = weight
    if not any(weights.values()):
        raise InvalidArgument(
            "traffic policy: 'weights' are all zero; at least one version needs a positive weight"
        )
    return weights


def _fraction(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or not 0.0 <= value <= 1.0
    ):
        raise InvalidArgument(
            f"traffic policy: shadow 'fraction' must be a number in [0, 1], got {_show(value)}"
        )
    return float(value)


def _shadow(value: Any) -> ShadowSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(
            "traffic policy: 'shadow' must be a JSON object with 'version' and 'fraction'"
        )
    _known(value, _SHADOW_KEYS, "traffic policy: 'shadow'")
    for key in _SHADOW_KEYS:
        if key not in value:
            raise InvalidArgument(f"traffic policy: 'shadow' needs '{key}'")
    return ShadowSpec(
        _version(value["version"], "traffic policy: shadow 'version'"), _fraction(value["fraction"])
    )


def _canary(value: Any) -> CanarySpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument("traffic policy: 'canary' must be a JSON object")
    for key in _CANARY_READ_ONLY:
        if key in value:
            raise InvalidArgument(
                f"traffic policy: canary '{key}' is reported by the server and cannot be set"
            )
    _known(value, _CANARY_KEYS, "traffic policy: 'canary'")
    for key in ("baseline", "candidate"):
        if key not in value:
            raise InvalidArgument(f"traffic policy: 'canary' needs '{key}'")
    baseline = _version(value["baseline"], "traffic policy: canary 'baseline'")
    candidate = _version(value["candidate"], "traffic policy: canary 'candidate'")
    if baseline == candidate:
        raise InvalidArgument(
            f"traffic policy: canary 'baseline' and 'candidate' are both version '{baseline}'"
        )
    defaults = CanarySpec(baseline, candidate)
    return CanarySpec(
        baseline,
        candidate,
        steps=_steps(value.get("steps", list(defaults.steps))),
        step_seconds=_positive(value.get("step_seconds", defaults.step_seconds), "step_seconds"),
        min_requests=_min_requests(value.get("min_requests", defaults.min_requests)),
        max_error_rate=_error_rate(value.get("max_error_rate", defaults.max_error_rate)),
        max_p99_ms=None
        if value.get("max_p99_ms", defaults.max_p99_ms) is None
        else _positive(value.get("max_p99_ms", defaults.max_p99_ms), "max_p99_ms"),
    )


def _steps(value: Any) -> tuple[int, ...]:
    problem = (
        "traffic policy: canary 'steps' must be a list of increasing integer "
        "percentages in 1..100 ending with 100"
    )
    if not isinstance(value, list) or not value:
        raise InvalidArgument(f"{problem}, got {_show(value)}")
    for step in value:
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= 100:
            raise InvalidArgument(f"{problem}, got {_show(value)}")
    if any(b <= a for a, b in zip(value, value[1:], strict=False)) or value[-1] != 100:
        raise InvalidArgument(f"{problem}, got {_show(value)}")
    return tuple(value)


def _number(value: Any) -> float | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or math.isinf(value)
    ):
        return None
    return float(value)


def _positive(value: Any, key: str) -> float:
    number = _number(value)
    if number is None or number <= 0:
        raise InvalidArgument(
            f"traffic policy: canary '{key}' must be a positive number, got {_show(value)}"
        )
    return number


def _min_requests(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(
            f"traffic policy: canary 'min_requests' must be an integer >= 1, got {_show(value)}"
        )
    return value


def _error_rate(value: Any) -> float:
    number = _number(value)
    if number is None or not 0.0 <= number <= 1.0:
        raise InvalidArgument(
            f"traffic policy: canary 'max_error_rate' must be a number in "
            f"[0, 1], got {_show(value)}"
        )
    return number


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 60 else text[:57] + "..."
