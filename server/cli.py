"""Command line with Triton's flag names and defaults: `ascend-serve --model-repository DIR`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from protocol.text import set_echo_limit
from repository.s3_location import S3Location, is_url, parse_repository_url
from repository.s3_mirror import MirrorLimits
from scheduler.rate_limiter import parse_resource_flag
from server.cpu_scheduling import POLICIES, apply_switch_interval, apply_thread_scheduling
from server.net.loop import new_event_loop
from server.observability import log_escaping
from server.settings import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_INPUT_SIZE,
    DEFAULT_QUANTILES,
    GIL_SWITCH_INTERVAL_US,
    GRPC_MAX_MESSAGE,
    GRPC_MESSAGE_TIMEOUT_MS,
    GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS,
    GRPC_STREAM_PENDING_SIZE,
    SERVER_NAME,
    THREAD_SCHEDULING,
    ServerSettings,
    parse_cache_config,
)


def _bool(value: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ascend-serve",
        description="Serve a Triton model repository over KServe v2 HTTP and gRPC.",
    )
    add = parser.add_argument

    def flag(name: str, default: bool, help_text: str) -> None:
        add(
            name,
            type=_bool,
            nargs="?",
            const=True,
            default=default,
            metavar="BOOL",
            help=f"{help_text} (default {str(default).lower()})",
        )

    add(
        "--model-repository",
        "--model-store",
        action="append",
        dest="model_repositories",
        required=True,
        metavar="PATH_OR_URL",
        help="path of a model repository, or s3://bucket/path (s3://host:port/bucket/path "
        "for an S3-compatible endpoint; credentials from AWS_* variables); repeat for several",
    )
    add(
        "--id",
        dest="server_id",
        default=SERVER_NAME,
        help=f"the server's name in server metadata, as Triton's --id (default {SERVER_NAME}; "
        "Triton's is triton)",
    )
    add("--http-address", default="0.0.0.0")
    add("--http-port", type=int, default=8000)
    add("--grpc-address", default="0.0.0.0")
    add("--grpc-port", type=int, default=8001)
    add("--metrics-address", default="0.0.0.0")
    add("--metrics-port", type=int, default=8002)
    flag("--allow-http", True, "serve HTTP/REST")
    flag("--allow-grpc", True, "serve gRPC")
    flag("--allow-metrics", True, "serve Prometheus metrics")
    flag(
        "--allow-cpu-metrics",
        True,
        "export CPU metrics (nv_cpu_utilization, nv_cpu_memory_*); ignored unless --allow-metrics",
    )
    add(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="Triton's metrics settings, repeatable: counter_latencies=true|false (default "
        "true), histogram_latencies=true|false (nv_inference_first_response_histogram_ms; "
        "default false), summary_latencies=true|false (nv_inference_*_summary_us; default "
        "false), summary_quantiles=<q>:<error>,... (default "
        "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001)",
    )
    flag("--strict-readiness", True, "ready only when every model is ready")
    flag(
        "--ready-with-no-models",
        False,
        "with strict readiness, be ready while no model is loaded, as Triton is",
    )
    add(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        help="how long shutdown waits for in-flight requests (default 30)",
    )
    add("--log-verbose", type=int, default=0, help="verbose logging level (default 0)")
    flag("--disable-auto-complete-config", False, "do not fill configs from model files")
    flag("--exit-on-error", True, "exit when a model fails to load at startup")
    add(
        "--model-load-retry-count",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="load a version that failed to load up to N more times (default 0), as Triton",
    )
    for name, default, what in (
        ("--model-max-batch-size", 1 << 20, "largest max_batch_size a config may set"),
        ("--model-max-instances", 128, "most instances (count x gpus) of one model version"),
        (
            "--model-max-sequence-slots",
            65536,
            "most sequence slots of one version (slots per instance x instances)",
        ),
        (
            "--model-warmup-max-requests",
            65536,
            "most warm-up requests of one version (batch_size x count over its samples)",
        ),
        (
            "--model-config-max-tensor-bytes",
            64 * 1024 * 1024,
            "largest warm-up input or sequence state a config may describe, in bytes",
        ),
        (
            "--python-max-response-ring-bytes",
            1 << 30,
            "largest response_ring_bytes a Python model may ask for",
        ),
    ):
        add(
            name,
            type=_positive_int,
            default=default,
            metavar="N",
            help=f"{what}; a config over it does not load (default {default})",
        )
    add(
        "--model-max-delay-secs",
        type=_positive_float,
        default=86400.0,
        help="longest max_queue_delay_microseconds or max_sequence_idle_microseconds a config "
        "may set, in seconds; a config over it does not load (default 86400)",
    )
    flag(
        "--colocate-cheap-instances",
        True,
        "keep the event loop on one CPU and move instance threads whose batches cost them "
        "little CPU onto it (Linux; see scheduler/affinity.py)",
    )
    add(
        "--http-max-input-size",
        type=int,
        default=DEFAULT_MAX_INPUT_SIZE,
        help="largest accepted HTTP request body, after decompression (default 64 MiB)",
    )
    add(
        "--http-max-json-depth",
        type=_positive_int,
        default=100,
        metavar="LEVELS",
        help="deepest nesting of arrays and objects accepted in a JSON body (default 100)",
    )
    add(
        "--http-offload-threshold",
        type=_non_negative_int,
        default=64 * 1024,
        metavar="BYTES",
        help="request bodies (as sent or once inflated) and JSON responses larger than this "
        "are decompressed, parsed and encoded in parser processes, off the event loop "
        "(default 65536)",
    )
    add(
        "--http-parser-processes",
        type=_non_negative_int,
        default=2,
        help="parser processes for large HTTP bodies, started on first use; 0 parses every "
        "body on the event loop (default 2)",
    )
    add(
        "--grpc-offload-threshold",
        type=_non_negative_int,
        default=64 * 1024,
        metavar="BYTES",
        help="gRPC inputs and outputs converted element by element (BYTES, typed contents at 8 "
        "bytes a value) larger than this are converted in a thread, off the event loop "
        "(default 65536)",
    )
    add(
        "--grpc-max-message-size",
        type=int,
        default=GRPC_MAX_MESSAGE,
        help="largest gRPC message in either direction (default 2 GiB - 1)",
    )
    add(
        "--grpc-infer-response-compression-level",
        default="none",
        choices=["none", "low", "medium", "high"],
    )
    # Connection bounds (server/net/connections.py; README "Limits and security").
    add(
        "--http-header-timeout-secs",
        type=_positive_float,
        default=30.0,
        help="close a connection whose request headers are not complete this many seconds "
        "after they began (slowloris; default 30)",
    )
    add(
        "--http-max-header-size",
        type=_positive_int,
        default=65536,
        metavar="BYTES",
        help="answer 431 and close a connection whose request line and headers together pass "
        "this many bytes (default 65536)",
    )
    add(
        "--http-body-timeout-secs",
        type=_positive_float,
        default=60.0,
        help="abandon a request body whose bytes stop arriving for this many seconds: 408, "
        "then the connection is closed (default 60, as nginx's client_body_timeout)",
    )
    add(
        "--http-max-inflight-body-size",
        type=_positive_int,
        default=None,
        metavar="BYTES",
        help="request body bytes all HTTP connections of a server process may hold at once; a "
        "body that would pass it gets 503 with Retry-After and its connection is closed "
        "(default 1 GiB, at least twice --http-max-input-size)",
    )
    add(
        "--http-idle-timeout-secs",
        type=_positive_float,
        default=60.0,
        help="close a new connection that sends no request for this many seconds (default 60)",
    )
    add(
        "--http-keep-alive-timeout-secs",
        type=_positive_float,
        default=60.0,
        help="close a kept-alive connection with no next request after this many seconds "
        "(default 60)",
    )
    add(
        "--http-max-connections",
        type=_positive_int,
        default=None,
        help="most HTTP connections open at once; past it (and the health reserve) new ones are "
        "closed at once (default 4096, less where the descriptor limit, ulimit -n, needs it)",
    )
    add(
        "--http-health-reserved-connections",
        type=_non_negative_int,
        default=16,
        help="connections accepted past --http-max-connections that may only ask "
        "/v2/health/live or /v2/health/ready; anything else gets 503 (default 16)",
    )
    add(
        "--grpc-max-input-size",
        type=_positive_int,
        default=None,
        help="largest gRPC request message, after decompression: a compressed request that "
        "would inflate past it is refused with RESOURCE_EXHAUSTED while inflating "
        "(default: --http-max-input-size; at most --grpc-max-message-size)",
    )
    add(
        "--grpc-keepalive-time",
        type=_positive_int,
        default=7_200_000,
        metavar="MS",
        help="milliseconds between keepalive pings the server sends (default 7200000)",
    )
    add(
        "--grpc-keepalive-timeout",
        type=_positive_int,
        default=20_000,
        metavar="MS",
        help="milliseconds to wait for a keepalive ping's answer before closing (default 20000)",
    )
    flag(
        "--grpc-keepalive-permit-without-calls",
        False,
        "allow clients to send keepalive pings on connections with no call",
    )
    add(
        "--grpc-http2-max-pings-without-data",
        type=_non_negative_int,
        default=2,
        help="pings the server sends without data before it needs data (0: no limit; default 2)",
    )
    add(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=_non_negative_int,
        default=300_000,
        metavar="MS",
        help="shortest interval between client pings on a connection without data; quicker "
        "pings are strikes (default 300000)",
    )
    add(
        "--grpc-http2-max-ping-strikes",
        type=_non_negative_int,
        default=2,
        help="strikes before the connection is closed (0: no limit; default 2)",
    )
    add(
        "--grpc-max-connection-idle",
        type=_positive_int,
        default=60_000,
        metavar="MS",
        help="close (GOAWAY) a gRPC connection with no call for this many milliseconds; "
        "clients reconnect on their next call (default 60000)",
    )
    add(
        "--grpc-max-connections",
        type=_positive_int,
        default=None,
        help="most gRPC connections open at once; new ones past it are closed (default 4096, "
        "less where the descriptor limit, ulimit -n, needs it)",
    )
    add(
        "--grpc-max-concurrent-streams",
        type=_positive_int,
        default=1000,
        help="most calls open at once on one gRPC connection; clients queue the rest "
        "(default 1000)",
    )
    add(
        "--grpc-max-stream-pending-size",
        type=_positive_int,
        default=GRPC_STREAM_PENDING_SIZE,
        metavar="BYTES",
        help="bytes one ModelStreamInfer call may hold in requests being answered and answers "
        "the client has not read; past it the stream's next requests are not read until the "
        f"client reads (default {GRPC_STREAM_PENDING_SIZE})",
    )
    add(
        "--grpc-stream-first-request-timeout",
        type=_non_negative_int,
        default=GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS,
        metavar="MS",
        help="end (UNAVAILABLE) a ModelStreamInfer call that sends no request this many "
        "milliseconds after it opens; 0: no limit "
        f"(default {GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS})",
    )
    add(
        "--grpc-handshake-timeout",
        type=_positive_int,
        default=30_000,
        metavar="MS",
        help="close a gRPC connection that has not completed its HTTP/2 handshake after this "
        "many milliseconds (a silent client; default 30000)",
    )
    add(
        "--thread-scheduling",
        default=THREAD_SCHEDULING,
        choices=list(POLICIES),
        help="Linux scheduling policy of the server's threads and processes: batch "
        "(SCHED_BATCH: a woken thread waits for its waker, which holds the GIL, to sleep instead "
        "of preempting it) or normal (SCHED_OTHER; default batch)",
    )
    add(
        "--gil-switch-interval",
        type=_switch_interval,
        default=GIL_SWITCH_INTERVAL_US,
        metavar="US",
        help="how long, in microseconds, a server thread that wants the GIL waits before the "
        "thread holding it must let go (Python's switch interval, whose own default is 5000; "
        "50 to 100000): a model instance's thread back from its model waits this long for a "
        f"busy event loop before it can start its next batch (default {GIL_SWITCH_INTERVAL_US})",
    )
    add(
        "--grpc-server",
        default="threads",
        choices=["aio", "threads"],
        help="which grpcio server serves gRPC: threads (grpcio's synchronous server, handing "
        "each burst of calls to the loop) or aio (grpc.aio on the event loop; default threads)",
    )
    add(
        "--grpc-threads",
        type=_positive_int,
        default=None,
        help="--grpc-server threads: handler threads, made as calls need them; calls past them "
        "wait (default: --grpc-max-concurrent-rpcs, a thread for every call it admits)",
    )
    add(
        "--grpc-thread-streams",
        type=_positive_int,
        default=256,
        help="--grpc-server threads: streaming calls (ModelStreamInfer, Health.Watch) open at "
        "once, each holding a thread; more are answered RESOURCE_EXHAUSTED (default 256)",
    )
    add(
        "--grpc-max-concurrent-rpcs",
        type=_positive_int,
        default=1024,
        help="--grpc-server threads: calls open at once, waiting ones included; more are "
        "answered RESOURCE_EXHAUSTED (default 1024)",
    )
    add(
        "--grpc-message-timeout",
        type=_non_negative_int,
        default=GRPC_MESSAGE_TIMEOUT_MS,
        metavar="MS",
        help="--grpc-server threads: cancel a call whose request message has not arrived this "
        f"many milliseconds after it opened; 0: no limit (default {GRPC_MESSAGE_TIMEOUT_MS})",
    )
    add("--model-config-name", default=None, help="use configs/<name>.pbtxt where present")
    add(
        "--metrics-summary-samples",
        type=_positive_int,
        default=DEFAULT_CAPACITY,
        metavar="N",
        help="with summary_latencies, the observations each summary keeps per 12 s of its "
        "60 s window (exact quantiles below that many, sampled above; memory: N x 5 x 5 "
        f"values per model version; default {DEFAULT_CAPACITY})",
    )
    add(
        "--metrics-interval-ms",
        type=_positive_int,
        default=2000,
        metavar="MS",
        help="read the per-interval metrics (CPU) and merge the summaries' observations every "
        "this many milliseconds (default 2000)",
    )
    add(
        "--model-control-mode",
        choices=["none", "poll", "explicit"],
        default="none",
        help="none: load everything at startup; poll: also follow repository changes; "
        "explicit: load --load-model models, then only through the repository API "
        "(default none)",
    )
    add(
        "--repository-poll-secs",
        type=_positive_float,
        default=15.0,
        help="seconds between repository polls in poll mode (default 15)",
    )
    add(
        "--repository-settle-secs",
        type=_non_negative_float,
        default=10.0,
        help="poll mode: how long a version's files (or a model's config and labels) must stay "
        "unchanged before they load, unless a '.ready' file written last marks them "
        "complete; 0: two polls in a row (default 10)",
    )
    add(
        "--object-store-cache-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where s3:// repositories are mirrored, one folder each, emptied at start and "
        "deleted at exit (default: a temporary folder of the server's own)",
    )
    add(
        "--object-store-max-objects",
        type=_positive_int,
        default=MirrorLimits.max_objects,
        metavar="N",
        help=f"most objects one s3:// repository may list (default {MirrorLimits.max_objects})",
    )
    add(
        "--object-store-max-object-bytes",
        type=_positive_int,
        default=MirrorLimits.max_object_bytes,
        metavar="BYTES",
        help="largest object fetched from an s3:// repository (default "
        f"{MirrorLimits.max_object_bytes})",
    )
    add(
        "--object-store-max-version-bytes",
        type=_positive_int,
        default=MirrorLimits.max_version_bytes,
        metavar="BYTES",
        help="most bytes of one version (or of a model's model-level files) fetched from an "
        f"s3:// repository (default {MirrorLimits.max_version_bytes})",
    )
    add(
        "--object-store-timeout-secs",
        type=_positive_float,
        default=MirrorLimits.timeout_secs,
        metavar="SECS",
        help="connect and read timeout of each object-store request (default "
        f"{MirrorLimits.timeout_secs:g})",
    )
    add(
        "--traffic-gate-interval-secs",
        type=_positive_float,
        default=0.25,
        help="gray release: seconds between two judgements of a running canary (a rollback "
        "takes effect within this; default 0.25)",
    )
    add(
        "--traffic-shadow-max-inflight",
        type=int,
        default=32,
        help="gray release: shadow requests in flight before new ones are dropped and counted "
        "(default 32)",
    )
    add(
        "--load-model",
        action="append",
        dest="load_models",
        default=[],
        metavar="NAME",
        help="in explicit mode, a model to load at startup; repeat for several, '*' for all",
    )
    flag(
        "--allow-model-load-file-override",
        False,
        "accept file:<path> parameters in the model load API (HTTP and gRPC); they write files "
        "the server loads, so any client that reaches the API can run code as the server's "
        "user (a Python model)",
    )
    add(
        "--overload-status",
        type=int,
        choices=[503, 429],
        default=503,
        help="HTTP status of a request refused because its model's queue is full: 503, or 429 "
        "for clients that retry on 429 (gRPC answers UNAVAILABLE either way; default 503)",
    )
    add(
        "--frontend-processes",
        type=_process_count,
        default=1,
        metavar="N|auto",
        help="processes that accept HTTP and gRPC connections on the same ports (SO_REUSEPORT): "
        "this one, which owns the models and batchers, and N-1 more that decode requests "
        "and hand them to it through shared memory; auto: the CPUs this process may use "
        "(default 1)",
    )
    add(
        "--frontend-shm-bytes",
        type=_positive_int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="shared memory each way between the model owner and each extra frontend process; "
        "tensors that do not fit travel through the socket (default 64 MiB)",
    )
    add(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="HTTP requests in these API categories (health, metadata, inference, "
        "shared-memory, model-config, model-repository, statistics, trace, logging) must "
        "carry header KEY with VALUE, or get 403; repeat for other groups",
    )
    add(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="gRPC calls in these categories must carry metadata "
        "'triton-grpc-protocol-KEY' with VALUE, or get UNAVAILABLE; repeat for other groups",
    )
    add(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings: rate=N, level=OFF|TIMESTAMPS|TENSORS (repeatable), "
        "count=N, mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
        "opentelemetry,bsp_schedule_delay=MS (and bsp_max_queue_size, "
        "bsp_max_export_batch_size)",
    )
    add(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="Triton's response cache: --cache-config local,size=BYTES holds answers of models "
        "whose config has response_cache { enable: true } (default: no cache)",
    )
    add(
        "--rate-limit",
        type=str.lower,
        choices=("off", "execution_count"),
        default="off",
        help="Triton's rate limiter: execution_count runs an instance's batch only while the "
        "resources its instance_group's rate_limiter names are free, turns weighted by its "
        "priority; off (default) ignores rate_limiter",
    )
    add(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="copies of a rate-limiter resource, per device (on DEVICE only, when given; a "
        "global resource has COUNT for the whole server); repeatable; default: the most any "
        "loaded instance asks for",
    )
    add(
        "--max-shared-memory-regions",
        type=_positive_int,
        default=1024,
        metavar="N",
        help="system shared memory regions clients may register at once (default 1024)",
    )
    add(
        "--max-echo-chars",
        type=_echo_chars,
        default=200,
        metavar="N",
        help="most characters of a client-chosen text (model name, id, header, region name) "
        "an error or a log line shows; control characters are always escaped (default 200, "
        "16 to 1000)",
    )
    add(
        "--custom-metric-max-families",
        type=_positive_int,
        default=100,
        metavar="N",
        help="most custom metric families Python models may declare, all together (default 100)",
    )
    add(
        "--custom-metric-max-series",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="most series (label sets) of one custom metric family (default 1000)",
    )
    add(
        "--custom-metric-max-labels",
        type=_positive_int,
        default=16,
        metavar="N",
        help="most labels of one custom metric series (default 16)",
    )
    add(
        "--custom-metric-max-buckets",
        type=_positive_int,
        default=64,
        metavar="N",
        help="most buckets of one custom histogram series (default 64)",
    )
    add(
        "--custom-metric-max-text",
        type=_positive_int,
        default=1024,
        metavar="N",
        help="most characters of a custom metric's description or label value (default 1024)",
    )
    return parser


def _require_otel() -> None:
    """OpenTelemetry mode needs the optional SDK: say so at startup, not on the first trace."""
    import importlib.util

    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise ValueError(
                "--trace-config mode=opentelemetry needs the OpenTelemetry SDK: "
                "pip install -e '.[otel]' in the ascend-serve checkout (it is not on PyPI), "
                "or pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
            )


def _process_count(value: str) -> int:
    """--frontend-processes: a count of at least 1, or `auto` for the CPUs available."""
    if value.strip().lower() == "auto":
        import os

        return max(1, len(os.sched_getaffinity(0)))
    return _positive_int(value)


def _bounded(kind: type, strict: bool) -> Callable[[str], Any]:
    """An argparse type: `kind` (int or float) above 0 (`strict`) or at least 0."""
    noun = "an integer" if kind is int else "a number"

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got '{value}'") from None
        if not (number > 0 if strict else number >= 0):  # NaN fails both
            bound = "greater than 0" if strict else "0 or more"
            raise argparse.ArgumentTypeError(f"must be {bound}, got '{value}'")
        return number

    return parse


_positive_int = _bounded(int, strict=True)
_non_negative_int = _bounded(int, strict=False)
_positive_float = _bounded(float, strict=True)
_non_negative_float = _bounded(float, strict=False)


def _int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high` (above 0 first, with its own text)."""

    def parse(value: str) -> int:
        number = int(_positive_int(value))
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got '{value}'")
        return number

    return parse


# --gil-switch-interval: 50 µs to 0.1 s (Python takes any positive interval; below tens of µs
# threads would pass the GIL more than they run).
_switch_interval = _int_between(50, 100_000)
# --max-echo-chars: 16 to 1000, so an error quoting two such texts still fits gRPC's metadata
# (protocol/text.py).
_echo_chars = _int_between(16, 1000)


def _split_repositories(
    parser: argparse.ArgumentParser, values: list[str]
) -> tuple[list[Path], list[S3Location]]:
    """Local paths (resolved) and object-store URLs (parsed; a bad one stops here, saying why)."""
    local: list[Path] = []
    remote: list[S3Location] = []
    for value in values:
        if not is_url(value):
            local.append(Path(value).resolve())
            continue
        try:
            location = parse_repository_url(value)
        except ValueError as exc:
            parser.error(str(exc))
        if location not in remote:
            remote.append(location)
    return local, remote


def settings_from_args(argv: Sequence[str] | None = None) -> ServerSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    from server.observability.metrics import parse_metrics_config
    from server.observability.tracing import parse_trace_config
    from server.restricted import GRPC_HEADER_PREFIX, parse_restrictions

    try:
        http_restricted = parse_restrictions(args.http_restricted_api, "--http-restricted-api")
        grpc_restricted = parse_restrictions(
            args.grpc_restricted_protocol, "--grpc-restricted-protocol", GRPC_HEADER_PREFIX
        )
        cache_bytes = parse_cache_config(args.cache_config)
        rate_resources = [parse_resource_flag(text) for text in args.rate_limit_resource]
        trace_config, otel_config = parse_trace_config(args.trace_config)
        if trace_config.get("trace_mode") == ["opentelemetry"]:
            _require_otel()
        metrics_config = parse_metrics_config(args.metrics_config)
    except ValueError as exc:
        parser.error(str(exc))
    local, remote = _split_repositories(parser, args.model_repositories)
    budget = args.http_max_inflight_body_size
    if budget is not None and budget < args.http_max_input_size:
        # a body within its own limit would always be refused as if the server were busy
        parser.error(
            f"--http-max-inflight-body-size {budget} is below --http-max-input-size "
            f"{args.http_max_input_size}"
        )
    return ServerSettings(
        model_repositories=local,
        object_repositories=remote,
        object_store_cache_dir=args.object_store_cache_dir,
        object_store_limits=MirrorLimits(
            args.object_store_max_objects,
            args.object_store_max_object_bytes,
            args.object_store_max_version_bytes,
            args.object_store_timeout_secs,
        ),
        server_id=args.server_id,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        strict_readiness=args.strict_readiness,
        ready_with_no_models=args.ready_with_no_models,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        auto_complete_config=not args.disable_auto_complete_config,
        exit_on_error=args.exit_on_error,
        colocate_cheap_instances=args.colocate_cheap_instances,
        http_max_input_size=args.http_max_input_size,
        json_max_depth=args.http_max_json_depth,
        http_offload_threshold=args.http_offload_threshold,
        grpc_offload_threshold=args.grpc_offload_threshold,
        http_parser_processes=args.http_parser_processes,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_infer_response_compression_level=args.grpc_infer_response_compression_level,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_max_header_size=args.http_max_header_size,
        http_idle_timeout_secs=args.http_idle_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        http_max_inflight_body_size=args.http_max_inflight_body_size,
        http_keep_alive_timeout_secs=args.http_keep_alive_timeout_secs,
        http_max_connections=args.http_max_connections,
        http_health_reserved_connections=args.http_health_reserved_connections,
        grpc_max_input_size=args.grpc_max_input_size,
        grpc_keepalive_time_ms=args.grpc_keepalive_time,
        grpc_keepalive_timeout_ms=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_http2_min_recv_ping_interval_without_data_ms=(
            args.grpc_http2_min_recv_ping_interval_without_data
        ),
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_max_connection_idle_ms=args.grpc_max_connection_idle,
        grpc_max_concurrent_streams=args.grpc_max_concurrent_streams,
        grpc_max_stream_pending_size=args.grpc_max_stream_pending_size,
        grpc_stream_first_request_timeout_ms=args.grpc_stream_first_request_timeout,
        grpc_max_connections=args.grpc_max_connections,
        grpc_handshake_timeout_ms=args.grpc_handshake_timeout,
        grpc_server=args.grpc_server,
        thread_scheduling=args.thread_scheduling,
        gil_switch_interval_us=args.gil_switch_interval,
        grpc_threads=args.grpc_threads,
        grpc_thread_streams=args.grpc_thread_streams,
        grpc_max_concurrent_rpcs=args.grpc_max_concurrent_rpcs,
        grpc_message_timeout_ms=args.grpc_message_timeout,
        model_config_name=args.model_config_name,
        model_load_retry_count=args.model_load_retry_count,
        model_max_batch_size=args.model_max_batch_size,
        model_max_instances=args.model_max_instances,
        model_max_sequence_slots=args.model_max_sequence_slots,
        model_warmup_max_requests=args.model_warmup_max_requests,
        model_config_max_tensor_bytes=args.model_config_max_tensor_bytes,
        python_max_response_ring_bytes=args.python_max_response_ring_bytes,
        model_max_delay_secs=args.model_max_delay_secs,
        metrics_interval_ms=args.metrics_interval_ms,
        allow_cpu_metrics=args.allow_cpu_metrics and args.allow_metrics,
        metrics_counter_latencies=bool(metrics_config.get("counter_latencies", True)),
        metrics_histogram_latencies=bool(metrics_config.get("histogram_latencies", False)),
        metrics_summary_latencies=bool(metrics_config.get("summary_latencies", False)),
        metrics_summary_samples=args.metrics_summary_samples,
        metrics_summary_quantiles=metrics_config.get(  # type: ignore[arg-type]  # checked
            "summary_quantiles", DEFAULT_QUANTILES
        ),
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=list(args.load_models),
        repository_settle_secs=args.repository_settle_secs,
        allow_model_load_file_override=args.allow_model_load_file_override,
        overload_status=args.overload_status,
        frontend_processes=args.frontend_processes,
        frontend_shm_bytes=args.frontend_shm_bytes,
        traffic_gate_interval_secs=args.traffic_gate_interval_secs,
        traffic_shadow_max_inflight=max(0, args.traffic_shadow_max_inflight),
        max_shared_memory_regions=args.max_shared_memory_regions,
        max_echo_chars=args.max_echo_chars,
        custom_metric_max_families=args.custom_metric_max_families,
        custom_metric_max_series=args.custom_metric_max_series,
        custom_metric_max_labels=args.custom_metric_max_labels,
        custom_metric_max_buckets=args.custom_metric_max_buckets,
        custom_metric_max_text=args.custom_metric_max_text,
        response_cache_bytes=cache_bytes,
        rate_limit=args.rate_limit,
        rate_limit_resources=rate_resources,
        http_restricted_api=http_restricted,
        grpc_restricted_protocol=grpc_restricted,
        trace_config=trace_config,
        otel_config=otel_config,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if settings.log_verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log_escaping.install()  # no client-chosen control character reaches the log
    set_echo_limit(settings.max_echo_chars)
    # Before the loop, the workers and grpc's threads exist: they inherit the policy.
    scheduling = apply_thread_scheduling(settings.thread_scheduling)
    apply_switch_interval(settings.gil_switch_interval_us)
    logging.getLogger("ascend_serve").info(
        "thread scheduling: %s; GIL switch interval %d µs",
        scheduling,
        settings.gil_switch_interval_us,
    )
    from server.app import ServerApp

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(ServerApp(settings).run())
    finally:
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
