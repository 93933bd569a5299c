"""The learning-rate schedules: schedule=wsd's trapezoid, and the group composing."""

from __future__ import annotations

import pytest

from fwk.config.compose import compose
from fwk.config.schema import ScheduleConfig
from fwk.config.validate import to_typed
from fwk.optim import lr_factor


def test_wsd_warms_up_holds_the_peak_then_cools_down_linearly() -> None:
    cfg = ScheduleConfig(warmup_steps=10, decay="wsd", cooldown_frac=0.4, min_lr_ratio=0.1)
    factors = [lr_factor(step, cfg, 100) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == 1.0  # warmup
    assert all(f == 1.0 for f in factors[10:61])  # stable until the last 40 steps
    assert factors[80] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway down
    assert factors[100] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[60:], factors[61:], strict=False))


def test_schedule_is_a_group_and_recipes_keep_their_warmup() -> None:
    cfg = to_typed(compose(["recipe=gpt_stdlib", "schedule=wsd"]))
    assert (cfg.schedule.decay, cfg.schedule.cooldown_frac, cfg.schedule.warmup_steps) == ("wsd", 0.4, 50)
    assert to_typed(compose(["recipe=gpt_stdlib"])).schedule.decay == "cosine"
