"""benchmarks/resnet50.py (make bench's resnet50 group) at its --quick size, end to end:
real photos, the three sides as real processes, the rows computed from their figures."""

from pathlib import Path

import pytest

from benchmarks import harness, resnet50, sides


def test_the_group_is_registered_with_a_budget_for_its_full_run():
    module, fn, budget = harness.GROUPS["resnet50"]
    assert (module, fn) == ("resnet50", "rows") and budget >= 900


def test_side_a_trains_what_side_b_composes():
    size = resnet50.SIZES["full"]
    spec = resnet50.plain_spec(["recipe=resnet50_imagenet", "data.root=/photos", *resnet50.size_overrides(size)],
                               size, Path("/photos"))  # fmt: skip
    assert spec["lr"] == pytest.approx(0.1 * size.batch / 256)  # the recipe's lr, scaled to the batch
    assert (spec["image_size"], spec["val_resize"], spec["batch_size"]) == (64, 73, 32)
    assert (spec["max_steps"], spec["warmup_steps"], spec["eval_every"]) == (250, 10, 20)
    assert (spec["num_classes"], spec["label_smoothing"], spec["momentum"]) == (10, 0.1, 0.9)
    assert spec["amp"] is None and spec["device"] == "cpu"


@pytest.mark.slow
def test_quick_size_runs_every_side_and_their_ratios():
    size = resnet50.SIZES["quick"]
    got, mem, prepared = resnet50.measure(size)
    assert set(got) == {"a", "a2", "b", "c"} and prepared > 0
    for side, (outcome,) in got.items():
        assert outcome.reached, f"side {side} missed the quick target: {outcome}"
        assert 0 < outcome.startup < outcome.seconds <= outcome.wall, side
        assert 0 < outcome.train_s < outcome.seconds and outcome.steps <= size.steps, side
        assert outcome.final >= size.target and mem[side] == [outcome.peak_mb] and outcome.peak_mb > 100, side
    assert len({o.run_dir for (o,) in got.values()}) == 4
    rows = resnet50.ratio_rows(size, got, mem, prepared, 1)
    assert [r.ratio for r in rows] == [
        "(b)/(a) seconds to target",
        "(c)/(a) seconds to target",
        "(c)/(a) evaluated alike seconds to target",
        "(b)/(a) peak memory",
        "(c)/(a) peak memory",
    ]
    assert not any(r.failed for r in rows)
    for row, side, base in zip(rows[:3], "bcc", ("a", "a", "a2"), strict=True):
        assert row.median == pytest.approx(got[side][0].seconds / got[base][0].seconds)
        assert (row.a.value, row.b.value, row.target) == (got[side][0].seconds, got[base][0].seconds, "<= 0.58x")
        assert row.met == (row.median <= 0.58)
    for row, side in zip(rows[3:], "bc", strict=True):
        assert row.median == pytest.approx(mem[side][0] / mem["a"][0]) and row.target == "<= 0.63x"
    assert "(a) plain: " in rows[0].notes and "(c) fwk fast: " in rows[0].notes and "MISSED" not in rows[0].notes


def _fixed(wall: float, startup: float, steps: int, peak: float) -> sides.Outcome:
    return sides.Outcome(None, startup, None, steps, 0.1, peak, wall, False)


def test_the_seeds_setting_is_step_time_and_memory_over_fixed_steps():
    size = resnet50.SIZES["seed"]
    assert (size.image_size, size.batch, size.fixed, size.target) == (224, 64, True, 2.0)  # a target no run reaches
    got = {
        "a": [_fixed(100.0, 4.0, 8, 8000.0)],
        "b": [_fixed(60.0, 6.0, 8, 4000.0)],
        "c": [_fixed(40.0, 8.0, 8, 6000.0)],
    }
    mem = {side: [o.peak_mb for o in outs] for side, outs in got.items()}
    rows = resnet50.fixed_rows(size, got, mem, 0.0, 1)
    assert [r.ratio for r in rows] == [
        "(b)/(a) seconds per step",
        "(c)/(a) seconds per step",
        "(b)/(a) peak memory",
        "(c)/(a) peak memory",
    ]
    assert rows[0].a.value == pytest.approx(54 / 8) and rows[0].b.value == pytest.approx(96 / 8)  # first step to exit
    assert rows[0].median == pytest.approx(54 / 96) and rows[0].met  # <= 0.58x
    assert rows[1].median == pytest.approx(32 / 96) and rows[1].met
    assert rows[2].median == pytest.approx(0.5) and rows[2].met and rows[3].median == pytest.approx(0.75)
    assert not rows[3].met and rows[3].target == "<= 0.63x"
    assert "(b) fwk: startup 6 s, 6.8 s a step, 8 steps, 4000 MB" in rows[0].notes
