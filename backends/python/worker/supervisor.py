"""The first process of a Python model's worker: it runs the worker as its child, and ends every
process below it when the worker ends or the server goes (issue 28, item 11).

Why a process of its own: a model may start processes (subprocess, os.fork, a library's pool),
and they hold the worker's socket and tensor memory. The worker itself cannot be trusted to end
them: it is SIGKILLed by the kernel when the server is killed (it must die even inside a long
`execute`, and a Python signal handler would wait for the main thread to leave a C call), and
when it exits or is killed its children are re-parented and forgotten. This process runs no
model code, so it always answers at once:

- it is a child subreaper (PR_SET_CHILD_SUBREAPER): every orphan below it, even one in a new
  session (a daemon's double fork), is re-parented to it, so "below it" is the whole tree;
- its parent-death signal is SIGTERM, a signal it waits for (sigwaitinfo, nothing else to do):
  when the server goes, however it goes, it SIGKILLs the tree and exits;
- when the worker exits (a model's finalize, an unload, a crash, a kill) it SIGKILLs what is left
  below it and exits with the worker's status, so the server sees the worker's own exit;
- SIGTERM from the server (WorkerProcess.kill) does the same: the tree is killed, then it exits.

The worker (backends/python/worker/main.py) dies by SIGKILL when this process goes, so nothing
outlives it either. This process imports only the standard library; the worker is exec'd in its
child, so `ps` shows both for what they are.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from backends.python.worker.prctl import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

END_WAIT_S = 5.0  # killing the tree: how long to wait for the last processes to be reaped
WAITED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP}


def _below(root: int) -> list[int]:
    """Every process under `root` now, from /proc (parents before their children)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _reap(worker: int, status: list[int]) -> None:
    """Reap every child that has exited; the worker's status goes to `status`."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == worker:
            status.append(code)


def end_tree(worker: int, status: list[int]) -> None:
    """SIGKILL every process below this one, until none is left (or END_WAIT_S)."""
    deadline = time.monotonic() + END_WAIT_S
    while True:
        _reap(worker, status)
        left = _below(os.getpid())
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def exit_as(status: int) -> None:
    """Exit the way the worker did: its exit code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal this process cannot die of
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


WORKER_MODULE = "backends.python.worker.main"


def _split(argv: list[str]) -> tuple[str, int, int | None, list[str]]:
    """`[--module M] --fd N [--parent-pid P] [extra...]`: the worker's module (a Python model's
    by default; the NPU executor names its own), its socket, the server, and what else the
    worker is given (a label that `ps` shows)."""
    values: dict[str, str] = {}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        if item in ("--module", "--fd", "--parent-pid"):
            values[item] = next(items)
        else:
            rest.append(item)
    parent = values.get("--parent-pid")
    module = values.get("--module", WORKER_MODULE)
    return module, int(values["--fd"]), int(parent) if parent else None, rest


def main(argv: list[str] | None = None) -> int:
    """The worker's arguments (`--fd N --parent-pid P ...`), and `--module M`: what to run."""
    argv = sys.argv[1:] if argv is None else argv
    module, fd, parent, rest = _split(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # never auto-reaped: we wait for the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the server decides
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)  # kept pending for sigwaitinfo
    supervised = (
        sys.platform.startswith("linux")
        and prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        and prctl(PR_SET_CHILD_SUBREAPER, 1)
    )
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # orphaned already: nobody will ever send us work
    if not supervised:  # neither is available: be the worker, which watches its parent itself
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        import importlib

        worker_args = ["--fd", str(fd)] + (["--parent-pid", str(parent)] if parent else [])
        return int(importlib.import_module(module).main(worker_args + rest))
    me = os.getpid()
    worker = os.fork()
    if worker == 0:  # the worker, a fresh interpreter (and named as such in `ps`)
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.set_inheritable(fd, True)
            os.execv(
                sys.executable,
                [
                    sys.executable,
                    "-m",
                    module,
                    "--fd",
                    str(fd),
                    "--parent-pid",
                    str(me),
                    *rest,
                ],
            )
        finally:
            os._exit(127)
    os.close(fd)  # the worker's socket is the worker's alone: its end-of-file is its exit
    status: list[int] = []
    while not status:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGCHLD:
            _reap(worker, status)
            continue
        # The server went (the parent-death signal) or asks us to kill the worker.
        end_tree(worker, status)
        if not status:  # a worker that does not die of SIGKILL cannot be; be thorough
            _, code = os.waitpid(worker, 0)
            status.append(code)
    end_tree(worker, status)
    exit_as(status[0])
    return 1


if __name__ == "__main__":
    sys.exit(main())
