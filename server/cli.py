"""Command line with Triton's flag names and defaults: `ascend-serve --model-repository DIR`."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from server.settings import DEFAULT_MAX_INPUT_SIZE, GRPC_MAX_MESSAGE, ServerSettings


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
        description="Serve a Triton model repository over KServe v2 HTTP and gRPC.")
    add = parser.add_argument

    def flag(name: str, default: bool, help_text: str) -> None:
        add(name, type=_bool, nargs="?", const=True, default=default, metavar="BOOL",
            help=f"{help_text} (default {str(default).lower()})")

    add("--model-repository", "--model-store", action="append", dest="model_repositories",
        required=True, type=Path, help="path of a model repository; repeat for several")
    add("--http-address", default="0.0.0.0")
    add("--http-port", type=int, default=8000)
    add("--grpc-address", default="0.0.0.0")
    add("--grpc-port", type=int, default=8001)
    add("--metrics-address", default="0.0.0.0")
    add("--metrics-port", type=int, default=8002)
    flag("--allow-http", True, "serve HTTP/REST")
    flag("--allow-grpc", True, "serve gRPC")
    flag("--allow-metrics", True, "serve Prometheus metrics")
    flag("--strict-readiness", True, "ready only when every model is ready")
    add("--exit-timeout-secs", type=float, default=30.0,
        help="how long shutdown waits for in-flight requests (default 30)")
    add("--log-verbose", type=int, default=0, help="verbose logging level (default 0)")
    flag("--disable-auto-complete-config", False, "do not fill configs from model files")
    flag("--exit-on-error", True, "exit when a model fails to load at startup")
    flag("--colocate-cheap-instances", True,
         "keep the event loop on one CPU and move instance threads whose batches cost them "
         "little CPU onto it (Linux; see scheduler/affinity.py)")
    add("--http-max-input-size", type=int, default=DEFAULT_MAX_INPUT_SIZE,
        help="largest accepted HTTP request body, after decompression (default 64 MiB)")
    add("--grpc-max-message-size", type=int, default=GRPC_MAX_MESSAGE,
        help="largest gRPC message in either direction (default 2 GiB - 1)")
    add("--grpc-infer-response-compression-level", default="none",
        choices=["none", "low", "medium", "high"])
    add("--model-config-name", default=None, help="use configs/<name>.pbtxt where present")
    add("--metrics-interval-ms", type=int, default=2000)
    add("--model-control-mode", choices=["none", "poll", "explicit"], default="none",
        help="none: load everything at startup; poll: also follow repository changes; "
             "explicit: load --load-model models, then only through the repository API "
             "(default none)")
    add("--repository-poll-secs", type=_positive_float, default=15.0,
        help="seconds between repository polls in poll mode (default 15)")
    add("--load-model", action="append", dest="load_models", default=[], metavar="NAME",
        help="in explicit mode, a model to load at startup; repeat for several, '*' for all")
    return parser


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{value}'") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got '{value}'")
    return number


def settings_from_args(argv: Optional[Sequence[str]] = None) -> ServerSettings:
    args = build_parser().parse_args(argv)
    return ServerSettings(
        model_repositories=[p.resolve() for p in args.model_repositories],
        http_address=args.http_address, http_port=args.http_port,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port,
        metrics_address=args.metrics_address, metrics_port=args.metrics_port,
        allow_http=args.allow_http, allow_grpc=args.allow_grpc, allow_metrics=args.allow_metrics,
        strict_readiness=args.strict_readiness, exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose, auto_complete_config=not args.disable_auto_complete_config,
        exit_on_error=args.exit_on_error,
        colocate_cheap_instances=args.colocate_cheap_instances,
        http_max_input_size=args.http_max_input_size,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_infer_response_compression_level=args.grpc_infer_response_compression_level,
        model_config_name=args.model_config_name, metrics_interval_ms=args.metrics_interval_ms,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs, load_models=list(args.load_models),
    )


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # uvloop is optional (not on Windows)
        return asyncio.new_event_loop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    settings = settings_from_args(argv)
    logging.basicConfig(level=logging.DEBUG if settings.log_verbose > 1 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from server.app import ServerApp

    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(ServerApp(settings).run())
    finally:
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
