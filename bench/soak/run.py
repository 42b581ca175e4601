"""Soak and chaos, bounded and repeatable (issue #13, item 11).

    .venv/bin/python -m bench.soak.run --seconds 1800                 # the long version
    .venv/bin/python -m bench.soak.run --seconds 60 --negative-control-seconds 20   # make test's

Loopback only (every socket is 127.0.0.1), bounded in time (`--seconds` of chaos, plus a few
seconds of start, warm-up and settling), repeatable (`--seed`: every random choice, the models
each client picks, the waits, which worker dies, comes from seeded generators; the timing of the
machine does not).

One run: build a repository in a temporary directory (ONNX `simple` from
examples/build_repository.py and bench/models/py_add, each twice: a stable copy that is never
unloaded and a `*_cycle` copy that is unloaded and loaded again and again; with `--leak`, also
bench/soak/models/py_leak, the deliberately leaking model), start the server in explicit
model-control mode on free 127.0.0.1 ports, warm it up with every kind of traffic, let it
settle and sample the server's process tree (the server and its Python workers): RSS (summed),
open descriptors (/proc/<pid>/fd), threads, memfd arenas, and the /dev/shm entries. Then, for
`--seconds`:

- HTTP and gRPC inference clients (tritonclient), each on its own thread, picking a model per
  call and checking every answer's values;
- a cycler unloading and loading the `*_cycle` models (explicit load/unload API, HTTP and gRPC);
- a disconnecter: raw HTTP requests abandoned after the request, half way through the body or
  with a reset, and gRPC calls cancelled or given a deadline that expires mid-request;
- a killer: SIGKILL to a Python worker process (a child of the server pid) every few seconds;
  the server restarts it (the soak's copies raise `max_worker_crashes` so it never gives up);
- a sampler, a few times along the way, for the trend.

Then everything stops, the cycled models are loaded again, every model must be ready, the
server settles, and the tree is sampled again. Verdicts (PASS/FAIL):

- growth of each resource, after - before, against its threshold (`--max-*-growth`);
- no request lost: every inference call of the steady clients either succeeded with the right
  values or got a documented error: 503 / UNAVAILABLE for a `*_cycle` model while it is
  unloaded or reloading, 503 / UNAVAILABLE from a Python model whose worker was killed under it
  or is restarting. Anything else (another status, a wrong answer, a timeout, a dropped
  connection) is a lost request. The stable ONNX model must never fail;
- the server stayed up, every load and unload was answered (a load fails only when its worker
  was killed during initialize), every kill of py_add's worker was restarted and counted in
  `ascend_python_worker_restarts_total`, its log has no traceback (grpcio's own log of a
  response to a just-cancelled call failing in its core is counted apart, not a failure), and
  no process of the tree outlives the server.

The negative control: `--leak` serves py_leak beside the others and sends it traffic; it keeps
memory and a descriptor per request, so the RSS and descriptor verdicts must FAIL (exit 1).
`--negative-control-seconds N` runs that after the clean run and exits 0 only when the clean run
passed and the leak was caught. A JSON report goes to `--report` (default bench/out/soak/).

This file is the command line and the run; the clients and the chaos are in bench/soak/load.py,
the sampling of the process tree and the verdicts' measures in bench/soak/measure.py.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.soak.load import CYCLED, STABLE, Chaos, Tally, restarts_metric, touch, wait_ready
from bench.soak.measure import (
    Limits,
    left_behind,
    median_sample,
    new_shm_entries,
    sample_tree,
    settle_and_sample,
    shm_entries,
    tree_identities,
    trend_per_minute,
    verdict,
)
from examples.build_repository import build_simple, simple_config
from harness.serverproc import start_server

ROOT = Path(__file__).resolve().parents[2]
PY_ADD = ROOT / "bench" / "models" / "py_add"
PY_LEAK = ROOT / "bench" / "soak" / "models" / "py_leak"


# ----- the repository ----------------------------------------------------------------------


def _python_copy(repo: Path, source: Path, name: str) -> None:
    """A copy of a Python model under `name`, with a short queue delay (so requests wait in the
    queue long enough to be abandoned there) and restarts that never give up."""
    target = repo / name
    shutil.copytree(source, target)
    config = (target / "config.pbtxt").read_text()
    config = re.sub(r'^name: "[^"]*"', f'name: "{name}"', config, flags=re.M)
    config = re.sub(r"dynamic_batching \{[^}]*\}\n?", "", config)
    config += "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    crashes = '{ key: "max_worker_crashes" value: { string_value: "1000000" } }'
    if "parameters [" in config:  # py_leak has its own block
        config = config.replace("parameters [\n", f"parameters [\n  {crashes},\n", 1)
    else:
        config += f"parameters [ {crashes} ]\n"
    (target / "config.pbtxt").write_text(config)
    (target / "worker.pid").unlink(missing_ok=True)


def build_soak_repository(repo: Path, leak: bool) -> list[str]:
    """The models the soak serves; returns their names."""
    for name in ("simple", "simple_cycle"):
        build_simple(repo, name)
        (repo / name / "config.pbtxt").write_text(simple_config(name, 8, max_queue_delay_us=2000))
    _python_copy(repo, PY_ADD, "py_add")
    _python_copy(repo, PY_ADD, "py_add_cycle")
    names = [*STABLE, *CYCLED]
    if leak:
        _python_copy(repo, PY_LEAK, "py_leak")
        names.append("py_leak")
    return names


# grpcio logs this, with a traceback, when the response to a call the client has just cancelled
# fails in its core (grpc/grpc#32551 made it a log line instead of an unretrieved exception):
# counted and shown, but not a failure of the server.
GRPC_CANCEL_RACE = "grpc._cython.cygrpc.ExecuteBatchError"


# ----- one run -----------------------------------------------------------------------------


def run_soak(
    seconds: float,
    seed: int,
    leak: bool,
    limits: Limits,
    out_dir: Path,
    http_clients: int = 2,
    grpc_clients: int = 2,
    warmup: float = 4.0,
    settle: float = 3.0,
    samples_during: int = 0,
    label: str = "",
) -> dict:
    label = label or ("negative control (leaking model)" if leak else "clean")
    print(f"== soak {label}: {seconds:g} s of chaos, seed {seed}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="soak-", dir=out_dir))
    repo = work / "repo"
    repo.mkdir()
    models = build_soak_repository(repo, leak)
    shm_before = shm_entries()
    args = ["--model-control-mode", "explicit", "--exit-timeout-secs", "10"]
    for model in models:
        args += ["--load-model", model]
    started = time.monotonic()
    server = start_server([repo], args, log_dir=work, timeout=120)
    seen: set[tuple[int, int]] = tree_identities(server.pid)
    report: dict = {
        "label": label,
        "seconds": seconds,
        "seed": seed,
        "leak": leak,
        "models": models,
        "log": str(server.log_path),
        "server_pid": server.pid,
    }
    try:
        chaos = Chaos(server, models, seed, leak, http_clients, grpc_clients)
        chaos.leak_pid_file = repo / "py_leak" / "worker.pid" if leak else None
        # Warm-up: every kind of traffic, one cycle of each cycled model and one kill, so what
        # is made once (threads, pools, arenas, connections) exists before the baseline.
        chaos.start(kills=False, cycles=False)
        time.sleep(warmup / 2)
        for model in CYCLED:
            chaos.cycle(model, "unload", "http")
            chaos.cycle(model, "load", "http")
        chaos.kill_one(random.Random(f"{seed}:warmup"))
        time.sleep(warmup / 2)
        hung = chaos.join()
        chaos.restore()
        ready = wait_ready(server, models)
        touch(server, models, seed)
        before_samples = settle_and_sample(server, settle)
        before = median_sample(before_samples)
        print(f"   before: {_fmt(before)}", flush=True)
        chaos.tally = Tally()
        kills_at_start = len(chaos.kills)
        restarts_at_start = restarts_metric(server, "py_add")

        chaos.leak_on = True
        chaos.start()
        during = [before_samples[-1]]
        end = time.monotonic() + seconds
        # A sample every tenth of the run, at least every minute (60 at most), for the trend.
        samples_during = samples_during or min(60, max(10, int(seconds // 60)))
        interval = seconds / samples_during
        next_sample = time.monotonic() + interval
        while time.monotonic() < end and server.alive():
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))
            seen.update(tree_identities(server.pid))
            if time.monotonic() >= next_sample and time.monotonic() < end - 1:
                during.append(sample_tree(server.pid))
                next_sample += interval
                print(
                    f"   t+{during[-1]['time'] - during[0]['time']:5.0f}s: {_fmt(during[-1])}",
                    flush=True,
                )
        hung += chaos.join()
        alive = server.alive()
        chaos.restore()
        ready_after = wait_ready(server, models) if alive else False
        if ready_after:
            touch(server, models, seed)
        kills = len(chaos.kills) - kills_at_start
        restarts = restarts_metric(server, "py_add") - restarts_at_start if alive else -1
        after_samples = settle_and_sample(server, settle) if alive else [sample_tree(server.pid)]
        after = median_sample(after_samples)
        during.extend(after_samples)
        print(f"   after:  {_fmt(after)}", flush=True)
    finally:
        seen.update(tree_identities(server.pid) if server.alive() else ())
        code = server.stop()
    leftovers = left_behind({(pid, start) for pid, start in seen if pid != server.pid})
    log = server.log()
    tracebacks = [
        block[-1500:]
        for block in re.findall(r"Traceback \(most recent call last\):\n(?:[ \t].*\n)*.*", log)
    ]
    unexpected_tracebacks = [
        block for block in tracebacks if not block.splitlines()[-1].startswith(GRPC_CANCEL_RACE)
    ]
    report["log_lines"] = {
        "error": len(re.findall(r" ERROR ", log)),
        "warning": len(re.findall(r" WARNING ", log)),
        "traceback": len(unexpected_tracebacks),
        "grpc_cancel_race": len(tracebacks) - len(unexpected_tracebacks),
    }
    report["first_tracebacks"] = unexpected_tracebacks[:3]
    # Which model each killed worker served, from the server's own log line for it.
    killed_model = dict(
        (int(pid), model)
        for model, pid in re.findall(
            r"python model '([^']+)' instance '[^']*': the worker process \(pid (\d+)\) was killed "
            r"by SIGKILL",
            log,
        )
    )
    kills_by_model: dict[str, int] = {}
    for kill in chaos.kills[kills_at_start:]:
        # The log names the worker's supervisor (backends/python/worker/supervisor.py), which
        # is the killed process itself or its parent.
        name = killed_model.get(kill["pid"]) or killed_model.get(kill.get("parent", 0))
        name = name or "(not restarted: its model was unloading)"
        kills_by_model[name] = kills_by_model.get(name, 0) + 1
    report["processes_seen"] = sorted(seen)  # (pid, start time in clock ticks)
    shm_new, shm_others = new_shm_entries(shm_before)

    rss_limit_kb = max(limits.rss_mb * 1024, limits.rss_fraction * before["rss_kb"])
    verdicts = {
        "rss": verdict(after["rss_kb"] - before["rss_kb"], rss_limit_kb, "kB"),
        "fds": verdict(after["fds"] - before["fds"], limits.fds),
        "threads": verdict(after["threads"] - before["threads"], limits.threads),
        "memfds": verdict(after["memfds"] - before["memfds"], limits.memfds),
        "shm": verdict(
            max(after["shm_held"] - before["shm_held"], len(shm_new)),
            limits.shm,
            extra={
                "new_entries": shm_new[:20],
                "new_entries_held_by_other_processes": shm_others[:20],
            },
        ),
    }
    counts = dict(sorted(chaos.tally.counts.items()))
    lost = sum(n for k, n in counts.items() if "LOST" in k)
    stable_fail = sum(
        n
        for k, n in counts.items()
        if re.match(r"(http|grpc) simple: ", k) and not k.endswith(": ok")
    )
    ok_calls = sum(
        n for k, n in counts.items() if k.endswith(": ok") and re.match(r"(http|grpc) ", k)
    )
    verdicts["requests"] = {
        "pass": lost == 0 and not hung and ok_calls > 0 and stable_fail == 0,
        "ok": ok_calls,
        "lost": lost,
        "stable_simple_failures": stable_fail,
        "hung_threads": hung,
        "unexpected": chaos.tally.unexpected,
    }
    verdicts["server"] = {
        "pass": (
            alive
            and ready
            and ready_after
            and code == 0
            and not leftovers
            and report["log_lines"]["traceback"] == 0
            and restarts == kills_by_model.get("py_add", 0)
        ),
        "log_tracebacks": report["log_lines"]["traceback"],
        "stayed_up": alive,
        "ready_before": ready,
        "ready_after": ready_after,
        "exit_code": code,
        "processes_left": leftovers,
        "worker_kills": kills,
        "worker_kills_by_model": kills_by_model,
        "py_add_restarts_counted": restarts,
    }
    report.update(
        {
            "before": before,
            "after": after,
            "samples": during,
            "trend_per_minute": {
                k: round(trend_per_minute(during, k), 2)
                for k in ("rss_kb", "server_rss_kb", "fds", "threads", "memfds")
            },
            "counts": counts,
            "examples": dict(sorted(chaos.tally.examples.items())),
            "cycles": len(chaos.cycles),
            "verdicts": verdicts,
            "pass": all(v["pass"] for v in verdicts.values()),
            "wall_seconds": round(time.monotonic() - started, 1),
        }
    )
    _print_report(report)
    # Keep the log and the repository of an unexpected failure (a caught leak is expected).
    expected = report["pass"] or (
        leak and verdicts["requests"]["pass"] and verdicts["server"]["pass"]
    )
    if expected:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"   kept for a look: {work}")
    return report


def _fmt(sample: dict) -> str:
    return (
        f"rss {sample['rss_kb'] / 1024:7.1f} MiB "
        f"(server {sample['server_rss_kb'] / 1024:5.1f})  fds {sample['fds']:4.0f}  "
        f"threads {sample['threads']:3.0f}  memfds {sample['memfds']:3.0f}  "
        f"shm held {sample['shm_held']:.0f}  processes {sample['processes']:.0f}"
    )


def _print_report(report: dict) -> None:
    v = report["verdicts"]

    def word(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    print(f"-- {report['label']}: {report['wall_seconds']} s in all")
    rss = v["rss"]
    print(
        f"   {word(rss['pass'])} rss      growth {rss['growth'] / 1024:+8.1f} MiB "
        f"(limit {rss['limit'] / 1024:.0f} MiB; "
        f"trend {report['trend_per_minute']['rss_kb'] / 1024:+.1f} MiB/min)"
    )
    for key in ("fds", "threads", "memfds"):
        print(
            f"   {word(v[key]['pass'])} {key:8s} growth {v[key]['growth']:+8.0f}     "
            f"(limit {v[key]['limit']}; trend {report['trend_per_minute'][key]:+.1f}/min)"
        )
    others = v["shm"]["new_entries_held_by_other_processes"]
    print(
        f"   {word(v['shm']['pass'])} shm      new {v['shm']['growth']:+8.0f}     "
        f"(limit {v['shm']['limit']}) {' '.join(v['shm']['new_entries'])}"
        + (f" (not counted, held by other processes: {' '.join(others)})" if others else "")
    )
    r = v["requests"]
    print(
        f"   {word(r['pass'])} requests ok {r['ok']}, lost {r['lost']}, stable simple "
        f"failures {r['stable_simple_failures']}, hung threads {r['hung_threads'] or 'none'}"
    )
    for line in r["unexpected"][:10]:
        print(f"        {line}")
    s = v["server"]
    print(
        f"   {word(s['pass'])} server   up {s['stayed_up']}, ready {s['ready_before']}/"
        f"{s['ready_after']}, exit {s['exit_code']}, left behind {s['processes_left'] or 'none'}, "
        f"{report['cycles']} loads/unloads, {s['log_tracebacks']} unexpected tracebacks in its "
        f"log ({report['log_lines']['grpc_cancel_race']} from grpcio's cancel race)"
    )
    print(
        f"            {s['worker_kills']} worker kills ("
        + ", ".join(f"{k} {n}" for k, n in sorted(s["worker_kills_by_model"].items()))
        + f"); py_add's restarts counted in the metric: {s['py_add_restarts_counted']}"
    )
    for block in report["first_tracebacks"][:1]:
        print("        " + block.replace("\n", "\n        "))
    print("   outcomes: " + ", ".join(f"{k} {n}" for k, n in report["counts"].items()))
    print(f"   => {word(report['pass'])}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="chaos time (default 60)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--leak",
        action="store_true",
        help="serve the leaking model too: the run must FAIL (exit 1)",
    )
    parser.add_argument(
        "--negative-control-seconds",
        type=float,
        default=0.0,
        help="after the clean run, a leaking run this long that must FAIL; exit 0 "
        "only when the clean run passed and the leak was caught",
    )
    parser.add_argument("--http-clients", type=int, default=2)
    parser.add_argument("--grpc-clients", type=int, default=2)
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds of quiet before each before/after sample"
    )
    parser.add_argument("--max-rss-growth-mb", type=float, default=48.0)
    parser.add_argument(
        "--max-rss-growth-fraction",
        type=float,
        default=0.10,
        help="of the RSS before; the larger of the two limits applies",
    )
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--max-thread-growth", type=int, default=8)
    parser.add_argument("--max-memfd-growth", type=int, default=2)
    parser.add_argument("--max-shm-growth", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "soak")
    parser.add_argument("--report", type=Path, help="JSON report (default OUT_DIR/report.json)")
    options = parser.parse_args(argv)
    limits = Limits(
        options.max_rss_growth_mb,
        options.max_rss_growth_fraction,
        options.max_fd_growth,
        options.max_thread_growth,
        options.max_memfd_growth,
        options.max_shm_growth,
    )
    common = dict(
        seed=options.seed,
        limits=limits,
        out_dir=options.out_dir,
        http_clients=options.http_clients,
        grpc_clients=options.grpc_clients,
        settle=options.settle,
    )
    runs = [run_soak(options.seconds, leak=options.leak, **common)]
    if options.negative_control_seconds > 0 and not options.leak:
        runs.append(run_soak(options.negative_control_seconds, leak=True, **common))
    report_path = options.report or options.out_dir / "report.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(runs, indent=1, default=str))
    if len(runs) == 2:
        caught = not runs[1]["verdicts"]["rss"]["pass"] or not runs[1]["verdicts"]["fds"]["pass"]
        print(
            f"== clean run {'PASS' if runs[0]['pass'] else 'FAIL'}; negative control "
            f"{'caught (FAIL, as it must)' if caught else 'NOT caught'}; report {report_path}"
        )
        return 0 if runs[0]["pass"] and caught else 1
    print(f"== {'PASS' if runs[0]['pass'] else 'FAIL'}; report {report_path}")
    return 0 if runs[0]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
