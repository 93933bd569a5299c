"""docs/survival.md claims only what a test shows: each row names tests, and each named test exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)(?:\[[^\]]*\])?`")


def _rows() -> list[str]:
    lines = (ROOT / "docs" / "survival.md").read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith(("| failure", "| ---"))]


def test_every_row_names_tests_that_exist() -> None:
    rows = _rows()
    assert len(rows) >= 15
    for row in rows:
        shown_by = row.rstrip(" |").rsplit(" | ", 1)[-1]
        named = NAMED.findall(shown_by)
        assert named, f"this row names no test: {row[:80]}"
        module = None
        for path, name in named:
            module = path or module  # `::name` is another test of the module named before it
            assert module is not None, row[:80]
            tree = ast.parse((ROOT / module).read_text())
            tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in tests, f"docs/survival.md names {module}::{name}, which does not exist"
