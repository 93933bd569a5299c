"""The house rules that a reader of the code relies on, checked on every file.

Functions fit a screen: no function in fwk/ runs over 80 lines, nested functions counted
in their parent. And a clone explains itself: no file cites a document that is not in the
repository, or an issue number, since neither is there for the reader to open. The design
the code follows is summarized in docs/design.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST = 80
# Where the code, its tests, its benchmarks, its config and its docs live
CHECKED = ["fwk", "tests", "benchmarks", "scripts", "docs", "conf", "recipes"]
# The project's design documents by their names (capitals: docs/design.md is the repository's own)
OUTSIDE = re.compile(r"\.\./shared|(?-i:\bDESIGN\.md|\bSTYLE\.md)|design notes|\bissues? #?\d+|\(#\d+\)", re.I)


def test_no_function_in_fwk_is_longer_than_a_screen() -> None:
    long = []
    for path in sorted((ROOT / "fwk").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], "split these by meaning:\n" + "\n".join(long)


def test_every_reference_resolves_inside_the_repository() -> None:
    found = []
    files = [p for d in CHECKED for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".md", ".yaml", ".sh", ".sbatch"}]
    for path in [*files, ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]:
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == [], "cite docs/design.md or say it in plain words:\n" + "\n".join(found)
