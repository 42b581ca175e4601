"""Gray release: each model's traffic policy (weighted split, sticky keys, canary, shadow).

The one infer path (server/core/inference_path.py) looks a model up in `policies` (one dict lookup)
and only when a policy is set hands the request here, where its version is picked: a version the
request names always wins; else a `traffic_key` parameter picks by hash, no key picks at random, by
the weights in force. The canary's gate runs as a periodic task on the event loop while a canary is
running; shadows go through server/traffic/shadow.py.

The controller also hears the repository manager's version events (`TrafficHooks`): a version
that stops serving drops out of the policy (weights, shadow, canary), a model with no serving
version loses its policy, and a model that starts serving picks up `traffic.json` from its
directory when no policy is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily

from protocol.errors import InvalidArgument, ServerError
from protocol.traffic import ShadowSpec, TrafficSpec, decode_traffic, encode_traffic
from protocol.types import InferRequest
from repository.registry import ModelRecord, ModelRegistry, ModelState, VersionRecord
from server.traffic.canary import DEFAULT_WINDOW, ROLLED_BACK, STEP, Canary
from server.traffic.shadow import DEFAULT_MAX_INFLIGHT, ShadowSender
from server.traffic.split import WeightTable

log = logging.getLogger("ascend_serve.traffic")

SPLIT, STICKY, NAMED = "split", "sticky", "named"
KEY_PARAMETER = "traffic_key"


@dataclass(frozen=True)
class TrafficSettings:
    gate_interval_s: float = 0.25  # how often a running canary is evaluated (rollback <= 1 s)
    shadow_max_inflight: int = DEFAULT_MAX_INFLIGHT
    canary_window: int = DEFAULT_WINDOW  # candidate latencies kept per step for the p99
    file_name: str = "traffic.json"  # a policy beside config.pbtxt, applied when the model loads


class Policy:
    """A model's policy in force: the weights (the canary's when one runs) as a table."""

    __slots__ = ("weights", "table", "shadow", "canary")

    def __init__(self, spec: TrafficSpec, canary: Canary | None) -> None:
        self.shadow: ShadowSpec | None = spec.shadow
        self.canary = canary
        self.weights: dict[str, int] | None = None
        self.table: WeightTable | None = None
        self.set_weights(canary.weights() if canary is not None else spec.weights)

    def set_weights(self, weights: dict[str, int] | None) -> None:
        self.weights = weights
        if not weights:
            self.weights = self.table = None
            return
        # A canary keeps the candidate last, so a key's place moves only towards it.
        order = list(weights) if self.canary is not None else sorted(weights, key=int)
        self.table = WeightTable((int(v), weights[v]) for v in order)

    @property
    def empty(self) -> bool:
        return self.weights is None and self.shadow is None and self.canary is None

    def view(self, model: str) -> dict[str, Any]:
        canary = self.canary
        if canary is None:
            return encode_traffic(model, self.weights, self.shadow, None)
        return encode_traffic(
            model, self.weights, self.shadow, canary.spec, canary.state, canary.step, canary.reason
        )


class TrafficControl:
    def __init__(
        self,
        registry: ModelRegistry,
        settings: TrafficSettings = TrafficSettings(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.policies: dict[str, Policy] = {}
        self.counts: dict[tuple[str, int, str], int] = {}  # (model, version, route)
        self.transitions: dict[tuple[str, str], int] = {}  # (model, to)
        self.shadow = ShadowSender(registry, self.count, settings.shadow_max_inflight)
        self._gate: asyncio.Task | None = None
        self._closed = False
        self._pending: set[str] = set()  # models with a version event to settle
        self._file_seen: set[str] = set()  # traffic.json looked at since the model came up

    # ----- the API (GET / PUT / DELETE /v2/models/M/traffic) -------------------------------
    def status(self, name: str) -> dict[str, Any]:
        self.registry.get(name)  # NOT_FOUND for an unknown model
        policy = self.policies.get(name)
        return policy.view(name) if policy is not None else encode_traffic(name, None, None, None)

    def replace(self, name: str, spec: TrafficSpec) -> dict[str, Any]:
        """Put `spec` in force for `name` (the whole policy; nothing merges). The policy in
        force is unchanged when anything is wrong."""
        model = self.registry.get(name)
        for version in spec.versions:
            record = model.versions.get(int(version))
            if record is None or not record.serving:
                state = "unknown" if record is None else record.state.value
                raise InvalidArgument(
                    f"traffic policy for model '{name}': version '{version}' is not READY ({state})"
                )
        if spec.empty:
            self.policies.pop(name, None)
        else:
            canary = (
                None
                if spec.canary is None
                else Canary(spec.canary, self.clock(), self.settings.canary_window)
            )
            self.policies[name] = Policy(spec, canary)
            if canary is not None:
                self._start_gate()
        return self.status(name)

    def delete(self, name: str) -> dict[str, Any]:
        self.registry.get(name)
        self.policies.pop(name, None)
        return self.status(name)

    # ----- routing (from server/core/inference_path.py, only for models with a policy) ---------
    def count(self, name: str, version: int, route: str) -> None:
        key = (name, version, route)
        self.counts[key] = self.counts.get(key, 0) + 1

    def resolve(
        self, policy: Policy, name: str, version: str, key: str | None = None, count: bool = True
    ) -> VersionRecord:
        """The version a request goes to under `policy`, counted by route (unless `count` is
        false: a raw body's version resolved for its decoding, counted when inferred)."""
        if version and version != "-1":
            named = self.registry.resolve(name, version)
            if count:
                self.count(name, named.version, NAMED)
            return named
        table = policy.table
        if table is None:
            return self.registry.resolve(name, "")
        number = table.pick(key)
        model = self.registry.models.get(name)
        record = model.versions.get(number) if model is not None else None
        if record is None or not record.serving:  # unloading: its weight drops out
            serving = set(model.ready_versions()) if model is not None else set()
            rest = table.only(serving)
            if not rest:
                return self.registry.resolve(name, "")
            record = model.versions[rest.pick(key)]  # type: ignore[union-attr]  # rest: model is set
        if count:
            self.count(name, record.version, SPLIT if key is None else STICKY)
        return record

    def route(
        self, policy: Policy, request: InferRequest, record: VersionRecord | None
    ) -> VersionRecord:
        """The version `request` goes to, counted; `record` when the frontend already
        resolved it (uncounted, to decode a raw body, which has no key: a split)."""
        version = request.model_version
        if record is None:
            key = request.parameters.get(KEY_PARAMETER) if request.parameters else None
            return self.resolve(
                policy, request.model_name, version, None if key is None else str(key)
            )
        named = bool(version) and version != "-1"
        if named or policy.table is not None:
            self.count(request.model_name, record.version, NAMED if named else SPLIT)
        return record

    def answered(
        self,
        policy: Policy,
        request: InferRequest,
        record: VersionRecord,
        started_ns: int,
        ok: bool,
    ) -> None:
        """A routed request's answer is in (`ok`: not an error): the canary counts the
        candidate's answers, and a successful request that named no version may be shadowed
        (the copy starts on the next loop turn, after the caller has the answer)."""
        canary = policy.canary
        if canary is not None and canary.running and record.version == canary.candidate:
            canary.record((time.perf_counter_ns() - started_ns) / 1e6, ok)
        shadow = policy.shadow
        if ok and shadow is not None and request.model_version in ("", "-1"):
            self.shadow.maybe_send(request.model_name, shadow, request)

    # ----- the canary gate -----------------------------------------------------------------
    def _start_gate(self) -> None:
        if not self._closed and (self._gate is None or self._gate.done()):
            with contextlib.suppress(RuntimeError):  # no running loop: tests call tick()
                self._gate = asyncio.get_running_loop().create_task(self._run_gate())

    async def _run_gate(self) -> None:
        """Runs while a canary runs (a PUT with a canary starts it again)."""
        while any(p.canary is not None and p.canary.running for p in self.policies.values()):
            await asyncio.sleep(self.settings.gate_interval_s)
            try:
                self.tick()
            except Exception:
                log.exception("canary gate")

    def tick(self) -> None:
        """Evaluate every running canary once (the gate's period; tests call it directly)."""
        now = self.clock()
        for name, policy in list(self.policies.items()):
            canary = policy.canary
            if canary is not None and canary.running:
                transition = canary.evaluate(now)
                if transition is not None:
                    self._transitioned(name, policy, transition)

    def _transitioned(self, name: str, policy: Policy, to: str) -> None:
        canary = policy.canary
        assert canary is not None
        key = (name, to)
        self.transitions[key] = self.transitions.get(key, 0) + 1
        policy.set_weights(canary.weights())
        spec = canary.spec
        if to == STEP:
            log.info(
                "model '%s': canary step %d: candidate version %s now gets %d%%",
                name,
                canary.step,
                spec.candidate,
                spec.steps[canary.step],
            )
        elif to == ROLLED_BACK:
            log.warning(
                "model '%s': canary rolled back: all traffic back on version %s: %s",
                name,
                spec.baseline,
                canary.reason,
            )
        else:
            log.warning(
                "model '%s': canary promoted: version %s now takes all traffic (%s)",
                name,
                spec.candidate,
                canary.reason,
            )

    async def stop(self) -> None:
        """Cancel the gate (server shutdown); it does not start again."""
        self._closed = True
        gate, self._gate = self._gate, None
        if gate is not None and not gate.done():
            gate.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gate

    # ----- version events ------------------------------------------------------------------
    def versions_changed(self, name: str) -> None:
        """A version of `name` started or stopped serving: settle the policy on the next loop
        turn (the manager publishes the version right after telling its hooks)."""
        if name in self._pending:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon(self.settle, name)
            self._pending.add(name)

    def settle(self, name: str) -> None:
        self._pending.discard(name)
        model = self.registry.models.get(name)
        serving = set(model.ready_versions()) if model is not None else set()
        if not serving:
            self._file_seen.discard(name)
            if self.policies.pop(name, None) is not None:
                log.warning(
                    "model '%s' has no serving version: its traffic policy is dropped", name
                )
            return
        policy = self.policies.get(name)
        if policy is not None:
            self._prune(name, policy, serving)
        elif name not in self._file_seen and model is not None:
            self._apply_file(name, model)

    def _prune(self, name: str, policy: Policy, serving: set[int]) -> None:
        canary = policy.canary
        if canary is not None and canary.running:
            gone = [v for v in (canary.baseline, canary.candidate) if v not in serving]
            if gone:
                canary.roll_back(f"version {gone[0]} stopped serving (unloaded or failed)")
                self._transitioned(name, policy, ROLLED_BACK)
        if policy.weights is not None:
            kept = {v: w for v, w in policy.weights.items() if int(v) in serving}
            if kept != policy.weights:
                log.warning(
                    "model '%s': traffic weights of version(s) %s dropped: no longer serving",
                    name,
                    ", ".join(sorted(set(policy.weights) - set(kept))),
                )
                policy.set_weights(kept if any(kept.values()) else None)
        if policy.shadow is not None and int(policy.shadow.version) not in serving:
            log.warning(
                "model '%s': shadow to version %s dropped: no longer serving",
                name,
                policy.shadow.version,
            )
            policy.shadow = None
        if policy.empty:
            self.policies.pop(name, None)

    def _apply_file(self, name: str, model: ModelRecord) -> None:
        """traffic.json beside config.pbtxt, once the versions it names serve."""
        path = model.path / self.settings.file_name if model.path is not None else None
        if path is None or not path.is_file():
            self._file_seen.add(name)
            return
        try:
            spec = decode_traffic(orjson.loads(path.read_bytes()))
            if _waiting_for(model, spec):
                return  # a version it names is still loading: try again when one is up
            self.replace(name, spec)
        except (OSError, orjson.JSONDecodeError, ServerError) as exc:
            self._file_seen.add(name)
            log.error(
                "model '%s': %s ignored: %s", name, path, getattr(exc, "message", None) or exc
            )
            return
        self._file_seen.add(name)
        log.info("model '%s': traffic policy from %s in force", name, path)

    # ----- metrics ---------------------------------------------------------------------------
    def collect(self) -> Iterable[CounterMetricFamily]:
        """ascend_traffic_requests_total, ascend_canary_transitions_total,
        ascend_shadow_errors_total (the metrics port renders these after Triton's)."""
        requests = CounterMetricFamily(
            "ascend_traffic_requests",
            "Inference requests by how their version was chosen",
            labels=["model", "version", "route"],
        )
        for (model, version, route), value in list(self.counts.items()):
            requests.add_metric([model, str(version), route], value)
        transitions = CounterMetricFamily(
            "ascend_canary_transitions",
            "Canary steps, promotions and rollbacks",
            labels=["model", "to"],
        )
        for (model, to), value in list(self.transitions.items()):
            transitions.add_metric([model, to], value)
        errors = CounterMetricFamily(
            "ascend_shadow_errors",
            "Shadow requests that failed or were dropped",
            labels=["model", "version"],
        )
        for (model, version), value in list(self.shadow.errors.items()):
            errors.add_metric([model, str(version)], value)
        return [requests, transitions, errors]


def _waiting_for(model: ModelRecord, spec: TrafficSpec) -> bool:
    """Whether a version the policy names is not serving yet but still loading."""
    for version in spec.versions:
        record = model.versions.get(int(version))
        if record is not None and record.state is ModelState.LOADING:
            return True
    return False


class TrafficHooks:
    """The manager's version hooks: the metrics' first (they bind the series), then traffic."""

    def __init__(self, metrics: Any, traffic: TrafficControl) -> None:
        self.metrics = metrics
        self.traffic = traffic

    def version_loaded(self, name: str, version: int, load_seconds: float) -> Any:
        observer = self.metrics.version_loaded(name, version, load_seconds)
        self.traffic.versions_changed(name)
        return observer

    def version_unloaded(self, name: str, version: int) -> None:
        self.metrics.version_unloaded(name, version)
        self.traffic.versions_changed(name)
