"""Finding a run by id, unique prefix, or as the newest complete run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fwk.errors import UserError
from fwk.track.lookup import closest, find_run


def _run(root: Path, run_id: str, complete: bool, finished_at: float = 0.0) -> Path:
    path = root / run_id
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("seed: 0\n")
    if complete:
        (path / "summary.json").write_text("{}")
        os.utime(path / "summary.json", (finished_at, finished_at))
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _run(tmp_path, "a1b2c3d4e5", complete=True, finished_at=1000)
    _run(tmp_path, "a1ffffffff", complete=True, finished_at=3000)
    _run(tmp_path, "b7b7b7b7b7", complete=False)
    (tmp_path / "notarun").mkdir()  # no config.yaml: not a run
    return tmp_path


def test_exact_id_and_unique_prefix(root: Path) -> None:
    assert find_run(root, "a1b2c3d4e5").id == "a1b2c3d4e5"
    assert find_run(root, "a1b").id == "a1b2c3d4e5"
    assert find_run(root, "b7").id == "b7b7b7b7b7"  # found even though incomplete: the caller says so


def test_newest_complete_run_by_finish_time(root: Path) -> None:
    assert find_run(root, None).id == "a1ffffffff"  # b7... is newer on disk but not complete


def test_ambiguous_prefix_names_the_candidates(root: Path) -> None:
    with pytest.raises(UserError, match=r"prefix 'a1' matches 2 runs \(a1b2c3d4e5, a1ffffffff\); give more"):
        find_run(root, "a1")


def test_unknown_id_names_the_closest(root: Path) -> None:
    with pytest.raises(UserError) as err:
        find_run(root, "b7b8")
    assert str(err.value) == f"no run 'b7b8' under {root}; closest ids: b7b7b7b7b7, a1b2c3d4e5, a1ffffffff"
    assert closest("a1fff", ["b7b7b7b7b7", "a1ffffffff", "a1b2c3d4e5"], n=1) == ["a1ffffffff"]


def test_no_complete_run(tmp_path: Path) -> None:
    _run(tmp_path, "c0c0c0c0c0", complete=False)
    with pytest.raises(UserError, match="none of the 1 runs under .* is complete"):
        find_run(tmp_path, None)
