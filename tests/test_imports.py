"""Everything imports as a package, from the repository's root: nothing edits ``sys.path``.

A file that puts a folder on ``sys.path`` to import its neighbours makes a second way for a
module to load: under another name, or as ``__main__`` and again by its name, with two
copies of every class in it. So no Python file of fwk, the benchmarks, the scripts, the
tests or the docs inserts, appends or assigns to ``sys.path`` (or calls
``site.addsitedir``), in its code or in code it hands to ``python -c`` as a string; reading
``sys.path`` is fine (fwk's plugin folders are found that way). A child process that must
import the checkout gets ``PYTHONPATH`` or the root as its working folder instead.

And the benchmarks package has no import cycle among its modules, nor a module that imports
itself: then no module run with ``python -m benchmarks.X`` is loaded a second time by its
own imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layers import cycles

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["fwk", "benchmarks", "scripts", "tests", "docs"]
EDITS = {"insert", "append", "extend", "remove", "pop", "clear"}
# the same edits in the text of code a file runs elsewhere (python -c "...")
EDIT_TEXT = re.compile(r"\bsys\.path(\.(insert|append|extend)\s*\(|\s*(\[[^\]]*\])?\s*\+?=(?!=))|\baddsitedir\(")


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"  # fmt: skip


def path_edits(source: str) -> list[int]:
    """The lines of ``source`` that change ``sys.path``, in its code or in its strings."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr in EDITS and _is_sys_path(func.value)) or func.attr == "addsitedir":
                found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if _is_sys_path(target) or (isinstance(target, ast.Subscript) and _is_sys_path(target.value)):
                    found.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and EDIT_TEXT.search(node.value):
            found.append(node.lineno)
    return sorted(set(found))


def test_no_file_edits_sys_path() -> None:
    files = [p for folder in CHECKED for p in sorted((ROOT / folder).rglob("*.py")) if p != Path(__file__)]
    assert len(files) > 200  # the walk found the repository
    edits = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in path_edits(p.read_text())]
    assert edits == [], "import from the root as a package, or give the child PYTHONPATH:\n" + "\n".join(edits)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(module: str, is_package: bool, source: str, modules: set[str], top: str) -> set[str]:
    """The modules of package ``top`` that ``source`` (of ``module``) imports, relative imports
    resolved: ``from top import x`` is ``top.x`` when that is a module, else ``top``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m == top or m.startswith(f"{top}.")} & modules


def benchmark_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / "benchmarks").rglob("*.py")}
    return {
        m: imports_of(m, p.name == "__init__.py", p.read_text(), set(files), "benchmarks") for m, p in files.items()
    }


def test_the_benchmarks_import_no_cycle_and_no_module_itself() -> None:
    edges = benchmark_graph()
    assert {"benchmarks.harness", "benchmarks.gpu.check", "benchmarks.gpu.part"} <= set(edges)
    assert "benchmarks.harness" in edges["benchmarks.__main__"]  # the walk sees the imports
    assert [m for m, targets in edges.items() if m in targets] == []
    assert cycles(edges) == []


def test_the_checks_catch_an_edit_and_resolve_relative_imports() -> None:
    source = (
        "import sys\nprint(sys.path[0])\nfor p in sys.path:\n    pass\n"  # reads: fine
        "sys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path += ['z']\n"
        "code = f\"import sys; sys.path.insert(0, {'r'!r}); import tests\"\n"
        "import site\nsite.addsitedir('w')\n"
    )
    assert path_edits(source) == [5, 6, 7, 8, 10]
    modules = {"benchmarks", "benchmarks.common", "benchmarks.gpu", "benchmarks.gpu.part", "benchmarks.gpu.check"}
    source = "from . import part\nfrom ..common import x\nfrom benchmarks import gpu\nimport os\n"
    got = imports_of("benchmarks.gpu.check", False, source, modules, "benchmarks")
    assert got == {"benchmarks.gpu.part", "benchmarks.common", "benchmarks.gpu"}
    two = {"benchmarks.gpu.check": {"benchmarks.gpu.parts"}, "benchmarks.gpu.parts": {"benchmarks.gpu.check"}}
    assert cycles(two) == [["benchmarks.gpu.check", "benchmarks.gpu.parts"]]
