"""The house stays layered: read from the code's own imports (every one, those inside
functions too), no file imports one of a higher floor, and no files import each other in
a cycle. The floors, from the ground up (docs/architecture.md):

    fwk/__init__ (the version), errors, registry, log
    distributed
    config, data, models, track, kernels, optim
    strategies, methods, components
    engine
    launch, export, profile, serve
    cli, __main__

The benchmarks and the tests stand above all of them: fwk imports neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fwk"
FLOORS = [
    {"", "errors", "registry", "log"},
    {"distributed"},
    {"config", "data", "models", "track", "kernels", "optim"},
    {"strategies", "methods", "components"},
    {"engine"},
    {"launch", "export", "profile", "serve"},
    {"cli", "__main__"},
]


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """``fwk.strategies.fsdp`` -> ``strategies``; ``fwk`` -> ``""``."""
    return module.split(".")[1] if "." in module else ""


def floor(module: str) -> int:
    room = _room(module)
    found = [i for i, rooms in enumerate(FLOORS) if room in rooms]
    assert found, f"{module}: the room '{room}' is on no floor; add it to FLOORS (and to docs/architecture.md's floors)"
    return found[0]


def imports(modules: set[str], source: str) -> set[str]:
    """The fwk modules ``source`` imports: ``from fwk.a import b`` is ``fwk.a.b`` when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "fwk"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "fwk":
            assert node.module is not None
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
    return found & modules


def graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(set(files), p.read_text()) - {m} for m, p in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        group.append(top)
                        if top == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_file_imports_a_higher_floor() -> None:
    edges = graph()
    assert len(edges) > 100  # the walk found the package
    climbs = sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets if floor(b) > floor(a))
    assert climbs == []


def test_no_import_cycles_between_files() -> None:
    assert cycles(graph()) == []


def test_fwk_imports_neither_the_benchmarks_nor_the_tests() -> None:
    """The benchmarks and the tests stand on fwk: a wheel of fwk carries neither."""
    above = {"benchmarks", "tests"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [f"{path.relative_to(PACKAGE.parent)}: {n}" for n in names if n.split(".")[0] in above]
    assert found == []


def test_the_checks_catch_a_climb_and_a_cycle() -> None:
    """The walk itself: imports inside functions count, and a two-file cycle is found."""
    modules = {"fwk.engine.trainer", "fwk.strategies.fsdp", "fwk.cli.train", "fwk.data.loader"}
    source = "import os\ndef f():\n    from fwk.cli import train\n    from fwk.strategies.fsdp import shard\n"
    assert imports(modules, source) == {"fwk.cli.train", "fwk.strategies.fsdp"}
    assert floor("fwk.cli.train") > floor("fwk.engine.trainer") > floor("fwk.strategies.fsdp")
    two = {"fwk.data.loader": {"fwk.data.images"}, "fwk.data.images": {"fwk.data.loader"}, "fwk.errors": set()}
    assert cycles(two) == [["fwk.data.images", "fwk.data.loader"]]
    with pytest.raises(AssertionError, match="on no floor"):
        floor("fwk.nowhere.module")
