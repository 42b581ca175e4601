"""Small models several test files run: a Python model that sleeps and tells its pid, one that
starts processes of its own, an ONNX model whose one-slot queue one request fills, an ONNX FP32
identity for large bodies (which bench/studies/hostile.py builds too), and Python models that
try bad custom metrics (the test and the hostile study both run them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

# Sleeps SECONDS in execute, then answers PID: the pid of the worker that ran it (so a test
# knows which process to kill). When it starts it writes its pid to worker.pid in its model
# directory, where the server gives it one (`args["model_repository"]`).
SLEEPER_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if args.get("model_repository"):
            path = os.path.join(args["model_repository"], "worker.pid")
            with open(path + ".tmp", "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(path + ".tmp", path)

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            time.sleep(seconds)
            pid = np.array([os.getpid()], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]))
        return responses
"""


# Starts three processes of its own as it loads and writes their pids, one a line, to
# children.pid in its model directory: `sleep 1000` through subprocess, the same in a new session
# (out of the worker's process group), and a fork of itself that writes its own pid and sleeps.
# What a model's children do that must not outlive it (the server ends them with the model).
FORKER_MODEL = """
import os
import subprocess
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = args["model_repository"]
        self.sleep = subprocess.Popen(["sleep", "1000"])
        self.away = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        forked = os.fork()
        if forked == 0:
            try:
                with open(os.path.join(folder, "forked.pid.tmp"), "w") as handle:
                    handle.write(str(os.getpid()))
                os.replace(
                    os.path.join(folder, "forked.pid.tmp"), os.path.join(folder, "forked.pid")
                )
                time.sleep(1000)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(folder, "forked.pid")):
            if time.monotonic() > deadline:
                raise RuntimeError("the forked child did not write its pid")
            time.sleep(0.01)
        with open(os.path.join(folder, "forked.pid")) as handle:
            pids = [self.sleep.pid, self.away.pid, int(handle.read())]
        with open(os.path.join(folder, "children.pid.tmp"), "w") as handle:
            handle.write("\\n".join(map(str, pids)))
        os.replace(
            os.path.join(folder, "children.pid.tmp"), os.path.join(folder, "children.pid")
        )

    def execute(self, requests):
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""


def sleeper_config(name: str) -> str:
    """config.pbtxt of SLEEPER_MODEL under `name`: one instance, no batching."""
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''


def write_python_model(repo: Path, name: str, source: str, config: str) -> Path:
    """repo/name/config.pbtxt and repo/name/1/model.py; returns the version directory."""
    version_dir = repo / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return version_dir


def queued_config(queue_delay_us: int) -> str:
    """A batching model whose queue holds one request, which waits `queue_delay_us` for a
    batch of 64 that never comes: while it waits, the next request is refused (queue full)."""
    return f"""
name: "queued"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 256 ] }} ]
dynamic_batching {{
  preferred_batch_size: [ 64 ]
  max_queue_delay_microseconds: {queue_delay_us}
  default_queue_policy {{ max_queue_size: 1 }}
}}
"""


def write_queued_model(repo: Path, queue_delay_us: int) -> Path:
    """The `queued` model (queued_config) in `repo`; returns `repo`."""
    from examples.build_repository import make_dense_compute_model

    (repo / "queued" / "1").mkdir(parents=True)
    (repo / "queued" / "1" / "model.onnx").write_bytes(
        make_dense_compute_model().SerializeToString()
    )
    (repo / "queued" / "config.pbtxt").write_text(queued_config(queue_delay_us))
    return repo


def build_identity_fp32(repo: Path) -> None:
    """`identity_fp32`: an ONNX Identity over FP32 [-1, -1], no batching (large bodies)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"], name="identity")],
        "identity_fp32",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [-1, -1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [-1, -1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    directory = repo / "identity_fp32"
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(
        'name: "identity_fp32"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


METRICS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "RESULTS" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

# Issue 28 item 10 (tests/e2e/python_models/test_custom_metrics.py, bench/studies/hostile.py):
# `first` declares `shared_family` as a gauge; `probe` then tries each bad custom metric in
# `initialize` and answers RESULTS: JSON of case -> "accepted" or the exception it got.
METRICS_FIRST_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily("shared_family", "a gauge", pb_utils.MetricFamily.GAUGE)
        family.Metric(labels={"model": "first"}).set(7)

    def execute(self, requests):
        out = pb_utils.Tensor("RESULTS", np.array([b"{}"], dtype=object))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

METRICS_PROBE_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

F = pb_utils.MetricFamily


def family(name, description="d", kind=F.GAUGE):
    return lambda: F(name, description, kind)


def series(labels, name="probe_labels", kind=F.GAUGE, buckets=None):
    return lambda: F(name, "d", kind).Metric(labels=labels, buckets=buckets)


BAD = {
    "newline in description": family("desc_injected", "help\\ninjected_sample 1"),
    "Triton's family name": family("nv_inference_count", "mine", F.COUNTER),
    "non-ASCII name": family("caf\\u00e9_total", "d", F.COUNTER),
    "dash in name": family("bad-name"),
    "digit first": family("9lives"),
    "other model's kind": family("shared_family", "d", F.COUNTER),
    "bad label key": series({"bad-key": "v"}),
    "reserved label key": series({"__name__": "v"}),
    "non-ASCII label key": series({"k\\u00e9": "v"}),
    "newline in label value": series({"k": 'v"}\\ninjected_sample 1'}),
    "too many labels": series({f"k{i}": "v" for i in range(17)}),
    "le on a histogram": series({"le": "1"}, "probe_latency", F.HISTOGRAM, [1.0]),
    "clashing samples": family("probe_latency_count", "d", F.COUNTER),
    "too many series": lambda: [series({"n": str(i)}, "probe_many")() for i in range(4)],
}


class TritonPythonModel:
    def initialize(self, args):
        self.results = {}
        for case, attempt in BAD.items():
            try:
                attempt()
                self.results[case] = "accepted"
            except pb_utils.TritonModelException as exc:
                self.results[case] = "TritonModelException: " + str(exc)
        good = F("probe_good_total", 'calls, "quoted" \\\\ help', F.COUNTER)
        self.calls = good.Metric(labels={"model": args["model_name"], "path": 'a"b\\\\c'})
        latency = F("probe_latency", "a histogram", F.HISTOGRAM)
        self.latency = latency.Metric(labels={}, buckets=[0.5, 2.0])

    def execute(self, requests):
        self.calls.increment(1)
        self.latency.observe(1.0)
        text = json.dumps(self.results).encode()
        out = pb_utils.Tensor("RESULTS", np.array([text], dtype=object))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""


def build_metrics_probe(repo: Path) -> Path:
    """The `first` and `probe` models (load `first` before `probe`); returns `repo`."""
    for name, source in (("first", METRICS_FIRST_MODEL), ("probe", METRICS_PROBE_MODEL)):
        write_python_model(repo, name, source, METRICS_CONFIG.format(name=name))
    return repo
