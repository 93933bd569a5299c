"""benchmarks/precision_whole.py: precision=auto's whole command against the best fixed format."""

from pathlib import Path

import pytest

from benchmarks import precision_whole
from benchmarks.sides import Outcome


def _run(wall: float, run_dir: Path | None = None) -> Outcome:
    return Outcome(None, 1.0, None, 10, 2.0, 600.0, wall, False, run_dir)


def test_the_row_is_auto_over_the_faster_fixed_format_rep_by_rep(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (tmp_path / "runs" / "fwk.log").write_text("...\nprecision=auto chose bf16: bf16 1.43x faster than fp32 (...)\n")
    runs = {
        "fp32": [_run(10.0), _run(12.0)],
        "bf16": [_run(8.0), _run(13.0)],  # the faster format differs by rep: the best of each rep counts
        "auto": [_run(8.8, run_dir), _run(11.4)],
    }
    row = precision_whole._row("digits_cnn", runs)
    assert row.median == pytest.approx((8.8 / 8.0 + 11.4 / 12.0) / 2)
    assert (row.lo, row.hi) == (pytest.approx(11.4 / 12.0), pytest.approx(1.1))
    # the best of each rep, 8 and 12 s; bf16 is named, its median 10.5 s below fp32's 11 s
    assert row.b.label == "best fixed (bf16)" and row.b.value == 10.0
    assert row.target == "<= 1.05" and row.met is True  # the median, 1.025x, is checked, not the worst rep
    assert row.notes.endswith("auto chose bf16: bf16 1.43x faster than fp32 (...)")
    assert row.notes.startswith("fp32 11.0 s, bf16 10.5 s; 2 rep(s), cold decision caches")
