"""The import rules of docs/architecture.md, read from the source with `ast`.

Every `.py` file of the product packages, harness/, bench/ and examples/ is parsed; its imports
(module level and inside functions, `if TYPE_CHECKING:` included: a circle of type hints is still
a circle for the reader) become edges of a module graph. The rules below are checked on that graph,
so a layering mistake fails here with the file, the import and the rule, before review.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"

PRODUCT = ("protocol", "backends", "npu", "scheduler", "repository", "server")
SUPPORT = ("harness", "bench", "examples")
# The model-side API a Triton Python model imports under Triton's name; part of backends/python.
TOP_MODULES = {"triton_python_backend_utils": "backends"}
OUTSIDE = ("tests",)  # never scanned, never importable from what is scanned

# Which top-level package may import which (itself always). Stricter than "protocol imports no
# scheduler/server/repository": each layer sees only the layers below it.
ALLOWED: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "backends": frozenset({"protocol"}),
    "npu": frozenset({"protocol", "backends"}),
    "scheduler": frozenset({"protocol", "backends"}),
    "repository": frozenset({"protocol", "backends", "scheduler"}),
    "server": frozenset(PRODUCT),
    "harness": frozenset(PRODUCT + ("examples",)),
    "examples": frozenset(PRODUCT),
    "bench": frozenset(PRODUCT + ("harness", "examples")),
}

# Edges forbidden between sub-packages (prefix -> forbidden prefixes, and why).
FORBIDDEN: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "server.core",
        ("server.http", "server.grpc", "server.net", "server.multiprocess"),
        "server/core is what the frontends call; it knows no frontend or transport",
    ),
    (
        "server.http",
        ("server.grpc", "server.multiprocess"),
        "the frontends are independent of each other; both use server/core",
    ),
    (
        "server.grpc",
        ("server.http", "server.multiprocess"),
        "the frontends are independent of each other; both use server/core",
    ),
    (
        "server.net",
        ("server.http", "server.grpc", "server.core", "server.multiprocess"),
        "server/net is the transport under both frontends; it builds no frontend",
    ),
    (
        "server.observability",
        (
            "server.core",
            "server.http",
            "server.grpc",
            "server.net",
            "server.multiprocess",
            "server.traffic",
        ),
        "server/observability is a leaf the core and the composition root use",
    ),
    (
        "server.traffic",
        (
            "server.core",
            "server.http",
            "server.grpc",
            "server.net",
            "server.multiprocess",
            "server.observability",
        ),
        "server/traffic is a leaf the infer path uses",
    ),
    (
        "protocol.rest",
        ("protocol.grpc", "protocol.proto.grpc_service_pb2_grpc"),
        "the two codecs are independent of each other",
    ),
    ("protocol.grpc", ("protocol.rest",), "the two codecs are independent of each other"),
    (
        "protocol.proto",
        ("protocol.rest", "protocol.grpc"),
        "generated code depends on nothing hand-written",
    ),
)
# protocol/'s own modules (types, errors, datatypes, ...) sit under both codecs.
PROTOCOL_CODECS = ("protocol.rest", "protocol.grpc")
# The composition roots: only the entry points import them.
ROOTS = {"server.app": {"server.cli"}, "server.cli": {"server.__main__"}}
# A Python model worker starts in a fresh interpreter per model: it imports only its own code.
WORKER = ("backends.python.worker", "backends.python.wire")
WORKER_MAY = ("backends.python.worker", "backends.python.wire", "triton_python_backend_utils")

ACL = "acl"
GRPC = ("grpc", "grpc_health", "grpc_status", "grpc_reflection")
FRAMEWORKS = GRPC + ("fastapi", "starlette", "uvicorn", "httptools")
FRAMEWORK_FREE = (
    "protocol",
    "backends",
    "npu",
    "scheduler",
    "repository",
    "server.core",
    "server.traffic",
    "triton_python_backend_utils",
)

# Violations tolerated for now: none. An entry is (rule, importer, imported) exactly as the
# failure message names them, with a comment saying why and until when; a stale entry fails.
TOLERATED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Import:
    """One import statement's target, as the importer wrote it and as it resolves."""

    importer: str
    path: str  # the importer's file, relative to the repository root
    line: int
    target: str  # the module imported (or the module a `from` import reads from)
    internal: str | None  # the scanned module it resolves to, or None for a third-party one
    private: str | None = None  # a `_name` taken from another module


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> Iterator[Path]:
    for top in PRODUCT + SUPPORT:
        yield from sorted(p for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)
    for name in TOP_MODULES:
        yield ROOT / f"{name}.py"


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The scanned module `name` lives in: itself, or its longest scanned prefix."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.AST, importer: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """(module, private name taken from it) for each import in `node`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
    elif isinstance(node, ast.ImportFrom):
        module = _absolute(importer, is_package, node)
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            yield f"{module}.{alias.name}", alias.name if private else None
    elif (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None))
        in ("import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        yield node.args[0].value, None


@cache
def graph() -> Graph:
    g = Graph()
    files = list(source_files())
    g.modules = {module_name(p): p for p in files}
    for path in files:
        importer = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for target, private in _targets(node, importer, path.name == "__init__.py"):
                internal = _owner(target, g.modules)
                if private is not None:
                    target = target.rpartition(".")[0]  # the module the name is taken from
                    internal = _owner(target, g.modules)
                elif internal is not None and internal != target and internal == importer:
                    internal = None  # `from . import x` of a non-module name: no edge
                g.imports.append(
                    Import(
                        importer,
                        str(path.relative_to(ROOT)),
                        getattr(node, "lineno", 0),
                        target,
                        internal,
                        f"{target}.{private}" if private else None,
                    )
                )
        g.imports.extend(_private_attributes(tree, importer, path, g.modules))
    return g


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _private_attributes(
    tree: ast.AST, importer: str, path: Path, modules: dict[str, Path]
) -> Iterator[Import]:
    """`import x` or `from p import x`, then `x._name`: the same private reach, spelled late."""
    bound: dict[str, str] = {}  # local name -> scanned module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    bound[alias.asname or alias.name] = alias.name
                elif alias.asname is None:
                    top = alias.name.split(".")[0]
                    bound.setdefault(top, top)  # `import a.b` binds `a`; `a.b._x` below
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(importer, path.name == "__init__.py", node)
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        dotted = _dotted(node.value)
        if dotted is None or dotted.split(".")[0] not in bound:
            continue
        head, _, rest = dotted.partition(".")
        target = bound[head] + (f".{rest}" if rest else "")
        if target in modules and target != importer:
            yield Import(
                importer,
                str(path.relative_to(ROOT)),
                node.lineno,
                target,
                target,
                f"{target}.{node.attr}",
            )


def group(module: str) -> str:
    top = module.split(".")[0]
    return TOP_MODULES.get(top, top)


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def where(imp: Import) -> str:
    return f"{imp.path}:{imp.line} ({imp.importer}) imports {imp.target}"


def failures(found: list[tuple[tuple[str, str, str], str]]) -> list[str]:
    """The messages of violations not on the TOLERATED list."""
    return sorted({msg for key, msg in found if key not in TOLERATED})


def edges() -> Iterator[tuple[Import, str]]:
    """Each import between two different scanned modules, with the module it reaches."""
    for imp in graph().imports:
        if imp.internal is not None and imp.internal != imp.importer:
            yield imp, imp.internal


def test_the_scan_sees_the_tree() -> None:
    g = graph()
    assert "server.app" in g.modules and "protocol.types" in g.modules
    assert any(i.importer == "npu.acl" and i.target == ACL for i in g.imports), "import_module"
    assert any(i.importer == "server.app" and i.internal for i in g.imports)


def test_packages_import_only_the_layers_below() -> None:
    found = []
    for imp in graph().imports:
        own, theirs = group(imp.importer), group(imp.internal or imp.target)
        if imp.internal is None and theirs not in OUTSIDE:
            continue  # third party or standard library
        if own != theirs and theirs not in ALLOWED[own]:
            allowed = ", ".join(sorted(ALLOWED[own])) or "nothing outside itself"
            rule = f"{own}/ may import only {allowed}"
            found.append(((own, imp.importer, imp.target), f"{where(imp)}: {rule}"))
    assert not failures(found), "\n".join(failures(found))


def test_sub_package_edges() -> None:
    found = []
    for imp, target in edges():
        for prefix, banned, why in FORBIDDEN:
            if under(imp.importer, prefix) and any(under(target, b) for b in banned):
                key = (prefix, imp.importer, target)
                found.append((key, f"{where(imp)}: {why}"))
        codec = any(under(imp.importer, c) for c in PROTOCOL_CODECS + ("protocol.proto",))
        if group(imp.importer) == "protocol" and not codec:
            if any(under(target, c) for c in PROTOCOL_CODECS):
                why = "protocol/'s shared modules sit under the codecs, never import them"
                found.append((("protocol", imp.importer, target), f"{where(imp)}: {why}"))
        if target in ROOTS and imp.importer not in ROOTS[target]:
            why = f"{target} is a composition root; only {sorted(ROOTS[target])} import it"
            found.append((("roots", imp.importer, target), f"{where(imp)}: {why}"))
        if any(under(imp.importer, w) for w in WORKER) and not any(
            under(target, w) for w in WORKER_MAY
        ):
            why = "a Python model worker imports only backends/python/{worker,wire} (fast start)"
            found.append((("worker", imp.importer, target), f"{where(imp)}: {why}"))
    assert not failures(found), "\n".join(failures(found))


def test_acl_only_in_npu_acl() -> None:
    bad = [
        where(i) + ": only npu/acl.py imports pyACL (npu/ reaches it through that module)"
        for i in graph().imports
        if i.internal is None and i.target.split(".")[0] == ACL and i.importer != "npu.acl"
    ]
    assert not bad, "\n".join(bad)


def test_grpc_in_protocol_only_in_generated_code() -> None:
    bad = [
        where(i) + ": in protocol/ only the generated protocol/proto/*_pb2_grpc.py import grpc"
        for i in graph().imports
        if i.internal is None
        and i.target.split(".")[0] in GRPC
        and group(i.importer) == "protocol"
        and not fnmatch(i.path, "protocol/proto/*_pb2_grpc.py")
    ]
    assert not bad, "\n".join(bad)


def test_no_framework_below_the_frontends() -> None:
    bad = [
        where(i) + f": {prefix} imports no web or gRPC framework"
        for i in graph().imports
        for prefix in FRAMEWORK_FREE
        if i.internal is None
        and i.target.split(".")[0] in FRAMEWORKS
        and under(i.importer, prefix)
        and not fnmatch(i.path, "protocol/proto/*_pb2_grpc.py")
    ]
    assert not bad, "\n".join(bad)


def circles(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(adjacency):
        if start in index:
            continue
        work = [(start, iter(sorted(adjacency[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(adjacency.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    adjacency: dict[str, set[str]] = {m: set() for m in graph().modules}
    lines: dict[tuple[str, str], Import] = {}
    for imp, target in edges():
        adjacency[imp.importer].add(target)
        lines.setdefault((imp.importer, target), imp)
    found = []
    for component in circles(adjacency):
        members = set(component)
        inside = [lines[(a, b)] for a in component for b in sorted(adjacency[a] & members)]
        message = "import circle " + " <-> ".join(component) + ":\n    "
        message += "\n    ".join(where(i) for i in inside)
        # the circle is known when one of its edges is on the list (any edge names it)
        keys = {("circle", i.importer, i.internal or "") for i in inside}
        key = next(iter(sorted(keys & TOLERATED)), ("circle", component[0], ""))
        found.append((key, message))
    assert not failures(found), "\n".join(failures(found))


def test_no_private_name_from_another_module() -> None:
    found = []
    for imp in graph().imports:
        if imp.private and imp.internal is not None and imp.internal != imp.importer:
            message = f"{where(imp)}: takes {imp.private}, a private name of another module"
            found.append((("private", imp.importer, imp.private), message))
    assert not failures(found), "\n".join(failures(found))


def test_tolerated_entries_are_still_real() -> None:
    """An entry whose violation is gone must leave the list, so the list only shrinks."""
    g = graph()
    real = {(i.importer, i.internal or i.target) for i in g.imports}
    real |= {(i.importer, i.private) for i in g.imports if i.private}
    stale = sorted(k for k in TOLERATED if (k[1], k[2]) not in real)
    assert not stale, "TOLERATED names violations that are gone: " + repr(stale)


# The document: every package named, no path that does not exist.
PATH_TOKEN = re.compile(r"(?<![\w./:-])((?:[A-Za-z_][\w.-]*/)+(?:[\w.*{},-]*[\w*}])?/?)")


def packages() -> list[str]:
    found = []
    for top in PRODUCT + SUPPORT:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            found.append(str(init.parent.relative_to(ROOT)) + "/")
    return found


def doc_paths(text: str) -> set[str]:
    tops = {p.name for p in ROOT.iterdir()} - {".venv", ".git"}
    return {m for m in PATH_TOKEN.findall(text) if m.split("/")[0] in tops}


def expand(token: str) -> list[str]:
    """`a/{b,c}.py` -> `a/b.py`, `a/c.py`."""
    brace = re.search(r"\{([^{}]*)\}", token)
    if not brace:
        return [token]
    head, tail = token[: brace.start()], token[brace.end() :]
    return [x for part in brace.group(1).split(",") for x in expand(head + part + tail)]


def test_doc_names_every_package() -> None:
    text = DOC.read_text()
    missing = [p for p in packages() if f"`{p}`" not in text]
    assert not missing, f"{DOC.relative_to(ROOT)} names no line for: {missing}"


def test_doc_names_no_path_that_does_not_exist() -> None:
    text = DOC.read_text()
    wrong = sorted(
        path
        for token in doc_paths(text)
        for path in expand(token)
        if not list(ROOT.glob(path.rstrip("/")))
    )
    assert not wrong, f"{DOC.relative_to(ROOT)} names paths that do not exist: {wrong}"
