"""Sections of bench/RESULTS.md written by the standalone benchmarks (between
`<!-- section:NAME -->` and `<!-- /section:NAME -->`), kept when bench/run.py rewrites the rest."""

from __future__ import annotations

import re
from pathlib import Path

_SECTION = re.compile(r"<!-- section:(?P<name>[\w-]+) -->.*?<!-- /section:(?P=name) -->\n?", re.S)


def replace_section(path: Path, name: str, body: str) -> None:
    """Write `body` as section `name` of `path`: in place when it is there, else at the end."""
    block = f"<!-- section:{name} -->\n{body.rstrip()}\n<!-- /section:{name} -->\n"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(
        rf"<!-- section:{re.escape(name)} -->.*?<!-- /section:{re.escape(name)}"
        rf" -->\n?",
        re.S,
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def carry_sections(report: str, path: Path) -> str:
    """`report` followed by the sections the file at `path` holds now."""
    if not path.exists():
        return report
    kept = [match.group(0) for match in _SECTION.finditer(path.read_text())]
    return report.rstrip("\n") + "\n\n" + "\n".join(kept) if kept else report
