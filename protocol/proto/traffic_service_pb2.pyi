from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrafficRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class Shadow(_message.Message):
    __slots__ = ("version", "fraction")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    version: str
    fraction: float
    def __init__(self, version: _Optional[str] = ..., fraction: _Optional[float] = ...) -> None: ...

class Canary(_message.Message):
    __slots__ = ("baseline", "candidate", "steps", "step_seconds", "min_requests", "max_error_rate", "max_p99_ms", "no_latency_gate", "state", "step", "reason")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_P99_MS_FIELD_NUMBER: _ClassVar[int]
    NO_LATENCY_GATE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    baseline: str
    candidate: str
    steps: _containers.RepeatedScalarFieldContainer[int]
    step_seconds: float
    min_requests: int
    max_error_rate: float
    max_p99_ms: float
    no_latency_gate: bool
    state: str
    step: int
    reason: str
    def __init__(self, baseline: _Optional[str] = ..., candidate: _Optional[str] = ..., steps: _Optional[_Iterable[int]] = ..., step_seconds: _Optional[float] = ..., min_requests: _Optional[int] = ..., max_error_rate: _Optional[float] = ..., max_p99_ms: _Optional[float] = ..., no_latency_gate: _Optional[bool] = ..., state: _Optional[str] = ..., step: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TrafficPolicy(_message.Message):
    __slots__ = ("model", "weights", "shadow", "canary")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    model: str
    weights: _containers.ScalarMap[str, int]
    shadow: Shadow
    canary: Canary
    def __init__(self, model: _Optional[str] = ..., weights: _Optional[_Mapping[str, int]] = ..., shadow: _Optional[_Union[Shadow, _Mapping]] = ..., canary: _Optional[_Union[Canary, _Mapping]] = ...) -> None: ...

class SetTrafficRequest(_message.Message):
    __slots__ = ("model", "policy")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    model: str
    policy: TrafficPolicy
    def __init__(self, model: _Optional[str] = ..., policy: _Optional[_Union[TrafficPolicy, _Mapping]] = ...) -> None: ...
