"""What a response cache hit costs against a miss, and against no cache at all.

Why: a hit should skip the queue and the execution and cost only the lookup (a hash of the
inputs and a dictionary probe) plus building the answer; a miss pays the lookup and the insert
(a copy of the outputs) on top of the execution. This starts one server with
`--cache-config local,size=256 MiB` and three identity models (backends/identity.py): `cached`
(response_cache on), `uncached` (the same model without it) and `slow` (cached, 5 ms per
execute, a stand-in for a model worth caching). For each payload size it sends, one at a time
over HTTP with tritonclient: the same request again and again (hits), a new request each time
(misses), and the uncached model (the baseline), and prints the client's p50 latency with the
server's own statistics: cache_hit ns per hit (lookup and answer) and cache_miss ns per miss
(lookup and insert). Each figure is the best of --rounds rounds, each on a fresh copy
(a shared machine's noise only ever adds).

    .venv/bin/python -m bench.studies.response_cache [--requests 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from harness.serverproc import running_server

CACHE_ARGS = ["--cache-config=local,size=268435456", "--model-control-mode=explicit"]
CACHE_ARGS += ["--load-model=*"]
SIZES = (16, 64 << 10, 1 << 20)  # bytes of the FP32 input (and of the output)
CONFIG = """name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""
MODELS = {
    "cached": "response_cache { enable: true }",
    "uncached": "",
    "slow": 'response_cache { enable: true }\nparameters { key: "execute_delay_ms" '
    'value: { string_value: "5" } }',
}


def build(root: Path) -> None:
    for name, extra in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def p50_us(client: httpclient.InferenceServerClient, model: str, inputs: list[np.ndarray]) -> float:
    times = []
    for values in inputs:
        tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values, binary_data=True)
        started = time.perf_counter()
        client.infer(model, [tensor])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def cache_ns(client: httpclient.InferenceServerClient, model: str) -> tuple[float, float]:
    """(ns per hit, ns per miss) from the model's statistics so far."""
    s = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    hit, miss = s["cache_hit"], s["cache_miss"]
    return hit["ns"] / max(1, hit["count"]), miss["ns"] / max(1, miss["count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        build(root)
        with running_server([root], CACHE_ARGS) as server:
            client = httpclient.InferenceServerClient(server.http_url)
            print(
                f"{'bytes':>8} {'model':>8} {'hit p50':>10} {'miss p50':>10} "
                f"{'no cache p50':>12} {'hit ns':>10} {'miss ns':>10}   (client µs; server ns)"
            )
            for size in SIZES:
                for model in ("cached", "slow"):
                    rounds = [
                        measure(client, model, size, args.requests) for _ in range(args.rounds)
                    ]
                    hit, miss, base, hit_ns, miss_ns = (
                        min(column) for column in zip(*rounds, strict=True)
                    )
                    shown = f"{base:12.0f}" if base else f"{'-':>12}"
                    print(
                        f"{size:>8} {model:>8} {hit:10.0f} {miss:10.0f} {shown} "
                        f"{hit_ns:10.0f} {miss_ns:10.0f}"
                    )


def measure(
    client: httpclient.InferenceServerClient, model: str, size: int, requests: int
) -> tuple[float, float, float, float, float]:
    """One round on a fresh copy of `model`: (hit p50, miss p50, uncached p50, ns per hit,
    ns per miss); the uncached figure is 0 for `slow` (it has no uncached twin)."""
    client.unload_model(model)  # a fresh copy: statistics and entries at 0
    client.load_model(model)
    count = size // 4
    rng = np.random.default_rng(size)
    requests = requests if model == "cached" else max(10, requests // 5)
    same = [np.ones(count, np.float32)] * (requests + 1)
    fresh = [rng.random(count, dtype=np.float32) for _ in range(requests)]
    miss = p50_us(client, model, fresh)
    hit = p50_us(client, model, same)
    base = p50_us(client, "uncached", same[:requests]) if model == "cached" else 0.0
    hit_ns, miss_ns = cache_ns(client, model)
    return hit, miss, base, hit_ns, miss_ns


if __name__ == "__main__":
    main()
