"""Request tracing in Triton's trace mode: sampled requests write Triton's trace JSON.

Why here and not in the scheduler: a trace is a record kept beside a request (InferRequest.trace)
that the layers stamp as it passes (the core: REQUEST_START, QUEUE_START, REQUEST_END; the
scheduler: the compute timestamps of the batch it ran in). While no trace level is on anywhere,
a request pays one attribute read; when one is, it pays one sampling decision, and only sampled
requests build anything. Files are written as Triton writes them: with log_frequency 0 all traces
go to `trace_file` at shutdown, otherwise every log_frequency traces go to `trace_file.<n>`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import orjson

from protocol.types import InferRequest, InferResponse, Tensor
from server.observability.runtime_settings import TRACE_LEVELS, TraceSettings

log = logging.getLogger(__name__)

TRACE_CONFIG_KEYS = {  # --trace-config [<mode>,]<setting>=<value> -> a trace setting
    ("", "rate"): "trace_rate",
    ("", "level"): "trace_level",
    ("", "count"): "trace_count",
    ("", "mode"): "trace_mode",
    ("triton", "file"): "trace_file",
    ("triton", "log-frequency"): "log_frequency",
}
TRACE_MODES = ("triton", "opentelemetry")
OTEL_BATCH_KEYS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
TENSOR_TEXT_LIMIT = 1 << 16  # elements of a tensor written at level TENSORS; past it: elided


def parse_trace_config(specs: Iterable[str]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Triton's `--trace-config` values -> (the initial trace settings, the OpenTelemetry
    exporter's settings: `url`, `resource` (a dict), `bsp_*`). ValueError (a startup error) for
    an unknown setting or value."""
    settings: dict[str, list[str]] = {}
    otel: dict[str, Any] = {}
    levels: list[str] = []
    for spec in specs:
        head, _, rest = spec.partition(",")
        mode, pair = (head, rest) if rest and "=" not in head else ("", spec)
        key, eq, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if mode == "opentelemetry" and eq:
            if key == "resource":
                attribute, has_value, text = value.partition("=")
                if not has_value or not attribute:
                    raise ValueError(f"--trace-config: expected resource=<key>=<value> in '{spec}'")
                otel.setdefault("resource", {})[attribute] = text
                continue
            if key == "url" or (key in OTEL_BATCH_KEYS and value.isdigit()):
                otel[key] = value
                continue
        name = TRACE_CONFIG_KEYS.get((mode, key))
        if not eq or name is None:
            raise ValueError(f"--trace-config: unknown setting '{spec}'")
        if name == "trace_level":
            if value not in TRACE_LEVELS:
                raise ValueError(f"--trace-config: invalid level '{value}'")
            levels.append(value)
            continue
        if name == "trace_mode" and value not in TRACE_MODES:
            raise ValueError(
                f"--trace-config: invalid mode '{value}'; expected one of {', '.join(TRACE_MODES)}"
            )
        if name != "trace_file" and name != "trace_mode":
            low = {"trace_count": -1, "trace_rate": 1}.get(name, 0)
            if not value.lstrip("-").isdigit() or int(value) < low:
                raise ValueError(f"--trace-config: invalid value in '{spec}'")
        settings[name] = [value]
    if levels:
        settings["trace_level"] = [lv for lv in dict.fromkeys(levels) if lv != "OFF"] or ["OFF"]
    if settings.get("trace_mode") == ["opentelemetry"] and "TENSORS" in settings.get(
        "trace_level", ()
    ):
        raise ValueError("--trace-config: level TENSORS is not supported in opentelemetry mode")
    return settings, otel


def may_trace(settings: Any) -> bool:
    """Whether any request can ever be traced: a trace file cannot be set over the network, so
    without one at startup (and outside OpenTelemetry mode) none is. Frontends take receive
    timestamps only then."""
    config = settings.trace_config
    return config.get("trace_mode") == ["opentelemetry"] or bool(config.get("trace_file", [""])[0])


class Trace:
    """One sampled request's record: its timestamps and, at level TENSORS, its tensors."""

    __slots__ = (
        "id",
        "model",
        "request_id",
        "tensors",
        "timestamps",
        "stamps",
        "activities",
        "settings",
        "finished",
        "tracer",
        "parent_id",
    )

    def __init__(
        self,
        ident: int,
        request: InferRequest,
        settings: dict[str, list[str]],
        tracer: Tracer | None = None,
        parent_id: int = 0,
    ) -> None:
        self.id = ident
        self.model = request.model_name
        self.request_id = request.id
        self.settings = settings
        self.tensors = "TENSORS" in settings["trace_level"]
        self.timestamps = "TIMESTAMPS" in settings["trace_level"]
        self.finished = False
        self.tracer = tracer  # the tracer that made it
        self.parent_id = parent_id  # an ensemble step's: the ensemble request's trace id
        self.stamps: list[tuple[str, int]] = []
        self.activities: list[tuple[str, Tensor]] = []

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def computed(
        self, start_ns: int, input_ns: int, infer_ns: int, output_ns: int, batch_size: int = 0
    ) -> None:
        """The scheduler's part: when the batch this request ran in started, and its phases."""
        self.stamp("COMPUTE_START", start_ns)
        self.stamp("COMPUTE_INPUT_END", start_ns + input_ns)
        self.stamp("COMPUTE_OUTPUT_START", start_ns + input_ns + infer_ns)
        self.stamp("COMPUTE_END", start_ns + input_ns + infer_ns + output_ns)

    def child(self, request: InferRequest) -> Trace:
        """A record for `request`, a step of this (ensemble) request: always traced."""
        assert self.tracer is not None
        return self.tracer.child(self, request)

    def end(self, response: InferResponse | None) -> None:
        """A step's record is done (the ensemble calls it; the core ends its own)."""
        if not self.finished and self.tracer is not None:
            self.tracer.finish(self, response, response.model_version if response else "")

    def entries(self, version: str) -> list[dict[str, Any]]:
        """Triton's trace JSON objects for this request."""
        head: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model,
            "model_version": int(version) if version.isdigit() else -1,
        }
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        out = [head]
        for name, ns in sorted(self.stamps, key=lambda item: item[1]) if self.timestamps else ():
            out.append({"id": self.id, "timestamps": [{"name": name, "ns": ns}]})
        for activity, tensor in self.activities:
            out.append({"id": self.id, "activity": activity, "tensor": _tensor_json(tensor)})
        return out


def _tensor_json(tensor: Tensor) -> dict[str, str]:
    data = tensor.data.reshape(-1)
    items = data[:TENSOR_TEXT_LIMIT]
    if tensor.datatype == "BYTES":
        text = ",".join(bytes(v).decode("utf-8", "replace") for v in items)
    else:
        text = ",".join(str(v) for v in items.tolist())
    if data.size > TENSOR_TEXT_LIMIT:
        text += ",..."
    return {
        "name": tensor.name,
        "data": text,
        "shape": ",".join(str(d) for d in tensor.shape),
        "dtype": tensor.datatype,
    }


class Tracer:
    """Samples requests by the trace settings and writes the finished traces (Triton mode;
    server/observability/otel.py exports spans instead)."""

    record_type = Trace

    def __init__(self, settings: TraceSettings) -> None:
        self.settings = settings
        self.counters: dict[str, int] = {}
        self.cache: dict[str, dict[str, list[str]]] = {}  # model -> its effective settings
        self.cache_version = -1
        self.next_id = 0
        self.pending: dict[str, list[dict[str, Any]]] = {}  # trace file -> entries to write
        self.written: dict[str, int] = {}  # trace file -> traces collected since last write
        self.files: dict[str, int] = {}  # trace file -> index of its next `.n` file

    def sample(self, request: InferRequest) -> Trace | None:
        """The one sampling decision: every trace_rate-th request of a model, while its
        trace_count lasts and a trace file is set."""
        model = request.model_name
        if self.cache_version != self.settings.version:
            self.cache.clear()
            self.cache_version = self.settings.version
        settings = self.cache.get(model)
        if settings is None:
            settings = self.cache[model] = self.settings.current(model)
        if not self.wants(settings):
            return None
        seen = self.counters.get(model, 0) + 1
        self.counters[model] = seen
        if seen % int(settings["trace_rate"][0]) or not self.settings.take_one(model):
            return None
        return self._begin(request, settings, None)

    def child(self, parent: Trace, request: InferRequest) -> Trace:
        """The record of an ensemble step of a traced request (no sampling: it is traced)."""
        return self._begin(request, parent.settings, parent)

    def _begin(
        self, request: InferRequest, settings: dict[str, list[str]], parent: Trace | None
    ) -> Trace:
        self.next_id += 1
        trace = self.record_type(
            self.next_id, request, settings, self, parent.id if parent is not None else 0
        )
        trace.stamps.extend(request.received)  # the frontend's receive timestamps, if any
        trace.stamp("REQUEST_START")
        if trace.tensors:
            trace.activities += [("TENSOR_QUEUE_INPUT", t) for t in request.inputs]
        trace.stamp("QUEUE_START")
        request.trace = trace
        self.started(trace, parent)
        return trace

    def started(self, trace: Trace, parent: Trace | None) -> None:
        """A hook for the OpenTelemetry tracer, which opens the request's span here."""

    def wants(self, settings: dict[str, list[str]]) -> bool:
        """Whether requests under these settings are traced at all."""
        return settings["trace_level"] != ["OFF"] and bool(settings["trace_file"][0])

    def finish(self, trace: Trace, response: InferResponse | None, version: str) -> None:
        trace.finished = True
        trace.stamp("REQUEST_END")
        if response is not None and trace.tensors:
            trace.activities += [("TENSOR_BACKEND_OUTPUT", t) for t in response.outputs]
        path = trace.settings["trace_file"][0]
        every = int(trace.settings["log_frequency"][0])
        self.pending.setdefault(path, []).extend(trace.entries(version))
        self.written[path] = self.written.get(path, 0) + 1
        if every and self.written[path] >= every:
            self._write_numbered(path)

    def _write_numbered(self, path: str) -> None:
        index = self.files.get(path, 0)
        self.files[path] = index + 1
        self.written[path] = 0
        _write(f"{path}.{index}", self.pending.pop(path, []))

    def flush(self) -> None:
        """At shutdown: what is left goes to `trace_file` (log_frequency 0) or its next
        numbered file."""
        for path in list(self.pending):
            if path in self.files or int(self.settings.current()["log_frequency"][0]):
                if self.pending[path]:
                    self._write_numbered(path)
            else:
                _write(path, self.pending.pop(path))


def _write(path: str, entries: list[dict[str, Any]]) -> None:
    try:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(orjson.dumps(entries))
    except OSError as exc:
        log.error("cannot write trace file %s: %s", path, exc)
