"""Server settings, named after Triton's command-line flags, with Triton's defaults."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
GRPC_MAX_MESSAGE = 2**31 - 1


@dataclass
class ServerSettings:
    model_repositories: list[Path] = field(default_factory=list)
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
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    auto_complete_config: bool = True
    exit_on_error: bool = True
    colocate_cheap_instances: bool = True  # scheduler/affinity.py
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    json_max_depth: int = 100
    grpc_max_message_size: int = GRPC_MAX_MESSAGE
    grpc_infer_response_compression_level: str = "none"
    model_config_name: str | None = None
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    metrics_interval_ms: int = 2000
