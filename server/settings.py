"""Server settings, named after Triton's command-line flags, with Triton's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repository.s3_location import S3Location
from repository.s3_mirror import MirrorLimits
from scheduler.rate_limiter import ResourceLimit
from server.observability.quantiles import DEFAULT_CAPACITY, DEFAULT_QUANTILES

SERVER_NAME = "ascend-serve"  # what server metadata names us unless --id says otherwise
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
GRPC_MAX_MESSAGE = 2**31 - 1
# One ModelStreamInfer call: bytes of requests in flight and answers not yet written, past
# which its requests are not read (server/grpc/services.py); and the time to its first request.
GRPC_STREAM_PENDING_SIZE = 16 * 1024 * 1024
GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS = 60_000
GRPC_MESSAGE_TIMEOUT_MS = 60_000
THREAD_SCHEDULING = "batch"  # or "normal" (server/cpu_scheduling.py)
GIL_SWITCH_INTERVAL_US = 500  # Python's own is 5000; 50-100000 (server/cpu_scheduling.py)


@dataclass
class ServerSettings:
    model_repositories: list[Path] = field(default_factory=list)
    # s3:// repositories (repository/s3_mirror.py): mirrored under object_store_cache_dir (None:
    # a temporary folder of the server's own), within object_store_limits.
    object_repositories: list[S3Location] = field(default_factory=list)
    object_store_cache_dir: Path | None = None
    object_store_limits: MirrorLimits = field(default_factory=MirrorLimits)
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    strict_readiness: bool = True
    # Strict readiness with no model loaded: not ready (ours), or ready (Triton's).
    ready_with_no_models: bool = False
    server_id: str = SERVER_NAME  # the name server metadata reports (Triton's --id)
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    auto_complete_config: bool = True
    exit_on_error: bool = True
    model_load_retry_count: int = 0  # more tries for a version that failed to load
    # What a config (or a load request's override) may ask for (repository/bounds.py): past
    # these the load is refused naming the field and the bound.
    model_max_batch_size: int = 1 << 20
    model_max_instances: int = 128
    model_max_sequence_slots: int = 65536
    model_warmup_max_requests: int = 65536
    model_config_max_tensor_bytes: int = 64 * 1024 * 1024
    python_max_response_ring_bytes: int = 1 << 30
    model_max_delay_secs: float = 86400.0
    colocate_cheap_instances: bool = True  # scheduler/affinity.py
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    json_max_depth: int = 100
    # Request bodies (and JSON responses) larger than this many bytes are decompressed, parsed
    # and encoded in parser processes, never on the event loop (server/http/parsers.py); 0 processes
    # keeps everything on the loop.
    http_offload_threshold: int = 64 * 1024
    http_parser_processes: int = 2
    # gRPC requests whose BYTES or typed contents (8 bytes a value) exceed this many bytes are
    # converted in a thread, in steps, and so are responses with that much BYTES output
    # (server/grpc/services.py); numeric raw contents are views and never count.
    grpc_offload_threshold: int = 64 * 1024
    # HTTP connections (server/net/connections.py): how long a connection may wait without a
    # request, how many may be open (None: 4096, capped to fit the descriptor limit), and how
    # many more are kept for health checks once that limit is hit.
    http_header_timeout_secs: float = 30.0
    http_max_header_size: int = 65536  # request line and headers together (431 past it)
    # Request bodies (server/http/body.py, server/net/connections.py): bytes held by all of this
    # process's bodies at once (None: 1 GiB, at least 2 x http_max_input_size), and how long a
    # body's bytes may stop arriving before it is abandoned (408).
    http_max_inflight_body_size: int | None = None
    http_body_timeout_secs: float = 60.0
    http_idle_timeout_secs: float = 60.0
    http_keep_alive_timeout_secs: float = 60.0
    http_max_connections: int | None = None
    http_health_reserved_connections: int = 16
    # Largest gRPC request message after decompression (None: http_max_input_size): grpcio
    # checks it while inflating, so a small compressed request cannot inflate past it.
    grpc_max_input_size: int | None = None
    # gRPC connections: keepalive with Triton's flags and defaults, then our own bounds.
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    grpc_max_connection_idle_ms: int = 60_000
    grpc_max_connections: int | None = None  # None: as http_max_connections' default
    grpc_max_concurrent_streams: int = 1000
    grpc_max_stream_pending_size: int = GRPC_STREAM_PENDING_SIZE
    grpc_stream_first_request_timeout_ms: int = GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS  # 0: none
    grpc_handshake_timeout_ms: int = 30_000
    # Linux scheduling policy of the server's threads and processes: "batch" (SCHED_BATCH: a
    # woken thread does not preempt its waker, which holds the GIL) or "normal" (SCHED_OTHER).
    thread_scheduling: str = THREAD_SCHEDULING
    # How long a thread that wants the GIL waits before it asks the holder to let go
    # (sys.setswitchinterval), in µs: an instance thread back from its model waits for the busy
    # event loop this long before it can start the next batch.
    gil_switch_interval_us: int = GIL_SWITCH_INTERVAL_US
    # Which grpcio server serves gRPC: "threads" (grpcio's synchronous server,
    # server/grpc/threaded.py) or "aio" (grpc.aio on the event loop); its handler threads
    # (None: one for each call grpc_max_concurrent_rpcs admits, made as calls need them), the
    # streams (ModelStreamInfer, Health.Watch) that may hold one at once, the calls open at once
    # (past the threads they wait; past this they are answered RESOURCE_EXHAUSTED), and how long
    # a call may wait for its request message before it is cancelled (0: no bound;
    # server/grpc/message_wait.py).
    grpc_server: str = "threads"
    grpc_threads: int | None = None
    grpc_thread_streams: int = 256
    grpc_max_concurrent_rpcs: int = 1024
    grpc_message_timeout_ms: int = GRPC_MESSAGE_TIMEOUT_MS
    grpc_max_message_size: int = GRPC_MAX_MESSAGE
    grpc_infer_response_compression_level: str = "none"
    model_config_name: str | None = None
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    # Poll mode: a version (or the model-level files) must stay unchanged this long before it
    # loads, unless a `.ready` marker written last says it is complete (repository/poller.py).
    repository_settle_secs: float = 10.0
    load_models: list[str] = field(default_factory=list)
    # Load API `file:<path>` overrides write files the server then loads (a Python model is
    # code it runs): refused (403 / PERMISSION_DENIED) unless this is set.
    allow_model_load_file_override: bool = False
    overload_status: int = 503  # HTTP status of a full queue: 503 or 429 (gRPC: UNAVAILABLE)
    # Gray release (server/traffic/policy.py): how often a running canary is judged, and how many
    # shadow requests may be in flight before new ones are dropped (and counted).
    traffic_gate_interval_secs: float = 0.25
    traffic_shadow_max_inflight: int = 32
    # Metrics (server/observability/metrics.py), Triton's flags and --metrics-config keys: how
    # often per-interval metrics are read (CPU; summaries merge then too), CPU metrics on or off,
    # and which per-model latency families exist, with the summaries' (quantile, error) pairs.
    metrics_interval_ms: int = 2000
    allow_cpu_metrics: bool = True
    metrics_counter_latencies: bool = True
    metrics_histogram_latencies: bool = False
    metrics_summary_latencies: bool = False
    metrics_summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    # Observations each summary keeps per 12 s slice of its 60 s window (the memory bound).
    metrics_summary_samples: int = DEFAULT_CAPACITY
    # Processes that accept HTTP and gRPC connections (server/multiprocess/pool.py): this one, which
    # owns the models and batchers, and frontend_processes - 1 more that decode requests and
    # hand them over through shared memory (frontend_shm_bytes each way per process).
    frontend_processes: int = 1
    frontend_shm_bytes: int = 64 * 1024 * 1024
    # The response cache (server/core/response_cache.py), from --cache-config local,size=N:
    # bytes it may hold in all; 0: no cache (a model's response_cache is then ignored).
    response_cache_bytes: int = 0
    # Triton's rate limiter (scheduler/rate_limiter.py): "off" ignores instance groups'
    # rate_limiter; "execution_count" gives instances turns on the resources they name, whose
    # copies are these --rate-limit-resource values (by default the most any instance asks).
    rate_limit: str = "off"
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)
    # System shared memory regions clients may register at once (server/core/client_shm.py).
    max_shared_memory_regions: int = 1024
    # How much of a client-chosen text an error or log line shows (protocol/text.py).
    max_echo_chars: int = 200
    # Python models' custom metrics (server/observability/custom_metrics.py): families in all,
    # series per family, labels per series, buckets per histogram, characters of a name,
    # description or label value.
    custom_metric_max_families: int = 100
    custom_metric_max_series: int = 1000
    custom_metric_max_labels: int = 16
    custom_metric_max_buckets: int = 64
    custom_metric_max_text: int = 1024
    # Restricted APIs (server/restricted.py): category -> Restriction (the header and value a
    # request in that category must carry); empty: nothing restricted.
    http_restricted_api: dict[str, Any] = field(default_factory=dict)
    grpc_restricted_protocol: dict[str, Any] = field(default_factory=dict)
    # Initial trace settings from --trace-config (server/observability/tracing.py),
    # e.g. {"trace_rate": ["1"]}.
    trace_config: dict[str, list[str]] = field(default_factory=dict)
    # --trace-config opentelemetry,...: `url`, `resource` (a dict), `bsp_*`
    # (server/observability/otel.py)
    otel_config: dict[str, Any] = field(default_factory=dict)


def parse_cache_config(values: list[str]) -> int:
    """Triton's repeatable `--cache-config <cache>,<key>=<value>`: the `local` cache's size in
    bytes (0 when not given). Raises ValueError naming what is wrong."""
    size: int | None = None
    seen: set[str] = set()
    for value in values:
        cache, sep, setting = value.partition(",")
        key, eq, number = setting.partition("=")
        if not sep or not eq or not cache or not key:
            raise ValueError(
                f"--cache-config {value!r}: expected <cache>,<key>=<value>, "
                "e.g. --cache-config local,size=1048576"
            )
        seen.add(cache)
        if len(seen) > 1:
            raise ValueError("multiple cache configurations are not supported: " + value)
        if cache != "local":
            raise ValueError(f"--cache-config: unknown cache {cache!r}; only 'local' is available")
        if key != "size":
            raise ValueError(f"--cache-config local: unknown setting {key!r}; it takes size=BYTES")
        if not number.isdigit() or int(number) < 1:
            raise ValueError(
                f"--cache-config local,size={number}: size must be a positive byte count"
            )
        size = int(number)
    if seen and size is None:  # pragma: no cover - every accepted value sets it
        raise ValueError("--cache-config local needs size=BYTES")
    return size or 0
