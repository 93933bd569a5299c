"""benchmarks/tta.py and sides.py: sides as timed processes, cold and warm caches, the
tuned plain loop's grid, and the rows built from the sides' figures."""

import json
from pathlib import Path

import pytest

from benchmarks import sides, tta
from benchmarks.sides import Outcome

TINY = ["recipe=digits_cnn", "train.max_steps=40", "train.eval_every=20", "checkpoint.every=0", "train.device=cpu"]


def _out(seconds: float | None, startup: float = 3.0, steps: int = 50, train_s: float = 1.0) -> Outcome:
    reached = seconds is not None
    phases = {"imports": startup - 1, "data": 1.0}
    wall = (seconds or 30.0) + 0.5
    return Outcome(seconds, startup, train_s if reached else None, steps, 0.99, 700.0, wall, reached, None, phases)


def test_both_sides_run_as_timed_processes_and_a_warm_run_reuses_the_cold_runs_decisions(tmp_path: Path) -> None:
    plain = sides.plain_side(sides.plain_spec([*TINY, "seed=0"]), "val_acc", 0.05, tmp_path, record=True)
    cache = tmp_path / "cache"
    cold = sides.fwk_side([*TINY, "seed=0"], "val_acc", 0.05, cache, tmp_path)
    warm = sides.fwk_side([*TINY, "seed=0"], "val_acc", 0.05, cache, tmp_path)
    for got in (plain, cold, warm):  # a target any evaluation meets: reached at step 20, after the decisions
        assert got.reached and got.steps == 20
        assert 0 < got.startup < got.seconds < got.wall  # process start -> first step -> target -> exit
        assert 0 < got.train_s < got.seconds and got.peak_mb > 50
    assert (plain.run_dir / "metrics.jsonl").read_text().count('"kind": "eval"') == 1
    assert list(plain.phases) == ["imports", "data", "model", "optimizer", "other"]
    assert list(cold.phases)[:3] == ["python", "config", "launch"] and "strategies" in cold.phases
    for got in (plain, cold):  # the phases add up to the start-up the parent timed, less the fork and exec
        assert -0.05 < got.startup - sum(got.phases.values()) < 0.5, got.phases  # ticks of 10 ms
    assert sorted((cache / "fwk" / "decisions").iterdir())  # the cold run filled the cache the warm one read
    warm_log = next(warm.run_dir.parent.glob("fwk.log")).read_text()
    assert "loader=auto" in warm_log and (cold.final, cold.steps) == (warm.final, warm.steps)


def test_a_side_that_fails_is_one_line_with_its_last_words(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"fwk train exited 2: fwk: error: .*no_such_key"):
        sides.fwk_side([*TINY, "train.no_such_key=1"], "val_acc", 0.5, tmp_path / "cache", tmp_path)


def test_the_plain_spec_takes_the_recipe_and_a_tuned_point_sets_the_runs_length() -> None:
    spec = sides.plain_spec(["recipe=gpt_stdlib", "seed=3"], lr_scale=2, steps=450, amp="bf16")
    assert spec["optim"]["name"] == "adamw" and spec["optim"]["lr"] == pytest.approx(2 * 5e-3)
    assert spec["schedule"] == {"warmup_steps": 50, "min_lr_ratio": 0.1, "steps": 450}
    assert (spec["max_steps"], spec["seed"], spec["amp"], spec["grad_clip"]) == (450, 3, "bf16", 1.0)
    with pytest.raises(ValueError, match="adamw or sgd, not muon"):
        sides.plain_spec(["recipe=gpt_stdlib_fast"])


def test_tuning_keeps_the_grid_point_that_reached_the_target_soonest(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = {(100, 1): 9.0, (100, 2): None, (200, 1): 7.5, (200, 2): 8.0}  # None: never reached
    tried = []

    def fake(spec: dict, metric: str, target: float, work: Path, record: bool = False) -> Outcome:
        key = (spec["max_steps"], round(spec["optim"]["lr"] / 3e-3))
        tried.append(key)
        return _out(seconds[key])

    monkeypatch.setattr(tta, "plain_side", fake)
    case = tta.Case(["recipe=digits_cnn"], "val_acc", 0.9, 1, "", None, {"steps": [100, 200], "lr_scale": [1, 2]})
    best, note = tta.tune(case, case.overrides, Path("/nowhere"), None)
    assert sorted(tried) == sorted(seconds) and best == {"steps": 200, "lr_scale": 1}
    assert note == "tuned over steps [100, 200], lr_scale [1, 2] (seed 0): best steps 200, lr_scale 1"
    monkeypatch.setattr(tta, "plain_side", lambda *a, **k: _out(None))
    assert tta.tune(case, case.overrides, Path("/nowhere"), None)[0] == {}  # no point reached it: the recipe's


def test_rows_compare_each_fwk_side_cold_with_the_tuned_and_the_recipe_loop_and_with_its_warm_run() -> None:
    got = {
        "plain (recipe)": [_out(100.0, 2.0), _out(110.0, 2.2)],
        "plain (tuned)": [_out(80.0), _out(90.0)],
        "fwk cold": [_out(90.0, 3.0), _out(99.0, 3.3)],
        "fwk warm": [_out(88.0), _out(90.0)],
        "fast cold": [_out(40.0), _out(None)],  # seed 1 missed: its whole process (30.5 s) counts, a bound
        "fast warm": [_out(40.0), _out(45.0)],
    }
    case = tta.CASES["gpt_stdlib"][0]
    rows = {r.name.split(": ", 1)[1]: r for r in tta._rows("gpt_stdlib", case, got, "tuned over x", "c.png")}
    assert list(rows) == [
        "fwk cold / plain (tuned)", "fwk cold / plain (recipe)", "fwk cold / fwk warm",
        "fast cold / plain (tuned)", "fast cold / plain (recipe)", "fast cold / fast warm",
        "start-up, fwk cold / plain",
    ]  # fmt: skip
    fast = rows["fast cold / plain (tuned)"]
    assert (fast.lo, fast.hi) == pytest.approx((30.5 / 90, 40 / 80)) and fast.target == "<= 0.6x" and fast.met
    assert "missed the target with seeds [1]" in fast.notes and fast.notes.startswith("gpt_stdlib_fast: ")
    assert rows["fwk cold / fwk warm"].median == pytest.approx((90 / 88 + 99 / 90) / 2)
    assert rows["fwk cold / fwk warm"].target == "<= 1.05x" and not rows["fwk cold / fwk warm"].met
    assert rows["start-up, fwk cold / plain"].median == pytest.approx(1.5)
    assert rows["start-up, fwk cold / plain"].notes == (
        "fwk - plain: +1.05 s (bound: +0.5 s, not met); "
        "fwk's phases: imports 2.15, data 1.00; plain's: imports 1.10, data 1.00"
    )
    assert json.dumps(rows["fwk cold / plain (recipe)"].__dict__, default=str)  # the harness writes rows as JSON
