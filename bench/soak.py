"""Soak and chaos, bounded and repeatable (issue #13, item 11).

    .venv/bin/python bench/soak.py --seconds 1800                 # the long version
    .venv/bin/python bench/soak.py --seconds 60 --negative-control-seconds 20   # make test's

Loopback only (every socket is 127.0.0.1), bounded in time (`--seconds` of chaos, plus a few
seconds of start, warm-up and settling), repeatable (`--seed`: every random choice, the models
each client picks, the waits, which worker dies, comes from seeded generators; the timing of the
machine does not).

One run: build a repository in a temporary directory (ONNX `simple` from
examples/build_repository.py and bench/models/py_add, each twice: a stable copy that is never
unloaded and a `*_cycle` copy that is unloaded and loaded again and again; with `--leak`, also
bench/soak_models/py_leak, the deliberately leaking model), start the server in explicit
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
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.build_repository import build_simple, simple_config  # noqa: E402
from tests.serverproc import ServerProcess, start_server  # noqa: E402

PY_ADD = ROOT / "bench" / "models" / "py_add"
PY_LEAK = ROOT / "bench" / "soak_models" / "py_leak"
STABLE = ("simple", "py_add")
CYCLED = ("simple_cycle", "py_add_cycle")
PYTHON_MODELS = ("py_add", "py_add_cycle", "py_leak")
WORKER_MARK = b"backends.python_worker"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

# Errors a steady client may get, by kind of model (status as tritonclient reports it).
UNAVAILABLE = ("503", "StatusCode.UNAVAILABLE")


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
        (repo / name / "config.pbtxt").write_text(
            simple_config(name, 8, max_queue_delay_us=2000))
    _python_copy(repo, PY_ADD, "py_add")
    _python_copy(repo, PY_ADD, "py_add_cycle")
    names = [*STABLE, *CYCLED]
    if leak:
        _python_copy(repo, PY_LEAK, "py_leak")
        names.append("py_leak")
    return names


# ----- the process tree --------------------------------------------------------------------

def _stat(pid: int) -> Optional[list[bytes]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants (from /proc/*/stat's ppid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(pids)


def start_time(pid: int) -> Optional[int]:
    """When the process started (clock ticks since boot): with the pid, its identity, so a pid
    reused by another process is never taken for one of ours. None once it is gone."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == b"Z" else int(fields[19])


def tree_identities(root: int) -> set[tuple[int, int]]:
    return {(pid, start) for pid in tree_pids(root)
            if (start := start_time(pid)) is not None}


def worker_pids(server_pid: int) -> list[int]:
    found = []
    for pid in tree_pids(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if WORKER_MARK in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def process_age(pid: int) -> float:
    fields = _stat(pid)
    if fields is None:
        return 0.0
    start_ticks = int(fields[19])
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def sample_tree(server_pid: int) -> dict:
    """RSS (kB, summed over the tree), descriptors, threads, memfd arenas (distinct inodes open
    or mapped), /dev/shm entries open or mapped by the tree, and processes."""
    rss = fds = threads = procs = 0
    per_process: dict[int, int] = {}
    memfds: set[int] = set()
    shm_held: set[str] = set()
    for pid in tree_pids(server_pid):
        try:
            with open(f"/proc/{pid}/statm") as handle:
                per_process[pid] = int(handle.read().split()[1]) * PAGE_KB
                rss += per_process[pid]
            with open(f"/proc/{pid}/status") as handle:
                threads += int(re.search(r"^Threads:\s+(\d+)", handle.read(), re.M).group(1))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                fds += 1
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/memfd:"):
                    try:
                        memfds.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
                    except OSError:
                        pass
                elif target.startswith("/dev/shm/"):
                    shm_held.add(target)
            with open(f"/proc/{pid}/maps") as handle:
                for line in handle:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].strip()
                        if path.startswith("/memfd:"):
                            memfds.add(int(parts[4]))
                        elif path.startswith("/dev/shm/"):
                            shm_held.add(path)
            procs += 1
        except (OSError, AttributeError):
            continue  # the process went while we looked (a killed worker)
    return {"time": time.time(), "rss_kb": rss, "fds": fds, "threads": threads,
            "memfds": len(memfds), "shm_held": len(shm_held), "processes": procs,
            "shm_entries": len(shm_entries()), "server_rss_kb": per_process.get(server_pid, 0),
            "rss_kb_by_pid": per_process}


# ----- the clients -------------------------------------------------------------------------

@dataclass
class Tally:
    """What the clients saw, by outcome; the first few samples of anything unexpected."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: dict = field(default_factory=dict)
    unexpected: list = field(default_factory=list)
    examples: dict = field(default_factory=dict)

    def add(self, key: str, detail: str = "", bad: bool = False) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if detail and key not in self.examples:
                self.examples[key] = detail[:300]
            if bad and len(self.unexpected) < 20:
                self.unexpected.append(f"{key}: {detail[:300]}")


def _inputs(module, model: str, rng: random.Random) -> tuple[list, np.ndarray, np.ndarray]:
    dtype, name = (np.int32, "INT32") if model.startswith("simple") else (np.float32, "FP32")
    a = np.array([rng.randrange(-1000, 1000) for _ in range(16)], dtype).reshape(1, 16)
    b = np.array([rng.randrange(-1000, 1000) for _ in range(16)], dtype).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], name), module.InferInput("INPUT1", [1, 16], name)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def classify_error(model: str, status: str, message: str) -> Optional[str]:
    """The documented error this is, or None when it is not one (README, "Model control" and
    "Python models"): 503 / UNAVAILABLE for a model while it is unloaded or being unloaded or
    reloaded, and for a Python model whose worker was killed under the request or is being
    restarted (the model is not ready until it is back)."""
    if status not in UNAVAILABLE:
        return None
    if model in CYCLED and ("has no available versions" in message
                            or "is not at ready state" in message):
        return "unavailable (model unloaded)"
    if model in PYTHON_MODELS and ("the worker process" in message
                                   or "is not at ready state" in message):
        return "unavailable (worker killed)"
    return None


class Chaos:
    def __init__(self, server: ServerProcess, models: list[str], seed: int, leak: bool,
                 http_clients: int, grpc_clients: int) -> None:
        self.server = server
        self.models = models
        self.seed = seed
        self.leak = leak
        self.http_clients = http_clients
        self.grpc_clients = grpc_clients
        self.tally = Tally()
        self.stop = threading.Event()
        self.kills: list[dict] = []
        self.cycles: list[dict] = []
        self.loaded = {name: True for name in CYCLED}
        self.threads: list[threading.Thread] = []
        self.leak_pid_file: Optional[Path] = None
        self.leak_on = False  # the leaking model gets traffic only after the baseline

    # traffic ---------------------------------------------------------------------------

    def _pick(self, rng: random.Random) -> str:
        if self.leak and self.leak_on and rng.random() < 0.4:
            return "py_leak"
        return rng.choice([*STABLE, *CYCLED])

    def _infer_loop(self, protocol: str, index: int) -> None:
        rng = random.Random(f"{self.seed}:{protocol}:{index}")
        if protocol == "http":
            import tritonclient.http as module
            client = module.InferenceServerClient(self.server.http_url, connection_timeout=60,
                                                  network_timeout=60)
        else:
            import tritonclient.grpc as module
            client = module.InferenceServerClient(self.server.grpc_url)
        from tritonclient.utils import InferenceServerException
        try:
            while not self.stop.is_set():
                model = self._pick(rng)
                inputs, a, b = _inputs(module, model, rng)
                key = f"{protocol} {model}"
                try:
                    if protocol == "grpc":
                        result = client.infer(model, inputs, client_timeout=60)
                    else:
                        result = client.infer(model, inputs)
                except InferenceServerException as exc:
                    status, message = str(exc.status()), str(exc.message() or exc)
                    kind = classify_error(model, status, message)
                    if kind is None:
                        self.tally.add(f"{key}: LOST ({status})", message, bad=True)
                    else:
                        self.tally.add(f"{key}: {kind}", f"{status} {message}")
                    continue
                except Exception as exc:  # a dropped connection, a client timeout
                    self.tally.add(f"{key}: LOST ({type(exc).__name__})", repr(exc), bad=True)
                    continue
                if (np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                        and np.array_equal(result.as_numpy("OUTPUT1"), a - b)):
                    self.tally.add(f"{key}: ok")
                else:
                    self.tally.add(f"{key}: LOST (wrong answer)", str(result.get_response()),
                                   bad=True)
        finally:
            client.close()

    # disconnects -------------------------------------------------------------------------

    def _raw_http(self, rng: random.Random, model: str, mode: str) -> None:
        dtype = "INT32" if model.startswith("simple") else "FP32"
        body = json.dumps({"inputs": [
            {"name": name, "shape": [1, 16], "datatype": dtype, "data": list(range(16))}
            for name in ("INPUT0", "INPUT1")]}).encode()
        head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10) as sock:
            if mode == "half body":
                sock.sendall(head + body[: len(body) // 2])
            else:
                sock.sendall(head + body)
            time.sleep(rng.uniform(0, 0.01))
            if mode == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def _disconnect_loop(self) -> None:
        import tritonclient.grpc as grpcclient
        rng = random.Random(f"{self.seed}:disconnect")
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            while not self.stop.is_set():
                model = rng.choice([*STABLE, *CYCLED])
                mode = rng.choice(["close", "half body", "reset", "grpc cancel", "grpc deadline"])
                try:
                    if mode.startswith("grpc"):
                        inputs, _, _ = _inputs(grpcclient, model, rng)
                        if mode == "grpc cancel":
                            ctx = client.async_infer(model, inputs, lambda result, error: None)
                            time.sleep(rng.uniform(0, 0.005))
                            ctx.cancel()
                        else:
                            try:
                                client.infer(model, inputs, client_timeout=rng.uniform(0.0005, 0.003))
                            except Exception:
                                pass
                    else:
                        self._raw_http(rng, model, mode)
                    self.tally.add(f"disconnect {mode}")
                except OSError as exc:
                    self.tally.add(f"disconnect {mode}: LOST (connect failed)", repr(exc), bad=True)
                self.stop.wait(rng.uniform(0.01, 0.05))
        finally:
            client.close()

    # load / unload --------------------------------------------------------------------------

    def _cycle_loop(self) -> None:
        import tritonclient.grpc as grpcclient
        rng = random.Random(f"{self.seed}:cycle")
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            while not self.stop.wait(rng.uniform(0.5, 2.0)):
                model = rng.choice(CYCLED)
                self.cycle(model, "unload" if self.loaded[model] else "load",
                           rng.choice(["http", "grpc"]), client)
        finally:
            client.close()

    def cycle(self, model: str, action: str, protocol: str, client=None) -> bool:
        started = time.monotonic()
        error = ""
        try:
            if protocol == "http":
                reply = httpx.post(f"{self.server.base}/v2/repository/models/{model}/{action}",
                                   json={}, timeout=120)
                if reply.status_code != 200:
                    error = f"{reply.status_code} {reply.text}"
            else:
                (client.load_model if action == "load" else client.unload_model)(model)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        ok = not error
        # A load whose worker the killer hit during initialize fails, as documented.
        killed = "during initialize" in error or "worker process" in error
        self.cycles.append({"model": model, "action": action, "protocol": protocol,
                            "seconds": round(time.monotonic() - started, 3), "error": error})
        if ok:
            self.loaded[model] = action == "load"
            self.tally.add(f"{action} {protocol}: ok")
        elif action == "load" and killed:
            self.loaded[model] = False
            self.tally.add(f"{action} {protocol}: failed (worker killed during initialize)")
        else:
            self.tally.add(f"{action} {protocol}: LOST", error, bad=True)
        return ok

    # worker kills ---------------------------------------------------------------------------

    def leak_pid(self) -> int:
        if self.leak_pid_file is not None and self.leak_pid_file.exists():
            try:
                return int(self.leak_pid_file.read_text())
            except ValueError:
                return 0
        return 0

    def kill_one(self, rng: random.Random) -> Optional[int]:
        spare = self.leak_pid()
        candidates = [pid for pid in worker_pids(self.server.pid)
                      if pid != spare and process_age(pid) > 2.0]
        if not candidates:
            return None
        pid = rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.kills.append({"pid": pid, "time": time.time()})
        self.tally.add("worker killed")
        return pid

    def _kill_loop(self) -> None:
        rng = random.Random(f"{self.seed}:kill")
        while not self.stop.wait(rng.uniform(2.0, 5.0)):
            self.kill_one(rng)

    # running ---------------------------------------------------------------------------

    def start(self, kills: bool = True, cycles: bool = True) -> None:
        self.stop.clear()
        targets: list[tuple[Callable, tuple]] = []
        targets += [(self._infer_loop, ("http", i)) for i in range(self.http_clients)]
        targets += [(self._infer_loop, ("grpc", i)) for i in range(self.grpc_clients)]
        targets.append((self._disconnect_loop, ()))
        if cycles:
            targets.append((self._cycle_loop, ()))
        if kills:
            targets.append((self._kill_loop, ()))
        self.threads = [threading.Thread(target=self._guarded, args=(target, *args), daemon=True,
                                         name=f"{target.__name__}{list(args)}")
                        for target, args in targets]
        for thread in self.threads:
            thread.start()

    def _guarded(self, target: Callable, *args: object) -> None:
        """A client thread that raises is a failure of the soak itself, never silent."""
        try:
            target(*args)
        except Exception as exc:
            self.tally.add(f"{target.__name__}: LOST (thread crashed)", repr(exc), bad=True)

    def join(self, timeout: float = 120.0) -> list[str]:
        """Stop every thread; the names of those that did not stop in time (a hung call)."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        hung = []
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))
            if thread.is_alive():
                hung.append(thread.name)
        return hung

    def restore(self) -> None:
        """Load every cycled model that is not loaded, so the end state equals the start."""
        for model in CYCLED:
            for _ in range(5):
                if self.loaded[model] or self.cycle(model, "load", "http"):
                    break


def wait_ready(server: ServerProcess, models: list[str], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(httpx.get(f"{server.base}/v2/models/{m}/ready", timeout=5).status_code == 200
                   for m in models):
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def touch(server: ServerProcess, models: list[str], seed: int) -> None:
    """A few calls to every model over both protocols, so every worker (a restarted one too)
    has made its arenas before a sample; errors do not matter here."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    rng = random.Random(f"{seed}:touch")
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            for model in models:
                for _ in range(5):
                    try:
                        client.infer(model, _inputs(module, model, rng)[0])
                    except Exception:
                        pass
        finally:
            client.close()


def restarts_metric(server: ServerProcess, model: str) -> int:
    """`ascend_python_worker_restarts_total` of one model (version 1); -1 when unreadable."""
    try:
        text = httpx.get(server.metrics_url, timeout=10).text
    except httpx.HTTPError:
        return -1
    match = re.search(rf'^ascend_python_worker_restarts_total\{{model="{model}",version="1"\}} '
                      rf'(\S+)$', text, re.M)
    return int(float(match.group(1))) if match else -1


# grpcio logs this, with a traceback, when the response to a call the client has just cancelled
# fails in its core (grpc/grpc#32551 made it a log line instead of an unretrieved exception):
# counted and shown, but not a failure of the server.
GRPC_CANCEL_RACE = "grpc._cython.cygrpc.ExecuteBatchError"


# ----- one run -----------------------------------------------------------------------------

@dataclass
class Limits:
    rss_mb: float
    rss_fraction: float
    fds: int
    threads: int
    memfds: int
    shm: int


def median_sample(samples: list[dict]) -> dict:
    keys = [k for k in samples[0] if k not in ("time", "rss_kb_by_pid")]
    return {k: statistics.median(s[k] for s in samples) for k in keys}


def settle_and_sample(server: ServerProcess, seconds: float, count: int = 3) -> list[dict]:
    time.sleep(seconds)
    samples = []
    for i in range(count):
        if i:
            time.sleep(1.0)
        samples.append(sample_tree(server.pid))
    return samples


def trend_per_minute(samples: list[dict], key: str) -> float:
    if len(samples) < 3:
        return 0.0
    t0 = samples[0]["time"]
    xs = [(s["time"] - t0) / 60 for s in samples]
    ys = [s[key] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def run_soak(seconds: float, seed: int, leak: bool, limits: Limits, out_dir: Path,
             http_clients: int = 2, grpc_clients: int = 2, warmup: float = 4.0,
             settle: float = 3.0, samples_during: int = 0, label: str = "") -> dict:
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
    report: dict = {"label": label, "seconds": seconds, "seed": seed, "leak": leak,
                    "models": models, "log": str(server.log_path), "server_pid": server.pid}
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
                print(f"   t+{during[-1]['time'] - during[0]['time']:5.0f}s: {_fmt(during[-1])}",
                      flush=True)
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
    leftovers = _leftovers({(pid, start) for pid, start in seen if pid != server.pid})
    log = server.log()
    tracebacks = [block[-1500:] for block in re.findall(
        r"Traceback \(most recent call last\):\n(?:[ \t].*\n)*.*", log)]
    unexpected_tracebacks = [block for block in tracebacks
                             if not block.splitlines()[-1].startswith(GRPC_CANCEL_RACE)]
    report["log_lines"] = {"error": len(re.findall(r" ERROR ", log)),
                           "warning": len(re.findall(r" WARNING ", log)),
                           "traceback": len(unexpected_tracebacks),
                           "grpc_cancel_race": len(tracebacks) - len(unexpected_tracebacks)}
    report["first_tracebacks"] = unexpected_tracebacks[:3]
    # Which model each killed worker served, from the server's own log line for it.
    killed_model = dict((int(pid), model) for model, pid in re.findall(
        r"python model '([^']+)' instance '[^']*': the worker process \(pid (\d+)\) was killed "
        r"by SIGKILL", log))
    kills_by_model: dict[str, int] = {}
    for kill in chaos.kills[kills_at_start:]:
        name = killed_model.get(kill["pid"], "(not restarted: its model was unloading)")
        kills_by_model[name] = kills_by_model.get(name, 0) + 1
    report["processes_seen"] = sorted(seen)  # (pid, start time in clock ticks)
    shm_new, shm_others = _new_shm_entries(shm_before)

    rss_limit_kb = max(limits.rss_mb * 1024, limits.rss_fraction * before["rss_kb"])
    verdicts = {
        "rss": _verdict(after["rss_kb"] - before["rss_kb"], rss_limit_kb, "kB"),
        "fds": _verdict(after["fds"] - before["fds"], limits.fds),
        "threads": _verdict(after["threads"] - before["threads"], limits.threads),
        "memfds": _verdict(after["memfds"] - before["memfds"], limits.memfds),
        "shm": _verdict(max(after["shm_held"] - before["shm_held"], len(shm_new)), limits.shm,
                        extra={"new_entries": shm_new[:20],
                               "new_entries_held_by_other_processes": shm_others[:20]}),
    }
    counts = dict(sorted(chaos.tally.counts.items()))
    lost = sum(n for k, n in counts.items() if "LOST" in k)
    stable_fail = sum(n for k, n in counts.items()
                      if re.match(r"(http|grpc) simple: ", k) and not k.endswith(": ok"))
    ok_calls = sum(n for k, n in counts.items() if k.endswith(": ok") and
                   re.match(r"(http|grpc) ", k))
    verdicts["requests"] = {
        "pass": lost == 0 and not hung and ok_calls > 0 and stable_fail == 0,
        "ok": ok_calls, "lost": lost, "stable_simple_failures": stable_fail,
        "hung_threads": hung, "unexpected": chaos.tally.unexpected}
    verdicts["server"] = {
        "pass": (alive and ready and ready_after and code == 0 and not leftovers
                 and report["log_lines"]["traceback"] == 0
                 and restarts == kills_by_model.get("py_add", 0)),
        "log_tracebacks": report["log_lines"]["traceback"],
        "stayed_up": alive, "ready_before": ready, "ready_after": ready_after,
        "exit_code": code, "processes_left": leftovers,
        "worker_kills": kills, "worker_kills_by_model": kills_by_model,
        "py_add_restarts_counted": restarts}
    report.update({
        "before": before, "after": after, "samples": during,
        "trend_per_minute": {k: round(trend_per_minute(during, k), 2)
                             for k in ("rss_kb", "server_rss_kb", "fds", "threads", "memfds")},
        "counts": counts, "examples": dict(sorted(chaos.tally.examples.items())),
        "cycles": len(chaos.cycles), "verdicts": verdicts,
        "pass": all(v["pass"] for v in verdicts.values()),
        "wall_seconds": round(time.monotonic() - started, 1)})
    _print_report(report)
    # Keep the log and the repository of an unexpected failure (a caught leak is expected).
    expected = report["pass"] or (leak and verdicts["requests"]["pass"]
                                  and verdicts["server"]["pass"])
    if expected:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"   kept for a look: {work}")
    return report


def _verdict(growth: float, limit: float, unit: str = "", extra: Optional[dict] = None) -> dict:
    return {"pass": growth <= limit, "growth": growth, "limit": limit, "unit": unit,
            **(extra or {})}


def _new_shm_entries(before: set[str]) -> tuple[list[str], list[str]]:
    """/dev/shm entries made during the run and still there once the server has stopped: those
    no process holds (a leaked name), and those some other process on the machine has open or
    mapped (not the server's: its whole tree is gone by now)."""
    new = shm_entries() - before
    held: set[str] = set()
    if new:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/maps") as handle:
                    text = handle.read()
                names = [os.readlink(f"/proc/{entry}/fd/{fd}")
                         for fd in os.listdir(f"/proc/{entry}/fd")]
            except OSError:
                continue
            for name in new - held:
                if f"/dev/shm/{name}" in text or f"/dev/shm/{name}" in names:
                    held.add(name)
    return sorted(new - held), sorted(held)


def _leftovers(processes: set[tuple[int, int]]) -> list[int]:
    """Processes of the tree still running after the server stopped (given 5 s to go); each is
    killed, by pid and only while its start time still says it is ours, so nothing is left
    behind even when the verdict fails."""
    deadline = time.monotonic() + 5
    left = [pid for pid, start in processes if start_time(pid) == start]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid, start in processes if start_time(pid) == start]
    for pid, start in processes:
        if start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return sorted(left)


def _fmt(sample: dict) -> str:
    return (f"rss {sample['rss_kb'] / 1024:7.1f} MiB (server {sample['server_rss_kb'] / 1024:5.1f})  fds {sample['fds']:4.0f}  "
            f"threads {sample['threads']:3.0f}  memfds {sample['memfds']:3.0f}  "
            f"shm held {sample['shm_held']:.0f}  processes {sample['processes']:.0f}")


def _print_report(report: dict) -> None:
    v = report["verdicts"]
    word = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    print(f"-- {report['label']}: {report['wall_seconds']} s in all")
    rss = v["rss"]
    print(f"   {word(rss['pass'])} rss      growth {rss['growth'] / 1024:+8.1f} MiB "
          f"(limit {rss['limit'] / 1024:.0f} MiB; trend {report['trend_per_minute']['rss_kb'] / 1024:+.1f} MiB/min)")
    for key in ("fds", "threads", "memfds"):
        print(f"   {word(v[key]['pass'])} {key:8s} growth {v[key]['growth']:+8.0f}     "
              f"(limit {v[key]['limit']}; trend {report['trend_per_minute'][key]:+.1f}/min)")
    others = v["shm"]["new_entries_held_by_other_processes"]
    print(f"   {word(v['shm']['pass'])} shm      new {v['shm']['growth']:+8.0f}     "
          f"(limit {v['shm']['limit']}) {' '.join(v['shm']['new_entries'])}"
          + (f" (not counted, held by other processes: {' '.join(others)})" if others else ""))
    r = v["requests"]
    print(f"   {word(r['pass'])} requests ok {r['ok']}, lost {r['lost']}, stable simple "
          f"failures {r['stable_simple_failures']}, hung threads {r['hung_threads'] or 'none'}")
    for line in r["unexpected"][:10]:
        print(f"        {line}")
    s = v["server"]
    print(f"   {word(s['pass'])} server   up {s['stayed_up']}, ready {s['ready_before']}/"
          f"{s['ready_after']}, exit {s['exit_code']}, left behind {s['processes_left'] or 'none'}, "
          f"{report['cycles']} loads/unloads, {s['log_tracebacks']} unexpected tracebacks in its "
          f"log ({report['log_lines']['grpc_cancel_race']} from grpcio's cancel race)")
    print(f"            {s['worker_kills']} worker kills ("
          + ", ".join(f"{k} {n}" for k, n in sorted(s["worker_kills_by_model"].items()))
          + f"); py_add's restarts counted in the metric: {s['py_add_restarts_counted']}")
    for block in report["first_tracebacks"][:1]:
        print("        " + block.replace("\n", "\n        "))
    print("   outcomes: " + ", ".join(f"{k} {n}" for k, n in report["counts"].items()))
    print(f"   => {word(report['pass'])}", flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="chaos time (default 60)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--leak", action="store_true",
                        help="serve the leaking model too: the run must FAIL (exit 1)")
    parser.add_argument("--negative-control-seconds", type=float, default=0.0,
                        help="after the clean run, a leaking run this long that must FAIL; exit 0 "
                             "only when the clean run passed and the leak was caught")
    parser.add_argument("--http-clients", type=int, default=2)
    parser.add_argument("--grpc-clients", type=int, default=2)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds of quiet before each before/after sample")
    parser.add_argument("--max-rss-growth-mb", type=float, default=48.0)
    parser.add_argument("--max-rss-growth-fraction", type=float, default=0.10,
                        help="of the RSS before; the larger of the two limits applies")
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--max-thread-growth", type=int, default=8)
    parser.add_argument("--max-memfd-growth", type=int, default=2)
    parser.add_argument("--max-shm-growth", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "soak")
    parser.add_argument("--report", type=Path, help="JSON report (default OUT_DIR/report.json)")
    options = parser.parse_args(argv)
    limits = Limits(options.max_rss_growth_mb, options.max_rss_growth_fraction,
                    options.max_fd_growth, options.max_thread_growth, options.max_memfd_growth,
                    options.max_shm_growth)
    common = dict(seed=options.seed, limits=limits, out_dir=options.out_dir,
                  http_clients=options.http_clients, grpc_clients=options.grpc_clients,
                  settle=options.settle)
    runs = [run_soak(options.seconds, leak=options.leak, **common)]
    if options.negative_control_seconds > 0 and not options.leak:
        runs.append(run_soak(options.negative_control_seconds, leak=True, **common))
    report_path = options.report or options.out_dir / "report.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(runs, indent=1, default=str))
    if len(runs) == 2:
        caught = not runs[1]["verdicts"]["rss"]["pass"] or not runs[1]["verdicts"]["fds"]["pass"]
        print(f"== clean run {'PASS' if runs[0]['pass'] else 'FAIL'}; negative control "
              f"{'caught (FAIL, as it must)' if caught else 'NOT caught'}; report {report_path}")
        return 0 if runs[0]["pass"] and caught else 1
    print(f"== {'PASS' if runs[0]['pass'] else 'FAIL'}; report {report_path}")
    return 0 if runs[0]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
