"""The parser processes of one HTTP frontend: a small pool of our own, not multiprocessing's.

Why not `ProcessPoolExecutor` over a forkserver (what parsed large bodies before, issue 28 item
8): its processes outlived a SIGKILLed server. Each forkserver worker holds the write end of the
forkserver's "alive" pipe and of the resource tracker's pipe, and a writer end of its own call
queue, so none of them ever sees end-of-file; the workers died with the forkserver
(PR_SET_PDEATHSIG), the forkserver waited for the workers, and the resource tracker for both.

Here each parser process is `python -m server.http.parser_pool`, started with `subprocess` and
one socket to us (no other descriptor: `close_fds`), owned by one thread of this process that
sends it one job at a time and waits for the answer. It asks the kernel to SIGKILL it when that
thread ends (PR_SET_PDEATHSIG fires when the thread that forked it ends, or the whole process
when it is killed), checks its parent right after, and exits on end-of-file of its socket. So it
ends with the server however the server ends, and with the pool when the pool closes. A process
that dies is started again by its thread for the next job; the job it was running fails alone.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from backends.python.worker.prctl import PR_SET_PDEATHSIG, prctl
from protocol.text import DEFAULT_ECHO_CHARS, set_echo_limit

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the `server` package
STOP_WAIT_S = 5.0  # a closed pool's process has this long to exit before it is killed

_Job = tuple[Future, Callable[..., Any], tuple]


class ParserPool:
    """`processes` parser processes at CPU priority `nice`, started at once, each importing
    `preload` (the module of the jobs) before its first job."""

    def __init__(
        self, processes: int, nice: int, preload: str, echo_chars: int = DEFAULT_ECHO_CHARS
    ) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._slots = [
            _Slot(self._jobs, nice, preload, echo_chars, index) for index in range(processes)
        ]

    def submit(self, job: Callable[..., Any], *args: Any) -> Future:
        """Run `job(*args)` in a parser process: `job` is a module-level function (it travels
        by name) and its arguments and result travel pickled."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the parser processes are closed")
            self._jobs.put((future, job, args))
        return future

    def start(self) -> None:
        """Wait until every process has been started (each slot starts its own at once)."""
        for slot in self._slots:
            slot.started.wait()

    def close(self) -> None:
        """Cancel what waits; each process exits after its job in progress (never waits)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._slots:
                self._jobs.put(None)

    def pids(self) -> list[int]:
        """The processes running now (for tests and diagnostics)."""
        return [pid for slot in self._slots if (pid := slot.pid()) is not None]


class _Slot:
    """One parser process and the thread that starts it, feeds it, and starts it again."""

    def __init__(
        self,
        jobs: queue.SimpleQueue[_Job | None],
        nice: int,
        preload: str,
        echo_chars: int,
        index: int,
    ) -> None:
        self._jobs = jobs
        self._nice = nice
        self._echo_chars = echo_chars
        self._preload = preload
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"http-parser-{index}", daemon=True
        )
        self._thread.start()

    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def _serve(self) -> None:
        try:
            self._spawn()
        except OSError as exc:
            log.error("could not start a parser process: %s", exc)
        self.started.set()
        while (item := self._jobs.get()) is not None:
            future, job, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = self._call(job, args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del item, future, job, args
        self._stop()

    def _spawn(self) -> None:
        """Start the process from this thread, which lives as long as the pool (see above)."""
        self._discard()
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "server.http.parser_pool",
                    "--fd",
                    str(there.fileno()),
                    "--parent-pid",
                    str(os.getpid()),
                    "--nice",
                    str(self._nice),
                    "--preload",
                    self._preload,
                    "--echo-chars",  # the server's --max-echo-chars, for errors made there
                    str(self._echo_chars),
                ],
                pass_fds=(there.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            here.close()
            raise
        finally:
            there.close()
        self._connection = Connection(here.detach())

    def _call(self, job: Callable[..., Any], args: tuple) -> Any:
        if self._connection is None or self._process is None or self._process.poll() is not None:
            self._spawn()
        assert self._connection is not None
        try:
            self._connection.send((job, args))
        except (OSError, EOFError):  # it died while idle: nothing ran, so once more
            self._spawn()
            assert self._connection is not None
            self._connection.send((job, args))
        try:
            ok, value = self._connection.recv()
        except (OSError, EOFError):
            self._discard()
            raise BrokenProcessPool("a parser process died") from None
        if ok:
            return value
        raise value

    def _discard(self) -> None:
        """Forget the process: close its socket (it exits on end-of-file) and reap it."""
        connection, self._connection = self._connection, None
        process, self._process = self._process, None
        if connection is not None:
            connection.close()
        if process is not None:
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _stop(self) -> None:
        self._discard()


# --------------------------------------------------------------------------- the process


def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the thread that started us ends (Linux); gone already: exit."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _answer(connection: Connection, job: Callable[..., Any], args: tuple) -> None:
    try:
        reply: tuple[bool, Any] = (True, job(*args))
    except BaseException as exc:
        reply = (False, exc)
    try:
        connection.send(reply)
    except (OSError, EOFError):
        raise
    except Exception as exc:  # a result or an error that does not pickle
        from protocol.errors import InternalError

        connection.send((False, InternalError(f"a parser process could not answer: {exc}")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascend-serve parser process")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--preload", default="")
    parser.add_argument("--echo-chars", type=int, default=DEFAULT_ECHO_CHARS)
    args = parser.parse_args(argv)
    set_echo_limit(args.echo_chars)
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the server decides
    try:
        os.nice(args.nice)
    except OSError:
        pass
    if args.preload:  # what every job needs, imported before the first
        importlib.import_module(args.preload)

    connection = Connection(args.fd)
    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            return 0
        try:
            job, job_args = pickle.loads(message)
        except Exception as exc:  # a job this process cannot rebuild: the caller hears why
            job, job_args = _raise, (exc,)
        del message
        try:
            _answer(connection, job, job_args)
        except (EOFError, OSError):
            return 0
        del job, job_args


def _raise(exc: BaseException) -> None:
    raise exc


if __name__ == "__main__":
    sys.exit(main())
