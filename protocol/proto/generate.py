"""Generate the Python modules for ``model_config.proto``, ``grpc_service.proto`` and
``traffic_service.proto`` (gray release, our own service).

Run ``python -m protocol.proto.generate`` (``make proto``) from the repository root after editing a
.proto file, and commit the regenerated modules with it; a unit test fails when they are stale.

protoc runs with ``-I protocol/proto`` so that the descriptor file names are exactly
``model_config.proto`` and ``grpc_service.proto``, as in Triton and tritonclient: both sides must
use the same names and package, or a process that loads both (our server code plus tritonclient in
tests) either gets duplicate-symbol errors or two unrelated ``inference.ModelConfig`` classes.
protoc writes sibling imports (``import model_config_pb2 as ...``) that only work when
``protocol/proto/`` is on ``sys.path``; they are rewritten to package imports
(``from protocol.proto import model_config_pb2 as ...``).

The generated ``*_pb2_grpc.py`` refuses to import on a grpcio older than the grpcio-tools that
wrote it, and ``*_pb2.py`` refuses a protobuf runtime older (or of another major version) than the
generator's. The check below keeps a regeneration from silently raising those floors above the
project's pins.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILES = ("model_config.proto", "grpc_service.proto", "traffic_service.proto")
GENERATED_FILES = (
    "model_config_pb2.py",
    "model_config_pb2.pyi",
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "grpc_service_pb2_grpc.py",
    "traffic_service_pb2.py",
    "traffic_service_pb2.pyi",
    "traffic_service_pb2_grpc.py",
)
PACKAGE = "protocol.proto"

# Floors pinned in pyproject.toml; the generated runtime guards must not ask for more.
GRPCIO_MIN = (1, 81, 1)
PROTOBUF_MAJOR = 6

_MODULES = tuple(name[: -len(".proto")] + "_pb2" for name in PROTO_FILES)
_SIBLING_IMPORT = re.compile(r"^import (" + "|".join(_MODULES) + r") as (\w+)$", flags=re.MULTILINE)
_GRPC_GUARD = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", flags=re.MULTILINE)
_PROTOBUF_GUARD = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
    r"\s*(\d+),\s*(\d+),\s*(\d+),"
)


class GenerationError(RuntimeError):
    """protoc failed, or its output would not run under the project's pinned versions."""


def _run_protoc(out_dir: Path) -> None:
    from grpc_tools import protoc  # imported here: only needed to generate

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(PROTO_DIR / name) for name in PROTO_FILES),
    ]
    code = protoc.main(args)
    if code != 0:
        raise GenerationError(f"protoc exited with {code}: {' '.join(args)}")


def rewrite_imports(source: str) -> str:
    """``import model_config_pb2 as x`` -> ``from protocol.proto import model_config_pb2 as x``."""
    return _SIBLING_IMPORT.sub(rf"from {PACKAGE} import \1 as \2", source)


def _parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def check_runtime_guards(name: str, source: str) -> None:
    """Fail when generated code would demand a newer grpcio or another protobuf major."""
    for match in _GRPC_GUARD.finditer(source):
        wanted = _parse_version(match.group(1))
        if wanted > GRPCIO_MIN:
            raise GenerationError(
                f"{name} requires grpcio>={match.group(1)} at import time, above the pinned "
                f"grpcio>={'.'.join(map(str, GRPCIO_MIN))}; generate with "
                f"grpcio-tools=={'.'.join(map(str, GRPCIO_MIN))} or raise the pin"
            )
    for match in _PROTOBUF_GUARD.finditer(source):
        major = int(match.group(1))
        if major != PROTOBUF_MAJOR:
            raise GenerationError(
                f"{name} was generated for protobuf {'.'.join(match.groups())}, but the project "
                f"pins protobuf {PROTOBUF_MAJOR}.x; use a grpcio-tools built on protobuf "
                f"{PROTOBUF_MAJOR}.x"
            )


def generate(out_dir: Path | str) -> list[Path]:
    """Generate the modules into ``out_dir`` and return their paths.

    Files are rewritten only when their content changes, so running it twice is a no-op.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="protoc-") as tmp:
        tmp_dir = Path(tmp)
        _run_protoc(tmp_dir)
        fresh: dict[str, str] = {}
        for name in GENERATED_FILES:
            path = tmp_dir / name
            if not path.is_file():
                raise GenerationError(f"protoc did not produce {name}")
            source = rewrite_imports(path.read_text(encoding="utf-8"))
            check_runtime_guards(name, source)
            fresh[name] = source
    for name, source in fresh.items():
        target = out_dir / name
        if not target.is_file() or target.read_text(encoding="utf-8") != source:
            # newline="" keeps protoc's "\n" line ends on every platform.
            with open(target, "w", encoding="utf-8", newline="") as handle:
                handle.write(source)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else PROTO_DIR
    try:
        paths = generate(out_dir)
    except GenerationError as exc:
        print(f"protocol.proto.generate: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
