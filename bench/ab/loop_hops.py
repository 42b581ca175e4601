"""The two hops issue 27 removed, each measured alone in one process, old way against new.

Why: the served A/B (python_model_ab.py) needs a quiet machine to show a 15-25 µs change per
batch; these loops isolate each hop so that the old and new way run interleaved in the same
minutes and only the hop differs. Pin the process (its worker inherits the pin) for figures
comparable with the served ones:

    taskset -c 0 .venv/bin/python -m bench.ab.loop_hops [--rounds 6] [--count 3000]

1. A Python model's batch (`bench/models/py_add`, one request of [1, 16]) through a real
   worker: on the instance thread (the old way) against begun on the loop
   (`Backend.begin_requests`). Server and worker CPU per batch, voluntary context switches of
   the whole process tree per batch, wall time per batch.
2. A 100 µs moment (the batcher's queue delay) on uvloop: the fine timer thread against the
   loop's timerfd (`scheduler/clock.py`). CPU, switches and wall time per moment.
Medians over the rounds; every round is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import uvloop

from backends.python.backend import PythonBackend
from bench.cpu_time import process_cpu, process_tree, tree_switches
from protocol.types import InferRequest, Tensor
from repository.config import normalize, parse_config_text
from scheduler.clock import MonotonicClock
from scheduler.interface import VersionSpec
from scheduler.pool import BatchRun, Instance, InstancePool

ROOT = Path(__file__).resolve().parents[2]
Figures = tuple[float, float, float]  # CPU µs, switches, wall µs, per operation


async def measured(count: int, run: Callable[[int], Awaitable[None]]) -> Figures:
    """`run(count)`'s process-tree CPU, switches and wall time, per operation."""
    me = os.getpid()
    pids = process_tree(me)
    cpu, switches, wall = sum(map(process_cpu, pids)), tree_switches(me), time.perf_counter()
    await run(count)
    cpu = sum(map(process_cpu, pids)) - cpu
    switches = tree_switches(me) - switches
    return 1e6 * cpu / count, switches / count, 1e6 * (time.perf_counter() - wall) / count


def _settle(answer: asyncio.Future[BatchRun], ran: BatchRun) -> None:
    answer.set_result(ran)


def _request() -> InferRequest:
    data = np.ones((1, 16), np.float32)
    inputs = [Tensor(name, "FP32", (1, 16), data) for name in ("INPUT0", "INPUT1")]
    return InferRequest("py_add", batch_size=1, arrival_ns=0, inputs=inputs)


async def batches(rounds: int, count: int, report: Callable[[str], None]) -> dict[str, Figures]:
    with tempfile.TemporaryDirectory() as folder:
        model_dir = Path(folder) / "py_add"
        shutil.copytree(ROOT / "bench" / "models" / "py_add", model_dir)
        config_path = model_dir / "config.pbtxt"
        config = parse_config_text(config_path.read_text(), config_path)
        normalize(config, "py_add", model_dir, [model_dir / "1"])
        spec = VersionSpec("py_add", 1, config, model_dir, model_dir / "1", PythonBackend)
        pool = InstancePool(spec, MonotonicClock())
        await pool.load()
        acquired = pool.acquire()
        assert acquired is not None
        instance: Instance = acquired
        loop = asyncio.get_running_loop()

        async def run(n: int, on_loop: bool) -> None:
            instance._begins = on_loop  # the switch Instance.load sets for such a backend
            for _ in range(n):
                answer: asyncio.Future[BatchRun] = loop.create_future()
                instance.execute([_request()], [1], _settle, answer)
                if not (await answer).executed:
                    raise RuntimeError("the model failed")

        ways = {"instance thread": False, "begun on the loop": True}
        results = await _rounds(rounds, count, ways, run, "batch", report)
        pool.release(instance)
        await pool.unload()
        return results


async def moments(rounds: int, count: int, report: Callable[[str], None]) -> dict[str, Figures]:
    clocks = {True: MonotonicClock(), False: MonotonicClock(use_timerfd=False)}
    loop = asyncio.get_running_loop()

    async def run(n: int, timerfd: bool) -> None:
        clock = clocks[timerfd]
        for _ in range(n):
            due: asyncio.Future[None] = loop.create_future()
            clock.call_at(clock.now_ns() + 100_000, functools.partial(due.set_result, None))
            await due

    ways = {"fine timer thread": False, "timerfd on the loop": True}
    return await _rounds(rounds, count, ways, run, "100 µs moment", report)


async def _rounds(
    rounds: int,
    count: int,
    ways: dict[str, bool],
    run: Callable[[int, bool], Awaitable[None]],
    unit: str,
    report: Callable[[str], None],
) -> dict[str, Figures]:
    for flag in ways.values():  # warm up both
        await run(200, flag)
    seen: dict[str, list[Figures]] = {name: [] for name in ways}
    for round_no in range(1, rounds + 1):
        for name, flag in ways.items():

            def one_way(n: int, flag: bool = flag) -> Awaitable[None]:
                return run(n, flag)

            figures = await measured(count, one_way)
            seen[name].append(figures)
            report(
                f"round {round_no} {name}: {figures[0]:.0f} µs CPU, {figures[1]:.2f} switches, "
                f"{figures[2]:.0f} µs wall per {unit}"
            )
    return {
        name: (
            statistics.median(f[0] for f in rows),
            statistics.median(f[1] for f in rows),
            statistics.median(f[2] for f in rows),
        )
        for name, rows in seen.items()
    }


async def main_async(rounds: int, count: int) -> list[str]:
    lines = ["| hop | way | CPU µs | switches | wall µs |", "|---|---|---:|---:|---:|"]
    for label, study in (("Python-model batch", batches), ("100 µs moment", moments)):
        for name, (cpu, switches, wall) in (await study(rounds, count, print)).items():
            lines.append(f"| {label} | {name} | {cpu:.0f} | {switches:.2f} | {wall:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=3000, help="operations per round and way")
    args = parser.parse_args(argv)
    print("\n".join(uvloop.run(main_async(args.rounds, args.count))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
