"""How `fwk replay` compares two runs, and what it refuses (other code, other data)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from fwk.errors import UserError
from fwk.track import replay as rp
from fwk.track.store import RunDir


def _run(root: Path, name: str, rows: list[dict]) -> RunDir:
    run = RunDir(root / name)
    run.path.mkdir(parents=True)
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


ROWS = [
    {"step": 2, "kind": "train", "loss": 2.0, "lr": 0.1, "samples_per_s": 100.0, "data_wait": 0.1},
    {"step": 4, "kind": "train", "loss": 1.5, "lr": 0.05, "samples_per_s": 120.0, "data_wait": 0.2},
    {"step": 4, "kind": "eval", "val_loss": 1.6, "val_acc": 0.5},
]


def test_identical_runs_ignore_timings(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", ROWS)
    b = _run(tmp_path, "b", [{**r, "samples_per_s": 1.0, "data_wait": 0.9} if "lr" in r else r for r in ROWS])
    c = rp.compare(a, b)
    assert (c.rows, c.values, c.differing, c.largest) == (3, 6, 0, None)
    assert c.identical and c.within(0.0)


def test_largest_difference_is_relative_to_the_larger_value(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", ROWS)
    rows = [dict(r) for r in ROWS]
    rows[0]["loss"] = 2.0 + 1e-6  # 5e-7 relative
    rows[2]["val_acc"] = 0.52  # 0.02 relative to max(1, 0.52)
    c = rp.compare(a, _run(tmp_path, "b", rows))
    assert c.differing == 2 and not c.identical
    big = c.largest
    assert (big.kind, big.step, big.key, big.a, big.b) == ("eval", 4, "val_acc", 0.5, 0.52)
    assert big.relative == pytest.approx(0.02)
    assert c.within(0.02 + 1e-12) and not c.within(0.01)


def test_missing_rows_and_non_finite_values(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", [*ROWS, {"step": 6, "kind": "train", "loss": float("nan"), "lr": 0.0}])
    # the replay lacks the original's step 6: not identical, not within any tolerance
    c = rp.compare(a, _run(tmp_path, "b", ROWS))
    assert c.only_a == [("train", 6)] and not c.identical and not c.within(1.0)
    # NaN equals NaN (a dropped step logs NaN in both); a value that became NaN is infinitely far
    c = rp.compare(a, _run(tmp_path, "c", [*ROWS, {"step": 6, "kind": "train", "loss": float("nan"), "lr": 0.0}]))
    assert c.identical
    c = rp.compare(_run(tmp_path, "d", ROWS[:1]), _run(tmp_path, "e", [{**ROWS[0], "loss": float("nan")}]))
    assert math.isinf(c.largest.relative)
    # a replay of an unfinished run logs more: compared where both logged
    c = rp.compare(_run(tmp_path, "f", ROWS[:2]), a)
    assert c.identical and c.only_b == [("eval", 4), ("train", 6)]


def test_other_code_is_refused_unless_forced() -> None:
    assert rp.check_code("git:abc", "git:abc", force=False) == []
    with pytest.raises(UserError, match=r"trained on code git:0123456789ab .*\(git checkout 0123456789ab\).*--force"):
        rp.check_code("git:0123456789ab", "git:fffffffffff0", force=False)
    with pytest.raises(UserError, match="had uncommitted changes"):
        rp.check_code("git:0123456789ab+dirty.aa", "git:fffffffffff0", force=False)
    lines = rp.check_code("git:0123456789ab+dirty.aa", "git:fffffffffff0", force=True)
    assert lines[0].startswith("replaying on other code (--force)")
    assert "not in this repository" in lines[1]  # no such commit: said, not a traceback
    assert "uncommitted changes were not recorded" in lines[-1]


def test_code_diff_of_a_real_commit_lists_changed_files() -> None:
    repo = Path(rp.__file__).parents[2]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = rp.code_diff(head[:12])
    assert lines == [f"no code changes in fwk, conf, recipes since {head[:12]}"] or lines[0] == (
        f"code changes since {head[:12]}:"  # the work tree has uncommitted changes
    )


@pytest.mark.parametrize("recorded", ["--output=OUT", "HEAD~1", "0123abc..HEAD", "-p", "0123abcz"])
def test_a_recorded_commit_reaches_git_only_as_a_hex_id(tmp_path: Path, recorded: str) -> None:
    """meta.json is text anyone may edit: an option (git diff --output=FILE writes a file), a
    ref or a range is never passed to git."""
    recorded = recorded.replace("OUT", str(tmp_path / "written"))
    lines = rp.check_code(f"git:{recorded}", "git:fffffffffff0", force=True)
    assert lines[1] == f"code diff unavailable: {recorded[:40]!r} is not a commit id (4 to 64 hex digits)"
    assert not (tmp_path / "written").exists()
    with pytest.raises(UserError) as refused:
        rp.check_code(f"git:{recorded}", "git:fffffffffff0", force=False)
    assert "git checkout" not in str(refused.value)  # no advice to check out what is not a commit


def test_other_data_is_refused_unless_forced() -> None:
    now = {"digest": "bbbb", "what": "2 files"}
    assert rp.check_data(None, now, force=False) == []  # a run from before fingerprints
    assert rp.check_data({"digest": "bbbb", "what": "x"}, now, force=False) == []
    with pytest.raises(UserError, match="data changed since it was trained: recorded aaaa .1 file., now bbbb"):
        rp.check_data({"digest": "aaaa", "what": "1 file"}, now, force=False)
    assert rp.check_data({"digest": "aaaa", "what": "1 file"}, now, force=True)[0].startswith("replaying on other data")
