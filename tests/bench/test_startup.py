"""benchmarks/startup.py: fwk's start-up against the plain loop's, phase by phase."""

from pathlib import Path

import pytest

from benchmarks import startup
from benchmarks.sides import Outcome


def _side(seconds: float, phases: dict[str, float], memory: dict[str, float] | None = None) -> Outcome:
    return Outcome(None, seconds, None, 1, 2.0, 600.0, seconds + 1, False, None, phases, memory)


def test_rows_name_the_gap_and_each_phase_fwk_adds() -> None:
    fwk = [_side(3.4, {"python": 0.1, "config": 0.4, "imports": 2.0, "other": 0.1}), _side(3.6, {"config": 0.5})]
    plain = [_side(2.4, {"imports": 1.3, "optimizer": 1.0}), _side(2.5, {"imports": 1.4, "optimizer": 1.0})]
    rows = startup._rows("digits_cnn", fwk, plain)
    whole, *added = rows
    assert whole.median == pytest.approx((3.4 / 2.4 + 3.6 / 2.5) / 2)
    assert whole.notes.startswith("fwk - plain: +1.05 s (bound: +0.5 s, not met); 2 reps, cold; ")
    assert "fwk's phases: python 0.05, config 0.45, imports 1.00, other 0.05; plain's: imports 1.35" in whole.notes
    assert [r.name for r in added] == [
        "digits_cnn: fwk's python",
        "digits_cnn: fwk's config",
        "digits_cnn: fwk's other",
    ]
    assert added[1].notes.startswith("0.450 s: Hydra's import (0.13 s) and compose (0.13 s")


def test_the_memory_row_names_what_each_phase_added_on_both_sides() -> None:
    fwk = [_side(3.4, {}, {"python": 60, "imports": 400, "data": 5, "at_first_step": 465})] * 2
    plain = [_side(2.4, {}, {"imports": 380, "data": 5, "at_first_step": 385})] * 2
    *_, memory = startup._rows("digits_cnn", fwk, plain)
    assert memory.name == "digits_cnn: resident memory at the first step"
    assert memory.median == pytest.approx(465 / 385) and memory.a.value == 465
    assert memory.notes == (
        "fwk - plain: +80 MiB; MiB each phase added, fwk: python 60, imports 400, data 5; plain: imports 380, data 5"
    )


def test_the_same_command_again_has_its_own_row() -> None:
    fwk = [_side(3.4, {"config": 0.4}), _side(3.6, {"config": 0.5})]
    again = [_side(2.9, {"config": 0.05}), _side(3.1, {"config": 0.07})]
    plain = [_side(2.4, {"imports": 1.3}), _side(2.5, {"imports": 1.4})]
    whole, second, *_ = startup._rows("digits_cnn", fwk, plain, again)
    assert second.name == "digits_cnn: the same command again"
    assert second.median == pytest.approx((2.9 / 2.4 + 3.1 / 2.5) / 2)
    assert second.notes.startswith("fwk - plain: +0.55 s (bound: +0.5 s, not met); 2 reps, decisions cold")
    assert second.notes.endswith("config 0.060 s")


def test_both_sides_start_and_report_their_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(startup.CASES, "digits_cnn", (["recipe=digits_cnn", "train.device=cpu"], 1))
    whole, *added = startup.one("digits_cnn", quick=True)
    assert whole.a.value > 0 and whole.b.value > 0 and not whole.failed
    assert "fwk's phases: python " in whole.notes and "plain's: imports " in whole.notes
    second = added.pop(0)
    assert second.name == "digits_cnn: the same command again" and second.a.value > 0
    memory = added.pop(0)
    assert memory.name == "digits_cnn: resident memory at the first step"
    assert memory.a.value > 100 and memory.b.value > 100  # MiB: torch alone is more
    assert {r.name for r in added} >= {"digits_cnn: fwk's config", "digits_cnn: fwk's launch"}
