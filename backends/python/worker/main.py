"""The process one Python model instance runs in (`python -m backends.python.worker.main --fd N`).

It loads `model.py`, instantiates `TritonPythonModel`, and then answers the server's messages
one at a time on the inherited socket: init, execute, auto_complete, finalize. A separate
process per instance lets Python models run in parallel despite the GIL, and keeps a crashing
model from taking the server down. It runs as the child of its supervisor (supervisor.py) and
never outlives it (die_with_parent), nor the supervisor the server.

Startup must stay fast (tests start many workers): import nothing beyond the standard
library, numpy and the model-side utils here; the model itself imports what it needs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from types import ModuleType
from typing import Any

import numpy as np

import triton_python_backend_utils as pb_utils
from backends.python.wire.channel import Channel
from backends.python.wire.framing import ArenaReader, ArenaWriter, ChannelClosed, TensorRef
from backends.python.wire.ring import RingReader, RingWriter
from backends.python.worker import model_api as python_model_api
from backends.python.worker.bridge import WorkerBridge
from backends.python.worker.prctl import PR_SET_PDEATHSIG, prctl

MODEL_MODULE = "model"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_model_module(model_file: str, version_dir: str) -> ModuleType:
    """Import model.py by path, with its folder on sys.path so sibling modules import too."""
    if version_dir not in sys.path:
        sys.path.insert(0, version_dir)
    spec = importlib.util.spec_from_file_location(MODEL_MODULE, model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{model_file}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODEL_MODULE] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"'{model_file}' does not define class TritonPythonModel")
    return module


DECOUPLED_RETURN_ERROR = (
    "Python model '{model}' is using the decoupled mode and the execute function must return None."
)
NO_RESPONSE_ERROR = (
    "the model's execute returned None, but sent no response for this request "
    "through its response sender before returning"
)


class WorkerLoop:
    """Holds the model, both arenas and the rings; `serve` runs until finalize or until the
    server goes. Messages that are not operations (acks, cancellations, BLS answers) are
    routed by whichever thread reads the channel (backends/python/wire/channel.py)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.channel = Channel(sock, self._route)
        self.inputs = ArenaReader()
        self.outputs = ArenaWriter()
        self.model: Any = None
        self.model_name = ""
        self.instance_name = ""
        self.decoupled = False
        self.bridge = WorkerBridge(self.channel, RingWriter(), RingReader(), 64, 60.0)
        python_model_api.install(self.bridge)
        self._loop: asyncio.AbstractEventLoop | None = None  # for `async def execute`

    def _route(self, message: dict, fds: list[int]) -> Any:
        op = message.get("op")
        if op in ("ack", "cancel"):
            self.bridge.on_notice(message)
            return None
        if op == "bls_response":
            return self.bridge.take_bls_answer(message, fds)
        if op == "metric_answer":
            return ("metric", message["mid"])
        return "op"

    def _pump(self) -> None:
        """Decoupled models: keep reading, so acks and cancellations arrive while the main
        thread runs the model and other threads send."""
        try:
            self.channel.wait("never")
        except (ChannelClosed, OSError):
            pass

    def serve(self) -> int:
        while True:
            try:
                message, fds = self.channel.wait("op")
            except (ChannelClosed, OSError):
                return 0  # the server went away: nothing left to answer
            op = message.get("op")
            handler = getattr(self, f"on_{op}", None)
            if handler is None:
                self.reply({"ok": False, "error": f"unknown operation '{op}'"})
                continue
            reply, reply_fds = handler(message, fds)
            try:
                self.reply(reply, reply_fds)
            except (ChannelClosed, OSError):
                return 0
            if op == "finalize":
                return 0

    def reply(self, message: dict, fds: list[int] | None = None) -> None:
        self.channel.send(message, fds or ())

    # ----- operations ------------------------------------------------------------------------

    def on_init(self, message: dict, fds: list[int]) -> tuple[dict, None]:
        args = message["args"]
        self.model_name = args.get("model_name", "")
        self.instance_name = args.get("model_instance_name", "")
        stream = message.get("stream") or {}
        self.bridge.window = int(stream.get("window", self.bridge.window))
        self.bridge.send_timeout_s = float(stream.get("send_timeout_s", self.bridge.send_timeout_s))
        self.bridge.ring = RingWriter(
            int(stream.get("ring_bytes", 8 << 20)), float(stream.get("send_timeout_s", 60.0))
        )
        try:
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
                json.loads(args.get("model_config") or "{}")
            )
        except ValueError:
            self.decoupled = False
        if self.decoupled:
            threading.Thread(target=self._pump, name="channel-reader", daemon=True).start()
        try:
            module = load_model_module(message["model_file"], message["version_dir"])
            self.model = module.TritonPythonModel()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                initialize(args)
        except BaseException as exc:
            traceback.print_exc()
            return {"ok": False, "error": _describe(exc)}, None
        return {"ok": True}, None

    def on_auto_complete(self, message: dict, fds: list[int]) -> tuple[dict, None]:
        try:
            module = load_model_module(message["model_file"], message["version_dir"])
            completer = getattr(module.TritonPythonModel, "auto_complete_config", None)
            config = pb_utils.ModelConfig(message["config"])
            if completer is not None:
                config = completer(config)
                if not isinstance(config, pb_utils.ModelConfig):
                    raise TypeError("auto_complete_config must return the ModelConfig it was given")
        except BaseException as exc:
            traceback.print_exc()
            return {"ok": False, "error": _describe(exc)}, None
        return {"ok": True, "config": config.as_dict()}, None

    def on_execute(self, message: dict, fds: list[int]) -> tuple[dict, list[int] | None]:
        if fds:
            self.inputs.adopt(fds[0])
            for extra in fds[1:]:
                os.close(extra)
        requests = self._requests(message)
        try:
            responses = self._run(requests)
            if self.decoupled:
                if responses is not None:
                    raise pb_utils.TritonModelException(
                        DECOUPLED_RETURN_ERROR.format(model=self.model_name)
                    )
                return {"ok": True}, None
            results = self._check(responses, requests)
        except BaseException as exc:
            traceback.print_exc()
            if self.decoupled:
                for request in requests:
                    self.bridge.forget(request._state.rid)
            return {"ok": False, "error": self._failure_text(exc)}, None
        groups: list[dict[str, np.ndarray]] = []
        errors: list[tuple[int, str] | None] = []
        params: list[dict | None] = []
        for result in results:
            if isinstance(result, pb_utils.TritonError):
                groups.append({})
                errors.append((result.code(), result.message()))
                params.append(None)
            else:
                groups.append({t.name(): t.as_numpy() for t in result.output_tensors()})
                errors.append(None)
                params.append((result._parameter_dict() or None) if result._parameters else None)
        try:
            refs, new_fd = self.outputs.pack(groups)
        except BaseException as exc:
            traceback.print_exc()
            return {"ok": False, "error": self._failure_text(exc)}, None
        reply = {"ok": True, "outputs": refs, "errors": errors}
        if any(params):
            reply["params"] = params
        return reply, ([new_fd] if new_fd is not None else None)

    def _run(self, requests: list[pb_utils.InferenceRequest]) -> Any:
        """The model's execute; an `async def execute` runs to completion on the worker's loop."""
        result = self.model.execute(requests)
        if type(result) is not list and inspect.iscoroutine(result):  # (a list: at once)
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def on_finalize(self, message: dict, fds: list[int]) -> tuple[dict, None]:
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                finalize()
            except BaseException as exc:
                traceback.print_exc()
                return {"ok": False, "error": _describe(exc)}, None
        return {"ok": True}, None

    # ----- helpers ---------------------------------------------------------------------------

    def _requests(self, message: dict) -> list[pb_utils.InferenceRequest]:
        """The requests of an execute message. Each detail list (rids, requested outputs,
        ids and parameters, sequence fields) is in the message only when some request has
        one, so a plain request costs no more than it did before they existed."""
        rids = message.get("rids")  # decoupled requests only: the server's ids for them
        wanted = message.get("requested")
        meta = message.get("meta")
        sequence = message.get("sequence")
        everything = message["outputs"]
        requests = []
        for index, refs in enumerate(message["requests"]):
            names = wanted[index] if wanted else None
            request_id, params = meta[index] if meta else ("", None)
            corrid, flags = sequence[index] if sequence else (0, 0)
            request = self._request(
                refs, everything if names is None else names, request_id, params, corrid, flags
            )
            if rids:  # decoupled: registered by the server's id, for its acks and cancellation
                request._state = self.bridge.register(rids[index], True, names)
            else:  # its sender state, if its model ever asks, is made then (pb_utils)
                request._received = True
            requests.append(request)
        return requests

    def _request(
        self,
        refs: list[TensorRef],
        outputs: list[str],
        request_id: str = "",
        parameters: dict | None = None,
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> pb_utils.InferenceRequest:
        # A decoupled model may read its inputs after execute returned, when the next call has
        # rewritten the arena: it gets copies.
        view = self.inputs.copy if self.decoupled else self.inputs.view
        tensors = [pb_utils.Tensor(ref[0], view(ref)) for ref in refs]
        return pb_utils.InferenceRequest(
            self.model_name,
            tensors,
            outputs,
            request_id=request_id,
            parameters=parameters,
            correlation_id=correlation_id,
            flags=flags,
        )

    def _failure_text(self, exc: BaseException) -> str:
        return (
            f"Failed to process the request(s) for model instance '{self.instance_name}', "
            f"message: {_describe(exc)}"
        )

    @staticmethod
    def _check(responses: Any, requests: list[pb_utils.InferenceRequest]) -> list[Any]:
        """Each entry: the response, or its TritonError. A None from execute means the
        responses went through the requests' senders (Triton allows one each)."""
        expected = len(requests)
        if responses is None:
            responses = [
                request._state.collected
                if request._state is not None and request._state.collected is not None
                else pb_utils.InferenceResponse(error=pb_utils.TritonError(NO_RESPONSE_ERROR))
                for request in requests
            ]
        if not isinstance(responses, (list, tuple)):
            raise TypeError(
                f"execute must return a list of InferenceResponse, got {type(responses).__name__}"
            )
        if len(responses) != expected:
            raise ValueError(f"execute returned {len(responses)} responses for {expected} requests")
        results: list[Any] = []
        for response in responses:
            if not isinstance(response, pb_utils.InferenceResponse):
                raise TypeError(
                    f"execute must return InferenceResponse objects, got {type(response).__name__}"
                )
            results.append(response.error() if response.has_error() else response)
        return results


PARENT_CHECK_S = 0.5  # the watchdog's period where the parent-death signal is not available


def _set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent goes (Linux only)."""
    return prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def die_with_parent(parent: int | None) -> None:
    """End this process when the server ends, even in the middle of a long `execute` (an idle
    worker also sees end-of-file on its socket): the kernel SIGKILLs it when the server goes,
    however it goes (a hard-deadline exit, SIGKILL, a crash). The server may have gone before
    that was set up, so the parent is checked right after; where the signal is not available a
    watchdog thread checks it every PARENT_CHECK_S seconds."""
    if not _set_parent_death_signal() and parent is not None:
        threading.Thread(
            target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True
        ).start()
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # orphaned already: nobody will ever send us work


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--fd") + 1])
    parent = int(argv[argv.index("--parent-pid") + 1]) if "--parent-pid" in argv else None
    die_with_parent(parent)
    # Ctrl-C in a terminal reaches the whole process group; the server decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        return WorkerLoop(sock).serve()
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
