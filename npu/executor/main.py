"""The NPU executor process (`python -m npu.executor.main --fd N --parent-pid P`).

It runs `AscendBackend` instances, the same code a test runs in-process, so pyACL's GIL-holding
calls stall this process and never the server's event loop. The inherited socket is the control
channel: `attach` brings one more socket (SCM_RIGHTS) for one instance, served by a thread of
its own, because pyACL binds each instance's context to the thread that made it; `auto_complete`
fills in a config from the `.om`; `telemetry` reads the devices the instances here have open;
`finalize` (or end-of-file) ends the process, which runs the NPU teardown at exit
(npu/teardown.py: unload what is left, reset the devices, acl.finalize). Batches arrive and
leave through the Python backend's shared-memory arenas (backends/python/wire/). It never
outlives the server (die_with_parent).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from backends.base import BackendError, InstanceSpec
from backends.python.wire.channel import Channel
from backends.python.wire.framing import ArenaReader, ArenaWriter, ChannelClosed
from backends.python.worker.main import die_with_parent
from npu.errors import ExecutionHung
from npu.executor.buffers import SlabCarver
from protocol.errors import InvalidArgument, Unavailable

log = logging.getLogger("npu.executor")


def _config(raw: bytes) -> Any:
    from protocol.proto.model_config_pb2 import ModelConfig

    config = ModelConfig()
    config.ParseFromString(raw)
    return config


def _failure(exc: BaseException, backend: Any = None) -> dict[str, Any]:
    """An error reply the client turns back into the same exception kind."""
    if isinstance(exc, InvalidArgument):
        kind, message, fatal = "invalid", str(exc), False
    elif isinstance(exc, Unavailable):
        kind, message, fatal = "unavailable", str(exc), False
    elif isinstance(exc, BackendError):
        kind, message, fatal = "backend", exc.message, exc.fatal
    else:
        traceback.print_exc()
        kind, message, fatal = "backend", f"{type(exc).__name__}: {exc}", False
    healthy = True
    if backend is not None:
        try:
            healthy = bool(backend.healthy())
        except Exception:
            healthy = False
    reply = {"ok": False, "kind": kind, "error": message, "fatal": fatal, "healthy": healthy}
    if isinstance(exc, ExecutionHung):
        reply["hung"] = True
    return reply


class InstanceLoop:
    """One instance: its socket, its arenas and its AscendBackend, all on one thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.channel = Channel(sock, lambda message, fds: "op", shared=False)
        self.inputs = ArenaReader()
        self.outputs = ArenaWriter()
        self.slabs = SlabCarver()
        self.backend: Any = None

    def serve(self) -> None:
        try:
            while True:
                try:
                    message, fds = self.channel.wait("op")
                except (ChannelClosed, OSError):
                    return
                op = message.get("op")
                reply, reply_fds = self.handle(op, message, fds)
                try:
                    self.channel.send(reply, reply_fds)
                except (ChannelClosed, OSError):
                    return
                if op == "unload":
                    return
        finally:
            self._unload()
            self.sock.close()
            self.outputs.close()
            self.inputs.close()
            self.slabs.close()

    def handle(self, op: str | None, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        if op == "load":
            return self.on_load(message), []
        if op == "execute":
            return self.on_execute(message, fds)
        if op == "unload":
            self._unload()
            return {"ok": True}, []
        return {"ok": False, "kind": "backend", "error": f"unknown operation '{op}'"}, []

    def on_load(self, message: dict) -> dict:
        spec = InstanceSpec(*message["instance"])
        # Whatever raises here must answer too (an import of pyACL, the constructor), or the
        # server would wait out its load deadline for a reply that never comes.
        try:
            from npu.backend import AscendBackend

            backend = AscendBackend(
                _config(message["config"]),
                Path(message["model_dir"]),
                Path(message["version_dir"]),
                spec,
            )
            backend.load()
        except BaseException as exc:
            return _failure(exc)
        backend.allocate_output = self.slabs.allocate
        self.backend = backend
        gears = list(backend.batch_gears)
        return {"ok": True, "gears": gears, "output_bytes": backend.output_bytes()}

    def on_execute(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """Inputs are read in place from the server's arena (sent along when it was replaced,
        `new_inputs`); outputs go straight into the slab the batch names (`slab`, its
        descriptor sent the first time, `new_slab`), else into this side's own arena."""
        fds = list(fds)
        if message.get("new_inputs") and fds:
            self.inputs.adopt(fds.pop(0))
        slab = message.get("slab")
        if slab is not None and message.get("new_slab") and fds:
            self.slabs.adopt(slab, fds.pop(0))
        for extra in fds:
            os.close(extra)
        if self.backend is None:
            return {"ok": False, "kind": "backend", "error": "no model loaded", "fatal": True}, []
        view = self.inputs.view
        inputs = {ref[0]: view(ref) for ref in message["requests"][0]}
        self.slabs.begin(slab)
        try:
            outputs = self.backend.execute(inputs)
            placed = self.slabs.refs(outputs)
            if placed is not None:
                reply = {"ok": True, "slab_outputs": placed, "healthy": self.backend.healthy()}
                return reply, []
            refs, new_fd = self.outputs.pack([outputs])
        except BaseException as exc:
            return _failure(exc, self.backend), []
        finally:
            self.slabs.end()
        reply = {"ok": True, "outputs": refs, "errors": [None], "healthy": self.backend.healthy()}
        return reply, ([new_fd] if new_fd is not None else [])

    def _unload(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            try:
                backend.unload()
            except Exception:
                traceback.print_exc()


class ExecutorLoop:
    """The control channel, on the main thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = Channel(sock, lambda message, fds: "op", shared=False)
        self.threads: list[threading.Thread] = []

    def serve(self) -> int:
        while True:
            try:
                message, fds = self.channel.wait("op")
            except (ChannelClosed, OSError):
                return 0  # the server went away
            op = message.get("op")
            try:
                reply = self.handle(op, message, fds)
            except BaseException as exc:
                reply = _failure(exc)
            try:
                self.channel.send(reply)
            except (ChannelClosed, OSError):
                return 0
            if op == "finalize":
                # Instances still attached (the server exits without unloading them) are left
                # to the teardown at exit, which waits for their executions (bounded).
                return 0

    def handle(self, op: str | None, message: dict, fds: list[int]) -> dict:
        if op == "attach":
            if not fds:
                return {"ok": False, "error": "attach without a socket"}
            for extra in fds[1:]:
                os.close(extra)
            loop = InstanceLoop(socket.socket(fileno=fds[0]))
            thread = threading.Thread(
                target=loop.serve, name=f"npu-instance-{message.get('name', '')}", daemon=True
            )
            self.threads.append(thread)
            thread.start()
            return {"ok": True}
        for fd in fds:
            os.close(fd)
        if op == "auto_complete":
            from npu.backend import AscendBackend

            config = _config(message["config"])
            AscendBackend.auto_complete(
                config, Path(message["model_dir"]), Path(message["version_dir"])
            )
            return {"ok": True, "config": config.SerializeToString()}
        if op == "telemetry":
            from npu import device, telemetry

            return {"ok": True, "readings": device.for_each_open_device(telemetry.read_device)}
        if op == "finalize":
            return {"ok": True}
        return {"ok": False, "error": f"unknown operation '{op}'"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--fd") + 1])
    parent = int(argv[argv.index("--parent-pid") + 1]) if "--parent-pid" in argv else None
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when we stop
    logging.basicConfig(level=logging.WARNING, format="npu executor %(levelname)s %(message)s")
    sock = socket.socket(fileno=fd)
    try:
        return ExecutorLoop(sock).serve()
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
