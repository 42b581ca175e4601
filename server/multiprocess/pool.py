"""Extra frontend processes (--frontend-processes N): started, served and stopped by the process
that owns the models.

One event loop is one core, and a request's decoding and encoding cost more CPU than batching
and running it on a fast device (bench/FINDINGS.md section 9). With N > 1 this process and N-1
children accept on the same HTTP and gRPC ports (SO_REUSEPORT). A child decodes each request and
hands it over its link (server/multiprocess/link.py); here it goes through the one infer path like
any other request, so it joins the same dynamic batcher, and statistics and metrics stay one set
(served by this process alone). A child that dies is started again; its open connections are lost,
as they would be with any process.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from protocol.errors import InternalError, as_server_error
from protocol.link_codec import pack_response, unpack_request
from scheduler.queue_scheduler import admission_group
from server.core.api import CONTROL_METHODS
from server.core.inference_core import InferenceCore
from server.multiprocess.arena import Arena
from server.multiprocess.link import CANCEL, ERROR, EXITING, INFER, RESULT, FrontendLink
from server.multiprocess.remote_core import RemoteRules
from server.settings import ServerSettings

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a frontend process must have its listeners bound by then
RESTART_DELAY_S = 1.0
ROOT = Path(__file__).resolve().parents[2]


class FrontendProcess:
    """One child frontend: its process, link, control sockets and the requests it handed over."""

    def __init__(self, index: int, settings: ServerSettings, core: InferenceCore) -> None:
        self.index = index
        self.settings = settings
        self.core = core
        self.process: subprocess.Popen | None = None
        self.link: FrontendLink | None = None
        self.path = core.path  # the one infer path (server/core/inference_path.py)
        self.inflight: dict[int, asyncio.Future] = {}  # handed over, not yet answered
        self.stopping = False
        self.ready = asyncio.Event()
        self.failed: str | None = None
        self.loop = asyncio.get_running_loop()

    async def start(self) -> None:
        """Spawn the child and wait until its listeners are bound."""
        size = self.settings.frontend_shm_bytes
        to_owner, to_frontend = Arena(size), Arena(size)
        infer_here, infer_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        quick_here, quick_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        slow_here, slow_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        there = [infer_there, quick_there, slow_there]
        fds = [s.fileno() for s in there] + [to_frontend.fd, to_owner.fd]
        args = [
            sys.executable,
            "-m",
            "server.multiprocess.child",
            "--index",
            str(self.index),
            "--parent",
            str(os.getpid()),
            "--fds",
            ",".join(map(str, fds)),
            "--shm-bytes",
            str(size),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        self.process = subprocess.Popen(args, pass_fds=fds, env=env, cwd=str(ROOT))
        for sock in there:
            sock.close()
        to_owner.close_fd()
        to_frontend.close_fd()
        self.link = FrontendLink(
            to_frontend, to_owner, self._on_message, self._on_lost, self._on_frame
        )
        await self.loop.connect_accepted_socket(lambda: self.link, infer_here)  # type: ignore
        quick = Connection(quick_here.detach())
        slow = Connection(slow_here.detach())
        quick.send(self.settings)  # the child's first read
        for connection, name in ((quick, "quick"), (slow, "slow")):
            threading.Thread(
                target=self._serve_control,
                args=(connection,),
                daemon=True,
                name=f"frontend-{self.index}-{name}-control",
            ).start()
        try:
            await asyncio.wait_for(self.ready.wait(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.failed = self.failed or f"not ready after {START_TIMEOUT_S:g} s"
        if self.failed:
            raise RuntimeError(f"frontend process {self.index} failed to start: {self.failed}")

    # ----- inference handed over --------------------------------------------------------
    def _on_frame(self, messages: list[tuple]) -> None:
        """The messages of one frame (what the frontend process sent in one loop turn): their
        requests are admitted together, one dispatch pass per model version at the end."""
        if len(messages) == 1:
            self._on_message(messages[0])
            return
        with admission_group():
            for message in messages:
                self._on_message(message)

    def _on_message(self, message: tuple) -> None:
        tag = message[0]
        if tag == INFER:
            ident = message[1]
            link = self.link

            def answer(response: Any, error: BaseException | None) -> None:
                self.inflight.pop(ident, None)
                if error is None:
                    link.send((RESULT, ident, pack_response(response)))  # type: ignore[union-attr]
                else:
                    link.send((ERROR, ident, as_server_error(error)))  # type: ignore[union-attr]

            # No task per request: the answer goes back from the future's callback. The core
            # reads shared-memory inputs and traces, as for a request received here.
            # message[3], when there: the endpoint a decoupled model's refusal names.
            try:
                future = self.core.infer_nowait(unpack_request(message[2]), answer, *message[3:])
            except Exception as exc:
                link.send((ERROR, ident, as_server_error(exc)))  # type: ignore[union-attr]
                return
            if future is not None and not future.done():
                self.inflight[ident] = future
        elif tag == CANCEL:
            future = self.inflight.pop(message[1], None)
            if future is not None:
                future.cancel()

    def _on_lost(self, exc: Exception | None) -> None:
        for future in list(self.inflight.values()):
            future.cancel()  # nobody is left to answer
        self.inflight.clear()
        if not self.stopping:
            self.failed = self.failed or "its link closed"
            self.ready.set()  # a start still waiting sees the failure

    # ----- control calls ----------------------------------------------------------------
    def _serve_control(self, connection: Connection) -> None:
        """Answer one control socket's calls, each on the event loop (a thread per socket, so
        a load in progress never holds up a health check)."""
        while True:
            try:
                ident, method, args = connection.recv()
            except (EOFError, OSError):
                return
            if method == "listening":  # the child's startup handshake
                self.loop.call_soon_threadsafe(self.ready.set)
                reply: tuple = (ident, True, None)
            elif method == "start_failed":
                self.failed = str(args[0])
                self.loop.call_soon_threadsafe(self.ready.set)
                reply = (ident, True, None)
            elif method not in CONTROL_METHODS:
                reply = (ident, False, InternalError(f"unknown control call '{method}'"))
            else:
                future = asyncio.run_coroutine_threadsafe(self._call(method, args), self.loop)
                try:
                    reply = (ident, True, future.result())
                except Exception as exc:
                    reply = (ident, False, as_server_error(exc))
            try:
                connection.send(reply)
            except (OSError, ValueError):
                return
            except Exception as exc:
                connection.send(
                    (
                        ident,
                        False,
                        InternalError(f"control call '{method}' could not be answered: {exc}"),
                    )
                )

    async def _call(self, method: str, args: tuple) -> Any:
        """A ControlAPI call (server/core/api.py) on the core; what cannot be pickled travels
        as what the frontend process needs of it."""
        if method == "resolve":  # a version travels as its input rules
            rules = self.core.input_rules(self.core.resolve(*args))
            return RemoteRules(rules.max_batch_size, dict(rules.inputs))
        if method == "model_config":  # a protobuf message travels as its serialized bytes
            return self.core.model_config(*args).SerializeToString()
        result = getattr(self.core, method)(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    # ----- shutdown ---------------------------------------------------------------------
    def notify_exiting(self) -> None:
        if self.link is not None:
            self.link.send((EXITING,))

    async def stop(self, grace: float) -> None:
        """Ask the child to close its listeners (it finishes what it is writing), then wait."""
        self.stopping = True
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), grace + 1.0)
        except asyncio.TimeoutError:
            process.kill()
            await asyncio.to_thread(process.wait)
        if self.link is not None:
            self.link.close()


class FrontendPool:
    """The extra frontend processes of one server, restarted when one dies."""

    def __init__(self, settings: ServerSettings, core: InferenceCore) -> None:
        self.settings = settings
        self.core = core
        self.children: list[FrontendProcess] = []
        self.stopping = False
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        count = self.settings.frontend_processes - 1
        self.children = [
            FrontendProcess(index, self.settings, self.core) for index in range(1, count + 1)
        ]
        await asyncio.gather(*(child.start() for child in self.children))
        if self.children:
            self._watch = asyncio.create_task(self._supervise())
        log.info("%d extra frontend process(es) accept on the same ports", len(self.children))

    async def _supervise(self) -> None:
        while not self.stopping:
            await asyncio.sleep(RESTART_DELAY_S)
            for position, child in enumerate(self.children):
                if self.stopping or child.process is None or child.process.poll() is None:
                    continue
                log.error(
                    "frontend process %d exited (code %s); starting it again",
                    child.index,
                    child.process.returncode,
                )
                if child.link is not None:
                    child.link.close()
                fresh = FrontendProcess(child.index, self.settings, self.core)
                self.children[position] = fresh
                try:
                    await fresh.start()
                except (RuntimeError, OSError) as exc:
                    log.error("%s", exc)

    def notify_exiting(self) -> None:
        for child in self.children:
            child.notify_exiting()

    async def stop(self, grace: float) -> None:
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        await asyncio.gather(*(child.stop(grace) for child in self.children))
