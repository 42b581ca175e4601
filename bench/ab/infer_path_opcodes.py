"""Python bytecodes one in-process infer runs on the one infer path (`InferencePath.infer`), for
any source tree: a count that machine noise cannot move.

Why: a refactor of the path (resolve, route, count in flight, submit, select outputs) costs or
saves a handful of bytecodes per request, far below what a timing on a shared 2-core machine can
resolve. This builds the registry of `bench/studies/traffic_routing.py` (three versions of a
one-input model over a scheduler that validates and answers at once) from `--tree`, warms it,
and counts opcode events (sys.settrace) for single requests with no traffic policy.

    .venv/bin/python -m bench.ab.infer_path_opcodes [--tree ../base-checkout] [--by-function]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Where the registry builder lives, in this tree and in trees older than bench/studies/.
BUILDERS = ("bench.studies.traffic_routing", "bench.traffic_routing")


def count_in_this_process(by_function: bool) -> None:
    """Runs inside the measured tree's interpreter (the tree first on sys.path)."""
    import numpy as np

    from protocol.types import InferRequest, Tensor

    builder: Any = None
    for name in BUILDERS:
        try:
            builder = importlib.import_module(name)
            break
        except ModuleNotFoundError:
            continue
    assert builder is not None, "no traffic_routing module in this tree"
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            # co_qualname is 3.11+; 3.10 (requires-python) has only the bare name.
            code = frame.f_code
            counts[getattr(code, "co_qualname", code.co_name)] += 1
        return tracer

    async def run() -> list[int]:
        # `build_path` in this tree; trees before it was public called it `_path`.
        build = getattr(builder, "build_path", None) or getattr(builder, "_path")  # noqa: B009
        path = build()
        x = Tensor("X", "FP32", (1,), np.zeros(1, np.float32))
        for _ in range(100):  # warm caches (dataclass __init__s, lazy imports)
            await path.infer(InferRequest("m", inputs=[x]))
        totals = []
        for _ in range(5):
            counts.clear()
            request = InferRequest("m", inputs=[x])
            sys.settrace(tracer)
            await path.infer(request)
            sys.settrace(None)
            totals.append(sum(counts.values()))
        return totals

    totals = asyncio.run(run())
    print(f"opcodes per infer: {totals[-1]} (5 requests: {totals})")
    if by_function:
        for name, n in counts.most_common(15):
            print(f"  {n:5d}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree to measure")
    parser.add_argument("--by-function", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        count_in_this_process(args.by_function)
        return 0
    tree = args.tree.resolve()
    command = [sys.executable, "-c", _CHILD, str(tree), str(ROOT)]
    if args.by_function:
        command.append("--by-function")
    return subprocess.run(command, cwd=tree, check=False).returncode


# The measured tree goes first on the path; this tool's own module is loaded from this tree.
_CHILD = """
import sys, importlib.util
tree, tool_root, *rest = sys.argv[1:]
sys.path[:0] = [tree]
spec = importlib.util.spec_from_file_location(
    "infer_path_opcodes", tool_root + "/bench/ab/infer_path_opcodes.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.count_in_this_process("--by-function" in rest)
"""


if __name__ == "__main__":
    raise SystemExit(main())
