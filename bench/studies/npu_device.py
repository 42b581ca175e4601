"""The first run on an Atlas box: how fast the device runs an `.om`, and how close the server gets.

    python -m bench.studies.npu_device model.om [--device 0] [--config extra.pbtxt] [--out DIR]

1. Device only, per gear (each dynamic batch size, the static batch, or each image-size / dims
   gear): inputs copied to the device once and left there, the gear set once, then
   `execute_async` + `synchronize_stream` in a loop, as ais_bench measures a model (its number
   is device time only; this loop also pays the Python call, so it is a hair lower).
2. Served: the same model in a server of this checkout (backend "ascend", dynamic batching),
   driven by perf_analyzer over HTTP and gRPC at a few concurrencies.
3. The ratio: served inferences/s over the device-only rows/s at the largest gear.
4. For the hung-NPU timeout: whether this pyACL has `synchronize_stream_with_timeout`, each
   gear's slowest execution and the execution timeout it derives (npu/deadline.py).

It writes `npu_device.json` and `npu_device.md` to --out: send both back. `--config` adds text
to the generated config.pbtxt (e.g. the aipp_* parameters of a dynamic-AIPP model, or the
`input_shape` parameter of a --dynamic_dims model whose gears fit several input orders);
`--perf-args` adds perf_analyzer flags (e.g. `--shape image:3,640,640` for dynamic HW,
`--shape image:960,640,1` for a YUV420SP source through static AIPP, 1.5 x H rows, or
`--shape ids:1,16 --shape mask:1,16` for dynamic dims). Every kind the backend serves runs here:
each image-size gear of a YUV420SP model in its source layout. A model requests cannot be
stacked for (dynamic dims, static side inputs without a leading 1) is served without dynamic
batching.
Without perf_analyzer (PERF_ANALYZER or on PATH) step 2 is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from bench.served import CONVERGE_FLAGS, read_csv, run_command
from npu import acl as npu_acl
from npu import aipp as npu_aipp
from npu import config as npu_config
from npu.deadline import ExecutionDeadline
from npu.description import ModelDescription
from npu.device import DeviceSession
from npu.om_model import OmModel
from protocol.proto.model_config_pb2 import ModelConfig

DEFAULT_LOOPS = 200
DEFAULT_CONCURRENCY = (1, 4, 16)
MODEL_NAME = "npu_bench"


def gear_inputs(info: ModelDescription) -> list[tuple[str, list[np.ndarray], int | None]]:
    """(label, model-order input arrays, rows) for every gear, random but deterministic."""
    rng = np.random.default_rng(0)

    def fill(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if dtype.kind == "f":
            return rng.random(shape).astype(dtype)
        return rng.integers(0, 8, size=shape).astype(dtype)

    runs = []
    if info.shape_gears:
        for gear in info.shape_gears:
            arrays = [
                fill(shape, t.acl_type.numpy) for t, shape in zip(info.inputs, gear, strict=False)
            ]
            rows = info.static_batch_size
            label = " ".join(f"{t.name}{list(s)}" for t, s in zip(info.inputs, gear, strict=False))
            runs.append((label, arrays, rows))
        return runs
    for rows in info.batch_sizes or (None,):
        arrays = [
            fill(((rows,) + t.row_dims) if rows and t.batched else t.dims, t.acl_type.numpy)
            for t in info.inputs
        ]
        runs.append((f"batch {rows}" if rows else "static", arrays, rows))
    return runs


def device_only(
    path: Path,
    device_id: int,
    loops: int,
    aipp: npu_aipp.AippSettings | None,
    input_shape: str | None = None,
    described: list[ModelDescription] | None = None,
) -> list[dict[str, Any]]:
    """Per gear: executions/s and rows/s with the inputs resident on the device. `input_shape`
    is the config parameter of that name (dims gears); the loaded model's description is
    appended to `described` when given."""
    results: list[dict[str, Any]] = []
    failure: list[BaseException] = []

    def work() -> None:
        acl = npu_acl.load()
        session = DeviceSession.open(acl, device_id)
        model = None
        try:
            model = OmModel.load(session, path, aipp, input_shape)
            if described is not None:
                described.append(model.info)
            for label, arrays, rows in gear_inputs(model.info):
                model.run(arrays, rows)  # copies the inputs in and sets the gear
                session.deadline = ExecutionDeadline()  # this gear's slowest wait alone
                with session.running():
                    start = time.perf_counter()
                    for _ in range(loops):
                        model._execute()  # the inputs and the gear stay as they are
                    seconds = time.perf_counter() - start
                per_run = rows or 1
                results.append(
                    {
                        "gear": label,
                        "rows": per_run,
                        "loops": loops,
                        "ms_per_execution": 1000 * seconds / loops,
                        "rows_per_sec": per_run * loops / seconds,
                        "slowest_ms": 1000 * (session.deadline.slowest_s or 0.0),
                        "derived_timeout_ms": session.deadline.timeout_ms(),
                        "sync_with_timeout": hasattr(acl.rt, "synchronize_stream_with_timeout"),
                    }
                )
        except BaseException as exc:
            failure.append(exc)
        finally:
            problems = (model.close() if model else []) + session.close()
            if problems:
                print("release problems:", "; ".join(problems), file=sys.stderr)

    thread = threading.Thread(target=work, name="npu-device-bench")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return results


def write_repository(
    root: Path, om: Path, device_id: int, extra: str, batching: bool = True
) -> Path:
    model_dir = root / MODEL_NAME
    (model_dir / "1").mkdir(parents=True)
    shutil.copyfile(om, model_dir / "1" / "model.om")
    text = (
        f'name: "{MODEL_NAME}"\nbackend: "ascend"\n'
        f"instance_group [ {{ kind: KIND_GPU, count: 1, gpus: [ {device_id} ] }} ]\n"
        + ("dynamic_batching { max_queue_delay_microseconds: 2000 }\n" if batching else "")
        + extra
    )
    text_format.Parse(text, ModelConfig())  # a bad --config fails here, not in the server
    (model_dir / "config.pbtxt").write_text(text)
    return root


def served(
    om: Path,
    device_id: int,
    extra: str,
    perf_analyzer: str,
    concurrency: tuple[int, ...],
    out: Path,
    perf_args: list[str],
    batching: bool = True,
) -> list[dict[str, Any]]:
    """perf_analyzer against a server of this checkout serving the model."""
    from harness.serverproc import running_server

    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp), om, device_id, extra, batching)
        with running_server([repo], log_dir=out) as server:
            for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
                for level in concurrency:
                    csv_path = out / f"served-{protocol}-c{level}.csv"
                    command = [
                        perf_analyzer,
                        "-m",
                        MODEL_NAME,
                        "-i",
                        protocol,
                        "-u",
                        url,
                        "--concurrency-range",
                        str(level),
                        *CONVERGE_FLAGS,
                        *perf_args,
                        "-f",
                        str(csv_path),
                    ]
                    code, output = run_command(command, timeout=300)
                    (out / f"served-{protocol}-c{level}.log").write_text(output)
                    point: dict[str, Any] = {
                        "protocol": protocol,
                        "concurrency": level,
                        "command": " ".join(command),
                    }
                    if code == 0 and csv_path.exists():
                        row = read_csv(csv_path)
                        point.update(
                            infer_per_sec=float(row["Inferences/Second"]),
                            p99_us=float(row["p99 latency"]),
                        )
                    else:
                        point["error"] = f"exit {code}: {output.strip().splitlines()[-1:]}"
                    points.append(point)
    return points


def report(om: Path, device: list[dict], points: list[dict], note: str) -> str:
    lines = [
        f"# NPU device check: {om.name}",
        "",
        "| gear | ms/execution | rows/s |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {d['gear']} | {d['ms_per_execution']:.3f} | {d['rows_per_sec']:.1f} |" for d in device
    ]
    best = device[-1]["rows_per_sec"] if device else 0.0
    lines += [
        "",
        "| protocol | concurrency | infer/s | p99 µs | served / device |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in points:
        if "error" in p:
            lines.append(f"| {p['protocol']} | {p['concurrency']} | {p['error']} | | |")
        else:
            ratio = p["infer_per_sec"] / best if best else 0.0
            lines.append(
                f"| {p['protocol']} | {p['concurrency']} | {p['infer_per_sec']:.1f} | "
                f"{p['p99_us']:.0f} | {ratio:.2f} |"
            )
    if device:
        worst = max(device, key=lambda d: d["slowest_ms"])
        has = "has" if worst["sync_with_timeout"] else "has NOT"
        lines += [
            "",
            f"Hung-NPU timeout: this pyACL {has} acl.rt.synchronize_stream_with_timeout; the "
            f"slowest execution took {worst['slowest_ms']:.3f} ms (gear {worst['gear']}), so "
            f"the derived execution timeout is {worst['derived_timeout_ms']} ms "
            "(npu/deadline.py; the config parameter execution_timeout_ms overrides it).",
        ]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("om", type=Path)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--loops", type=int, default=DEFAULT_LOOPS)
    parser.add_argument("--config", type=Path, help="text added to the generated config.pbtxt")
    parser.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    parser.add_argument(
        "--perf-analyzer", default=os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    )
    parser.add_argument(
        "--perf-args",
        default="",
        help="more perf_analyzer flags, e.g. '--shape image:3,640,640' for a "
        "model with dynamic image size",
    )
    parser.add_argument("--out", type=Path, default=Path("npu_device_report"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = args.config.read_text() if args.config else ""
    config = text_format.Parse('name: "x"\n' + extra, ModelConfig())
    described: list[ModelDescription] = []
    device = device_only(
        args.om,
        args.device,
        args.loops,
        npu_aipp.settings_from_config(config),
        npu_config.input_shape(config),
        described,
    )
    batching = bool(described) and described[0].stackable
    note, points = "", []
    if args.perf_analyzer:
        points = served(
            args.om,
            args.device,
            extra,
            args.perf_analyzer,
            tuple(int(c) for c in args.concurrency.split(",")),
            args.out,
            shlex.split(args.perf_args),
            batching,
        )
    else:
        note = "served: not measured (no perf_analyzer: set PERF_ANALYZER or put it on PATH)"
    text = report(args.om, device, points, note)
    (args.out / "npu_device.md").write_text(text)
    (args.out / "npu_device.json").write_text(
        json.dumps(
            {"om": str(args.om), "device_only": device, "served": points, "note": note}, indent=1
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
