"""The server's handle on one worker process: spawn it, talk to it, notice when it dies.

Every call is a strict request/reply on the socket, made from the instance's own thread, so
the arenas are never written while the other side reads them. Messages that are not replies
(decoupled responses, BLS requests, custom metrics) go to the backend's `on_message`, on
whichever thread reads the channel; their tensors travel in the rings (wire/ring.py). When the
process dies the socket reports end-of-file (or is severed by the supervisor), and the pending call
raises WorkerDied at once. Workers die with the server: the kernel signals them when it goes (see
_Spawner), and end_workers() kills those still running at its exit deadline.

What the server starts is the worker's supervisor (worker/supervisor.py), in a process group of
its own; the model runs in its child. The supervisor ends every process below it (whatever the
model started) when the worker ends, when it is told to (kill), and when the server goes. Once it
has exited, and before it is reaped (so its pid, the group's id, cannot be reused), whatever is
left in its group is SIGKILLed too: a backstop should the supervisor itself have been killed.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from backends.python.wire.channel import Channel
from backends.python.wire.framing import ArenaReader, ArenaWriter, ChannelClosed
from backends.python.wire.ring import RingReader, RingWriter

KILL_WAIT_S = 10.0  # a killed worker's supervisor ends its tree and exits within this

# The folder holding the `backends` package and the pb_utils module, for the worker's sys.path.
_ROOT = Path(__file__).resolve().parents[3]
# What a worker runs (`python -m ...`): a Python model's; the NPU executor passes its own.
WORKER_MODULE = "backends.python.worker.main"


class WorkerDied(Exception):
    """The worker process exited (or was killed) before answering."""

    def __init__(self, detail: str, before_send: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        # It was gone before the message left: the work never started and may be retried.
        self.before_send = before_send


class WorkerReplyError(Exception):
    """The worker answered with an error (the model raised); the message says what, and
    `reply` is the whole answer (a worker may say more, e.g. the NPU executor's error kind)."""

    def __init__(self, message: str, reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reply: Mapping[str, Any] = reply or {}


class Outputs(dict):
    """One request's output arrays, with the response parameters the model set (a plain
    dict when it set none)."""

    parameters: dict | None = None


# One request's result: its output arrays, or (TritonError code, message) from the model.
Result = dict[str, np.ndarray] | Outputs | tuple[int, str]
# Called with each message that is not a reply, and its file descriptors.
MessageHandler = Callable[["WorkerProcess", dict, list[int]], None]


def describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"  # model prints reach the server log as they happen
    return env


class _Spawner:
    """Starts every worker process from one thread that lives as long as the server.

    A worker's supervisor asks the kernel to signal it when its parent goes (PR_SET_PDEATHSIG,
    in worker/supervisor.py), and Linux sends that signal when the *thread* that forked it
    ends, not the process. Forking from one long-lived daemon thread ties each worker to the server
    process itself, whichever thread (instance, supervisor, executor) asked for it. The
    thread is first started by a load (an instance or executor thread, which hold the
    process's whole CPU set), so workers never inherit the event loop's CPU pin."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], Any]) -> Any:
        future: Future = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="python-worker-spawner", daemon=True
                )
                self._thread.start()
        self._jobs.put((job, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            job, future = self._jobs.get()
            try:
                future.set_result(job())
            except BaseException as exc:
                future.set_exception(exc)
            del job, future


_spawner = _Spawner()
# Every worker not closed yet, so the server can end them at its exit deadline.
live_workers: set[WorkerProcess] = set()
_live_lock = threading.Lock()
_ended = False


def end_workers() -> int:
    """Kill every worker still running and refuse to start new ones: the server's exit
    deadline has passed (or the interpreter exits), and a model's `execute` still running
    must not outlive the server. Returns how many were killed."""
    global _ended
    with _live_lock:
        _ended = True
        workers = list(live_workers)
    killed = 0
    for worker in workers:
        if worker.process.poll() is None:
            worker.kill()
            killed += 1
    return killed


def workers_ended() -> bool:
    """True once end_workers() ran: a worker that dies now is not restarted."""
    return _ended


atexit.register(end_workers)


def _packed_end(groups: list[list[Any]]) -> int:
    """Where the last tensor of a pack's groups ends (refs: name, dtype, shape, offset,
    nbytes; groups are packed in order, so the last non-empty one holds it)."""
    for group in reversed(groups):
        if group:
            ref = group[-1]
            return int(ref[3] + ref[4])
    return 0


class WorkerProcess:
    """One worker (`python -m backends.python.worker.supervisor`, which runs
    `backends.python.worker.main` as its child) and its socket and arenas."""

    def __init__(
        self,
        process: subprocess.Popen,
        sock: socket.socket,
        on_message: MessageHandler | None = None,
        pumped: bool = False,
        owns_process: bool = True,
    ) -> None:
        self.process = process
        # False: one of several channels into a process another WorkerProcess owns (the NPU
        # executor's per-instance channels); closing it leaves the process running.
        self.owns_process = owns_process
        self._sock = sock
        self._on_message = on_message
        # Without a pump (a model that is not decoupled) only calls read the socket, one at a
        # time under the call lock: the channel need not take turns.
        self._channel = Channel(sock, self._route, shared=pumped)
        self.ring = RingReader()  # the worker's ring: decoupled responses, BLS inputs
        self.answers = RingWriter(grow_when_full=True)  # ours: BLS answers (never waits)
        self._inputs = ArenaWriter()
        self._outputs = ArenaReader()
        # Held for a whole call, so close() (from the supervisor) never pulls the socket out
        # from under a call in progress; sever() first wakes such a call.
        self._call_lock = threading.RLock()
        self._closed = False
        # The loop's watch on the socket (`_start_watch`) and the answer of the batch begun
        # from the loop that it waits for (None between batches); both the loop's only.
        self._watch: socket.socket | None = None
        self._on_reply: Callable[[list[Result] | Exception], None] | None = None

    @classmethod
    def spawn(
        cls,
        on_message: MessageHandler | None = None,
        pumped: bool = False,
        module: str = WORKER_MODULE,
        extra_args: Sequence[str] = (),
    ) -> WorkerProcess:
        """Start a worker (from the spawner thread). It dies with the server: by the parent-death
        signal if the server is killed, by end_workers() at a hard-deadline exit. `pumped`:
        a thread will run `pump` (a decoupled model), so calls share the socket with it.
        `module`: what the process runs; it takes `--fd N --parent-pid P` and serves the
        socket; `extra_args` follow (e.g. a label that `ps` shows)."""
        return _spawner.run(lambda: cls._spawn(on_message, pumped, module, extra_args))

    @classmethod
    def _spawn(
        cls,
        on_message: MessageHandler | None,
        pumped: bool,
        module: str,
        extra_args: Sequence[str] = (),
    ) -> WorkerProcess:
        with _live_lock:
            if _ended:
                raise WorkerDied("was not started: the server is shutting down", before_send=True)
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "backends.python.worker.supervisor",
                        "--module",
                        module,
                        "--fd",
                        str(child.fileno()),
                        "--parent-pid",
                        str(os.getpid()),
                        *extra_args,
                    ],
                    pass_fds=(child.fileno(),),
                    env=_worker_env(),
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own group (the backstop above); Ctrl-C skips it
                )
            except BaseException:
                parent.close()
                raise
            finally:
                child.close()
            worker = cls(process, parent, on_message, pumped)
            live_workers.add(worker)
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    # ----- calls -------------------------------------------------------------------------

    def _route(self, message: dict[str, Any], fds: list[int]) -> str | None:
        if "op" not in message:
            return "reply"
        if self._on_message is not None:
            self._on_message(self, message, fds)
        else:
            for fd in fds:
                os.close(fd)
        return None

    def pump(self) -> None:
        """Read and hand on the worker's messages until it goes (a decoupled model's reader
        thread: its responses arrive while no call waits). Only for a worker spawned
        `pumped`."""
        try:
            self._channel.wait("never")
        except (ChannelClosed, OSError, TimeoutError):
            pass

    def post(
        self, message: dict[str, Any], tensors: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Send a message that has no reply (an ack, a cancellation, a BLS answer), with its
        tensors in our ring. Any thread; never waits for the worker. OSError once closed."""
        if self._closed:
            raise ConnectionError("the worker's channel is closed")
        with self._channel.send_lock:
            fds: Sequence[int] = ()
            if tensors is not None:
                refs, end, new_fd = self.answers.pack(tensors)
                message = {**message, "refs": refs, "end": end}
                fds = [new_fd] if new_fd is not None else ()
            self._channel.send_locked(message, fds)

    def take(self, refs: list, end: int, fds: list[int]) -> dict[str, np.ndarray]:
        """On the reading thread: copies of a message's tensors out of the worker's ring."""
        if fds:
            self.ring.adopt(fds[0])
            for extra in fds[1:]:
                os.close(extra)
        return self.ring.take(refs, end)

    def call(
        self, message: Mapping[str, Any], fds: Sequence[int] = (), timeout: float | None = None
    ) -> tuple[dict[str, Any], list[int]]:
        """Send one message and wait for its reply; WorkerDied if the process goes first."""
        sent = False
        try:
            with self._call_lock:
                if self._closed or self.process.poll() is not None:
                    raise ChannelClosed("closed")
                self._channel.send(message, fds)
                sent = True
                return self._channel.wait("reply", timeout)
        except TimeoutError:
            self.kill()
            raise WorkerDied(f"did not answer '{message.get('op')}' within {timeout:g} s") from None
        except (ChannelClosed, OSError):
            raise WorkerDied(describe_exit(self._exit_code()), before_send=not sent) from None

    def initialize(
        self,
        model_file: Path,
        version_dir: Path,
        args: Mapping[str, str],
        timeout: float | None,
        stream: Mapping[str, Any] | None = None,
    ) -> None:
        reply, _ = self.call(
            {
                "op": "init",
                "model_file": str(model_file),
                "version_dir": str(version_dir),
                "args": dict(args),
                "stream": dict(stream or {}),
            },
            timeout=timeout,
        )
        if not reply.get("ok"):
            raise WorkerReplyError(reply.get("error", "initialize failed"))

    def auto_complete(
        self, model_file: Path, version_dir: Path, config: dict, timeout: float | None
    ) -> dict:
        reply, _ = self.call(
            {
                "op": "auto_complete",
                "model_file": str(model_file),
                "version_dir": str(version_dir),
                "config": config,
            },
            timeout=timeout,
        )
        if not reply.get("ok"):
            raise WorkerReplyError(reply.get("error", "auto_complete_config failed"))
        return reply["config"]

    def execute(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        rids: Sequence[int] | None = None,
        details: Mapping[str, list] | None = None,
    ) -> list[Result]:
        """Run one list of requests; each result is its outputs or the model's error for it.
        `rids`: a decoupled model's requests, answered through messages. `details`: the
        per-request lists a model's accessors read ("requested", "meta", "sequence"), only
        those some request needs (backend.py). Raises WorkerReplyError when the model's execute
        raised (the whole list failed). Only ever called from one thread at a time (the
        instance's), like the arenas' use."""
        with self._call_lock:
            if self._closed:
                raise WorkerDied(describe_exit(self._exit_code()), before_send=True)
            refs, new_fd = self._inputs.pack(requests)
            message: dict[str, Any] = {
                "op": "execute",
                "requests": refs,
                "outputs": list(output_names),
            }
            if rids is not None:
                message["rids"] = list(rids)
            if details:
                message.update(details)
            reply, fds = self.call(message, [new_fd] if new_fd is not None else ())
            if rids is not None and reply.get("ok"):
                return []  # decoupled: the responses come as messages
            for extra in fds[1:]:
                os.close(extra)
            if fds:
                self._outputs.adopt(fds[0])
            results = self._results(reply)
        return results

    def begin_execute(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        details: Mapping[str, list] | None,
        on_reply: Callable[[list[Result] | Exception], None],
    ) -> bool:
        """`execute` from the event loop, for a worker that is not pumped: send the list, let
        the loop watch the socket, and call `on_reply` there with the results, the
        WorkerReplyError, or ChannelClosed when the worker went (what to make of that may
        wait, so it is left to the caller's thread). No thread waits for the worker, so a
        batch costs no hop to the instance thread and back. The call lock is held until the
        reply, as for `execute`. False, with nothing sent, when this cannot be done now (a
        call in progress, the worker gone or going): the caller uses `execute`."""
        if self._channel.shared or not self._call_lock.acquire(blocking=False):
            return False
        try:
            # `returncode`, not poll(): a system call per batch; a worker that died unreaped
            # shows as a send that fails or a reply that never comes (end-of-file), as here.
            if self._closed or self.process.returncode is not None:
                self._call_lock.release()
                return False
            loop = asyncio.get_running_loop()
            refs, new_fd = self._inputs.pack(requests)
            message: dict[str, Any] = {
                "op": "execute",
                "requests": refs,
                "outputs": list(output_names),
            }
            if details:
                message.update(details)
            if self._watch is None:
                self._start_watch(loop)
            self._channel.untimed()
            self._on_reply = on_reply
        except BaseException:
            self._on_reply = None
            self._call_lock.release()
            return False
        try:
            self._channel.send(message, [new_fd] if new_fd is not None else ())
        except BaseException:  # the worker is gone: `execute` finds that out and says so
            self._on_reply = None
            self._call_lock.release()
            return False
        return True

    def _start_watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the loop watch the socket, for this and every later batch begun from it.

        The loop watches a duplicate of the socket's descriptor, which only the loop closes
        (`_end_watch`): closing the socket from another thread then cannot leave the loop
        watching a number the next socket reuses. uvloop makes a watched descriptor
        non-blocking, and the duplicate shares that flag with the socket, so it is set back:
        threads still read and write the socket blocking, and the loop reads with
        MSG_DONTWAIT (`Receiver.recv_nowait`). Watching once, not per batch, saves uvloop's
        poll handle and about ten system calls a batch (bench/FINDINGS.md 37)."""
        watch = self._sock.dup()
        try:
            loop.add_reader(watch.fileno(), self._readable, loop)
            os.set_blocking(watch.fileno(), True)
        except BaseException:
            watch.close()
            raise
        self._watch = watch

    def _end_watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: stop watching the socket and close the duplicate."""
        watch = self._watch
        if watch is not None:
            self._watch = None
            loop.remove_reader(watch.fileno())
            watch.close()

    def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop, when the socket has bytes: route what arrived; on the reply, read the
        outputs, free the call lock and answer. With no batch of the loop's in progress (a
        call on a thread reads its own reply; the worker went while idle) the loop stops
        watching, so it does not spin on bytes that are not its to read; the next batch
        watches again."""
        on_reply = self._on_reply
        if on_reply is None:
            self._end_watch(loop)
            return
        receiver = self._channel.receiver
        outcome: list[Result] | Exception
        try:
            while True:
                got = receiver.recv_nowait()
                if got is None:
                    return  # the rest comes with a later wake-up
                message, fds = got
                if self._route(message, fds) == "reply":
                    break
            for extra in fds[1:]:
                os.close(extra)
            if fds:
                self._outputs.adopt(fds[0])
            try:
                outcome = self._results(message)
            except WorkerReplyError as exc:
                outcome = exc
        except (ChannelClosed, OSError) as exc:
            outcome = ChannelClosed(str(exc))
            self._end_watch(loop)
        except Exception as exc:  # a reply that cannot be read: the call fails, not the loop
            outcome = WorkerReplyError(f"unreadable reply from the worker: {exc}")
        self._on_reply = None
        self._call_lock.release()
        on_reply(outcome)

    def exit_detail(self) -> str:
        """How the process ended, for a call that saw its channel close (may wait up to a
        second for the exit: not on the loop)."""
        return describe_exit(self._exit_code())

    def _results(self, reply: dict[str, Any]) -> list[Result]:
        if not reply.get("ok"):
            raise WorkerReplyError(reply.get("error", "execute failed"), reply)
        results: list[Result] = []
        params = reply.get("params")  # only when some response set parameters
        copy = self._outputs.copier(_packed_end(reply["outputs"]))
        for index, (group, error) in enumerate(
            zip(reply["outputs"], reply["errors"], strict=False)
        ):
            if error is not None:
                results.append((int(error[0]), str(error[1])))
                continue
            outputs = {ref[0]: copy(ref) for ref in group}
            if params and params[index]:
                outputs = Outputs(outputs)
                outputs.parameters = params[index]
            results.append(outputs)
        return results

    def finalize(self, timeout: float) -> None:
        """Ask the model to finalize and the process to exit; kill it if it does not."""
        try:
            self.call({"op": "finalize"}, timeout=timeout)
        except WorkerDied:
            pass
        finally:
            self.close(timeout)

    # ----- process control ---------------------------------------------------------------

    def wait(self) -> int:
        """Block until the process exits; returns its exit code (negative: signal)."""
        if self.process.returncode is None:
            try:
                os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # reaped already (by another thread)
                pass
            else:
                self._end_group()
        return self.process.wait()

    def _exited_within(self, timeout: float) -> bool:
        """Whether the process exited within `timeout` s (not reaping it; see _end_group)."""
        deadline = time.monotonic() + timeout
        while self.process.returncode is None:
            try:
                info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is not None:
                self._end_group()
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        self.process.wait()
        return True

    def _end_group(self) -> None:
        """SIGKILL what is left in the worker's process group; called once the supervisor has
        exited and before it is reaped, while the group's id is still its own."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def sever(self) -> None:
        """Wake any call blocked on the socket (a grandchild may still hold the other end)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._channel.close()

    def kill(self) -> None:
        """End the worker now: its supervisor SIGKILLs it and every process below it, then exits
        as the worker did (killed by SIGKILL). Never waits."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Close the channel (the worker exits on end-of-file), then make sure it is gone."""
        self.sever()
        with self._call_lock:
            self._closed = True
            self._sock.close()
            self._inputs.close()
            self.answers.close()
        if not self.owns_process:
            self._outputs.close()
            return
        if not self._exited_within(timeout):
            self.kill()
            if not self._exited_within(KILL_WAIT_S):  # a supervisor that does not answer
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with _live_lock:
            live_workers.discard(self)
        self._outputs.close()

    def _exit_code(self) -> int | None:
        try:
            return self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None
