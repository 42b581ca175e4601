"""A/B of the NPU backend's host-side cost per execution: `AscendBackend.execute` of tree A
against tree B, on one pyACL emulator (tree B's, the faithful one) with its device time, copy
time and gear-copy time set to zero, so that what is left is our code's Python between the
socket-side arrays and the device: gear choice, padding, copies' bookkeeping, the sync.

    python -m bench.ab.npu_path_ab --a OLD_TREE --b NEW_TREE [--rounds 5] [--calls 2000]

Each round runs A then B in fresh processes (interleaved, so a noisy neighbour hits both);
reported: the minimum and median µs per execute of each, and B / A. The model is written
by tree B's test fixtures, a dynamic-batch
FP32 [-1, 4] model at gears 1/2/4/8 and a static one, run at batch 3 (padded to gear 4).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from google.protobuf import text_format
from backends.base import InstanceSpec
from npu.backend import AscendBackend
from protocol.proto.model_config_pb2 import ModelConfig
import acl
free = {"gear_copy_s": 0.0} if hasattr(acl._emu.Config(), "gear_copy_s") else {}
acl._emu.configure(copy_bytes_per_s=0, **free)
model_dir, calls, batch = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
text = 'name: "m"\nbackend: "ascend"\nmax_batch_size: %d\n' % (8 if batch else 0)
config = text_format.Parse(text, ModelConfig())
AscendBackend.auto_complete(config, model_dir, model_dir / "1")
backend = AscendBackend(config, model_dir, model_dir / "1", InstanceSpec("m_0", "KIND_GPU", 0, 0))
backend.load()
x = {"INPUT0": np.ones((batch or 2, 4), dtype=np.float32)}
for _ in range(200):
    backend.execute(x)
start = time.perf_counter()
for _ in range(calls):
    backend.execute(x)
print(json.dumps((time.perf_counter() - start) / calls * 1e6))
backend.unload()
"""


def write_model(tree: Path, om: Path, gears: list[int] | None) -> None:
    """The emulator's .om, written by tree's own test fixtures in a process of its own (bench/
    imports nothing from tests/): INPUT0 [-1, 4] (or a static [2, 4]) -> 2x + 1, row sums."""
    call = (
        f"omf.scale_model({str(om)!r}, gears={gears!r}, latency_ms={{'fixed': 0, 'per_sample': 0}}"
        + (")" if gears else ", static_batch=2)")
    )
    subprocess.run(
        [sys.executable, "-c", f"from tests.support import om_fixtures as omf; {call}"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        check=True,
    )


def run(tree: Path, emulator: Path, model_dir: Path, calls: int, batch: int) -> float:
    env = {"PYTHONPATH": f"{emulator}:{tree}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_dir), str(calls), str(batch)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the old tree")
    parser.add_argument("--b", type=Path, required=True, help="the new tree (its emulator is used)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    emulator = args.b / "tests" / "npu" / "emulator"
    with tempfile.TemporaryDirectory() as tmp:
        for kind, gears, batch in (("dynamic batch, 3 rows", [1, 2, 4, 8], 3), ("static", None, 0)):
            model_dir = Path(tmp) / kind.split(",")[0].replace(" ", "_")
            (model_dir / "1").mkdir(parents=True)
            write_model(args.b, model_dir / "1" / "model.om", gears)
            times: dict[str, list[float]] = {"A": [], "B": []}
            for _ in range(args.rounds):
                times["A"].append(run(args.a, emulator, model_dir, args.calls, batch))
                times["B"].append(run(args.b, emulator, model_dir, args.calls, batch))
            a, b = times["A"], times["B"]
            ma, mb = statistics.median(a), statistics.median(b)
            print(
                f"{kind}: A min {min(a):.1f} med {ma:.1f} µs, B min {min(b):.1f} med {mb:.1f} "
                f"µs, B/A min {min(b) / min(a):.2f} med {mb / ma:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
