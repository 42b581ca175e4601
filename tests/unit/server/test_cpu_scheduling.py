"""server/cpu_scheduling.py: `batch` puts every thread the process has under SCHED_BATCH, and
what starts later inherits it; `normal` and a policy set from outside are left alone; the GIL's
switch interval is the setting's, in this process and a child forked from it. Each case runs in
a fresh interpreter, so the test process keeps its own policy and interval."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from server.cli import settings_from_args
from server.cpu_scheduling import apply_thread_scheduling

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")

PROBE = """
import os, subprocess, sys, threading
from server.cpu_scheduling import apply_thread_scheduling

started = threading.Event()
before = threading.Thread(target=started.wait, daemon=True)  # a thread that exists already
before.start()
{prepare}
said = apply_thread_scheduling({policy!r})
threads = {{os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}}
later = []
after = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
after.start(); after.join()
child = subprocess.run(
    [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
    capture_output=True, text=True, check=True,
)
started.set()
print(said, sorted(threads), later[0], int(child.stdout))
"""


def probe(policy: str, prepare: str = "") -> list[str]:
    code = textwrap.dedent(PROBE).format(policy=policy, prepare=prepare)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()


@linux_only
def test_batch_reaches_every_thread_and_what_starts_later() -> None:
    batch = str(os.SCHED_BATCH)
    assert probe("batch") == ["batch", f"[{batch}]", batch, batch]


@linux_only
def test_normal_leaves_the_default() -> None:
    other = str(os.SCHED_OTHER)
    assert probe("normal") == ["normal", f"[{other}]", other, other]


@linux_only
def test_a_policy_set_from_outside_is_left_as_it_is() -> None:
    idle = os.SCHED_IDLE
    prepare = f"os.sched_setscheduler(0, {idle}, os.sched_param(0))"
    said = probe("batch", prepare)
    assert said[:3] == ["left", "as", "set"]
    assert said[-1] == str(idle)  # the child inherits the main thread's SCHED_IDLE


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown thread scheduling 'fifo'"):
        apply_thread_scheduling("fifo")


SWITCH_PROBE = """
import os, sys
from server.cpu_scheduling import apply_switch_interval

apply_switch_interval({us})
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, str(round(sys.getswitchinterval() * 1e6)).encode())
    os._exit(0)
os.waitpid(child, 0)
print(round(sys.getswitchinterval() * 1e6), os.read(read, 32).decode())
"""


def test_the_switch_interval_is_set_here_and_kept_by_a_forked_child() -> None:
    code = textwrap.dedent(SWITCH_PROBE).format(us=300)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["300", "300"]


def test_the_switch_interval_defaults_to_500_us_and_is_bounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert settings_from_args(["--model-repository", "/tmp"]).gil_switch_interval_us == 500
    given = ["--model-repository", "/tmp", "--gil-switch-interval", "2000"]
    assert settings_from_args(given).gil_switch_interval_us == 2000
    refusals = {
        "49": "must be from 50 to 100000, got '49'",
        "100001": "must be from 50 to 100000, got '100001'",
        "0": "must be greater than 0, got '0'",
        "half": "expected an integer, got 'half'",
    }
    for bad, said in refusals.items():
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", "--gil-switch-interval", bad])
        assert f"argument --gil-switch-interval: {said}" in capsys.readouterr().err
