"""A frontend process (`python -m server.multiprocess.child`), started by pool.py beside it.

It serves the same HTTP and gRPC frontends as the model owner, on the same ports (SO_REUSEPORT),
over a RemoteCore (server/multiprocess/remote_core.py) that hands every inference to the owner. It
holds no model and serves no metrics. It ends when the owner sends SIGTERM (closing its listeners
after what it is writing) and dies with the owner however that goes (the parent-death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any

from protocol.text import set_echo_limit
from server.cpu_scheduling import apply_switch_interval
from server.multiprocess.arena import Arena
from server.multiprocess.link import FrontendLink
from server.multiprocess.remote_core import ControlClient, RemoteCore
from server.net.loop import new_event_loop
from server.observability import log_escaping
from server.settings import ServerSettings

log = logging.getLogger("ascend_serve.frontend")


async def serve(
    settings: ServerSettings,
    index: int,
    fds: list[int],
    shm_bytes: int,
    quick: ControlClient,
    slow: ControlClient,
) -> int:
    from server.grpc.frontend import start_grpc_server
    from server.http.listener import http_frontend_listener
    from server.net.listeners import wait_started

    loop = asyncio.get_running_loop()
    infer_fd, _, _, from_owner_fd, to_owner_fd = fds
    core = RemoteCore(
        settings, quick, slow, loop, Arena(shm_bytes, to_owner_fd), Arena(shm_bytes, from_owner_fd)
    )
    link = core.link
    stop = asyncio.Event()
    await loop.connect_accepted_socket(lambda: link, socket.socket(fileno=infer_fd))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listeners, tasks, offloads = [], [], []
    grpc_server: Any | None = None
    try:
        if settings.allow_http:
            listener, offload = http_frontend_listener(core, settings)
            listeners.append(listener)
            offloads.append(offload)
            tasks.append(asyncio.create_task(listener.serve()))
        if settings.allow_grpc:
            grpc_server = await start_grpc_server(core, settings)
        if not await wait_started(listeners, tasks):
            raise OSError("the HTTP listener did not start")
    except Exception as exc:
        await asyncio.to_thread(quick.call, "start_failed", f"{type(exc).__name__}: {exc}")
        return 1
    core.started = True
    await asyncio.to_thread(quick.call, "listening")
    watch = asyncio.create_task(_owner_gone(link, stop))
    await stop.wait()
    watch.cancel()
    core.exiting = True
    grace = max(1.0, float(settings.exit_timeout_secs))
    await core.wait_idle(grace)
    for offload in offloads:
        offload.close()
    if grpc_server is not None:
        await grpc_server.stop(grace)
    for listener in listeners:
        listener.config.timeout_graceful_shutdown = max(int(grace), 1)
        listener.should_exit = True
    if tasks:
        await asyncio.wait(tasks, timeout=grace + 1)
    return 0


async def _owner_gone(link: FrontendLink, stop: asyncio.Event) -> None:
    """Stop when the owner's link closes (the owner is gone or restarting this process)."""
    while not link.closed:
        await asyncio.sleep(0.2)
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascend-serve frontend process")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--fds", required=True)
    parser.add_argument("--shm-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    from backends.python.worker.main import die_with_parent

    die_with_parent(args.parent)
    fds = [int(fd) for fd in args.fds.split(",")]
    quick_connection = Connection(fds[1])
    settings: ServerSettings = quick_connection.recv()
    logging.basicConfig(
        level=logging.DEBUG if settings.log_verbose > 1 else logging.INFO,
        format=f"%(asctime)s %(levelname)s frontend-{args.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log_escaping.install()
    set_echo_limit(settings.max_echo_chars)
    apply_switch_interval(settings.gil_switch_interval_us)  # spawned, not forked: set it here

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(
            serve(
                settings,
                args.index,
                fds,
                args.shm_bytes,
                ControlClient(quick_connection),
                ControlClient(Connection(fds[2])),
            )
        )
    finally:
        with contextlib.suppress(Exception):
            loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
