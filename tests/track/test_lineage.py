"""Lineage: the chain of parents a run comes from, and the runs that come from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fwk.track import lineage
from fwk.track.index import query
from tests.track.fake_runs import make_run


def _derive(root: Path, run_id: str, parent: str, kind: str = "replay") -> None:
    run = make_run(root, run_id)
    meta = json.loads(run.meta.read_text())
    run.meta.write_text(json.dumps({**meta, "parent": parent, "kind": kind}))


def test_chain_children_and_a_removed_ancestor(tmp_path: Path) -> None:
    make_run(tmp_path, "a0")
    _derive(tmp_path, "b1", "a0")
    _derive(tmp_path, "c2", "b1")
    _derive(tmp_path, "d3", "a0")
    c2 = lineage.RunDir(tmp_path / "c2")
    assert lineage.chain_text(lineage.ancestors(c2)) == "a0 -> b1 (replay) -> c2 (replay)"
    kids = lineage.children(tmp_path, query(tmp_path), "a0")
    assert [(k["id"], k["kind"]) for k in kids] == [("b1", "replay"), ("d3", "replay")]
    shutil.rmtree(tmp_path / "a0")
    assert lineage.chain_text(lineage.ancestors(c2)) == "a0 (removed) -> b1 (replay) -> c2 (replay)"


def test_a_parent_loop_ends(tmp_path: Path) -> None:
    _derive(tmp_path, "x", "y")
    _derive(tmp_path, "y", "x")  # edited by hand into a loop: listed once, no hang
    assert [link["id"] for link in lineage.ancestors(lineage.RunDir(tmp_path / "x"))] == ["y", "x"]
