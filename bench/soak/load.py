"""The soak's load and chaos (bench/soak/run.py): steady HTTP and gRPC inference clients whose every
answer is checked and classified, a cycler unloading and loading the `*_cycle` models, a
disconnecter abandoning requests, a killer of Python workers; and the calls around them (wait
for readiness, touch every model, read the restarts metric)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.soak.measure import parent_pid, process_age, worker_pids
from harness.serverproc import ServerProcess

STABLE = ("simple", "py_add")
CYCLED = ("simple_cycle", "py_add_cycle")
PYTHON_MODELS = ("py_add", "py_add_cycle", "py_leak")

# Errors a steady client may get, by kind of model (status as tritonclient reports it).
UNAVAILABLE = ("503", "StatusCode.UNAVAILABLE")


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
    inputs = [
        module.InferInput("INPUT0", [1, 16], name),
        module.InferInput("INPUT1", [1, 16], name),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def classify_error(model: str, status: str, message: str) -> str | None:
    """The documented error this is, or None when it is not one (README, "Model control" and
    "Python models"): 503 / UNAVAILABLE for a model while it is unloaded or being unloaded or
    reloaded, and for a Python model whose worker was killed under the request or is being
    restarted (the model is not ready until it is back)."""
    if status not in UNAVAILABLE:
        return None
    if model in CYCLED and (
        "has no available versions" in message or "is not at ready state" in message
    ):
        return "unavailable (model unloaded)"
    if model in PYTHON_MODELS and (
        "the worker process" in message or "is not at ready state" in message
    ):
        return "unavailable (worker killed)"
    return None


class Chaos:
    def __init__(
        self,
        server: ServerProcess,
        models: list[str],
        seed: int,
        leak: bool,
        http_clients: int,
        grpc_clients: int,
    ) -> None:
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
        self.leak_pid_file: Path | None = None
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

            client = module.InferenceServerClient(
                self.server.http_url, connection_timeout=60, network_timeout=60
            )
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
                if np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(
                    result.as_numpy("OUTPUT1"), a - b
                ):
                    self.tally.add(f"{key}: ok")
                else:
                    self.tally.add(
                        f"{key}: LOST (wrong answer)", str(result.get_response()), bad=True
                    )
        finally:
            client.close()

    # disconnects -------------------------------------------------------------------------

    def _raw_http(self, rng: random.Random, model: str, mode: str) -> None:
        dtype = "INT32" if model.startswith("simple") else "FP32"
        body = json.dumps(
            {
                "inputs": [
                    {"name": name, "shape": [1, 16], "datatype": dtype, "data": list(range(16))}
                    for name in ("INPUT0", "INPUT1")
                ]
            }
        ).encode()
        head = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
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
                                client.infer(
                                    model, inputs, client_timeout=rng.uniform(0.0005, 0.003)
                                )
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
                self.cycle(
                    model,
                    "unload" if self.loaded[model] else "load",
                    rng.choice(["http", "grpc"]),
                    client,
                )
        finally:
            client.close()

    def cycle(self, model: str, action: str, protocol: str, client=None) -> bool:
        started = time.monotonic()
        error = ""
        try:
            if protocol == "http":
                reply = httpx.post(
                    f"{self.server.base}/v2/repository/models/{model}/{action}",
                    json={},
                    timeout=120,
                )
                if reply.status_code != 200:
                    error = f"{reply.status_code} {reply.text}"
            else:
                (client.load_model if action == "load" else client.unload_model)(model)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        ok = not error
        # A load whose worker the killer hit during initialize fails, as documented.
        killed = "during initialize" in error or "worker process" in error
        self.cycles.append(
            {
                "model": model,
                "action": action,
                "protocol": protocol,
                "seconds": round(time.monotonic() - started, 3),
                "error": error,
            }
        )
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

    def kill_one(self, rng: random.Random) -> int | None:
        # The leaking worker and its supervisor (whose command line names the worker module
        # too): killing either frees the leak the negative control is meant to show.
        leak = self.leak_pid()
        spare = {leak, parent_pid(leak)} if leak else set()
        candidates = [
            pid
            for pid in worker_pids(self.server.pid)
            if pid not in spare and process_age(pid) > 2.0
        ]
        if not candidates:
            return None
        pid = rng.choice(candidates)
        parent = parent_pid(pid)  # a worker's supervisor, which the server's log names
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.kills.append({"pid": pid, "parent": parent, "time": time.time()})
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
        self.threads = [
            threading.Thread(
                target=self._guarded,
                args=(target, *args),
                daemon=True,
                name=f"{target.__name__}{list(args)}",
            )
            for target, args in targets
        ]
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
            if all(
                httpx.get(f"{server.base}/v2/models/{m}/ready", timeout=5).status_code == 200
                for m in models
            ):
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
    match = re.search(
        rf'^ascend_python_worker_restarts_total\{{model="{model}",version="1"\}} '
        rf"(\S+)$",
        text,
        re.M,
    )
    return int(float(match.group(1))) if match else -1
