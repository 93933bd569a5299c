"""The square-root learning-rate rule of a changed gradient accumulation, and its warning."""

import json
import math
from pathlib import Path

import pytest
import torch

from fwk.config import accumulation
from fwk.config.resolve import resolve
from tests.conftest import run_fwk


def recipe(accum_steps: int, lr: float):
    """A stand-in for compose: the recipe's accumulation and rate, the user's train.accum_lr."""

    def compose(overrides: list[str]) -> dict:
        given = dict(o.lstrip("+").split("=", 1) for o in overrides)
        train = {"accum_steps": int(given.get("train.accum_steps", accum_steps))}
        train["accum_lr"] = given.get("train.accum_lr", "sqrt")
        return {"train": train, "optim": {"lr": float(given.get("optim.lr", lr))}}

    return compose


@pytest.mark.parametrize(
    ("recipes", "overrides", "expected"),
    [
        ((1, 3e-3), ["train.accum_steps=4"], (4, 1, 3e-3, 6e-3)),
        ((2, 0.05), ["train.accum_steps=8"], (8, 2, 0.05, 0.1)),
        ((4, 0.1), ["train.accum_steps=1"], (1, 4, 0.1, 0.05)),  # lowered: the rate falls alike
        ((1, 3e-3), ["+train.accum_steps=9"], (9, 1, 3e-3, 9e-3)),
    ],
)
def test_the_rate_scales_by_the_square_root_of_the_accumulation_ratio(recipes, overrides, expected) -> None:
    compose = recipe(*recipes)
    s = accumulation.scaling(compose(overrides), overrides, compose)
    assert s is not None
    assert (s.steps, s.recipes_steps, s.lr) == expected[:3]
    assert s.scaled_lr == pytest.approx(expected[3])


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the recipe's accumulation
        ["train.accum_steps=1"],  # the recipe's, typed
        ["train.accum_steps=4", "optim.lr=0.01"],  # the user's rate is never scaled
        ["train.accum_steps=4", "train.accum_lr=fixed"],
    ],
)
def test_the_rate_stays(overrides: list[str]) -> None:
    compose = recipe(1, 3e-3)
    assert accumulation.scaling(compose(overrides), overrides, compose) is None


def test_resolve_scales_the_recipes_rate_and_says_so() -> None:
    r = resolve(["recipe=resnet_digits", "train.accum_steps=4"])
    base = resolve(["recipe=resnet_digits"]).config.optim.lr
    assert r.config.optim.lr == pytest.approx(base * 2)
    assert r.as_dict["optim"]["lr"] == pytest.approx(base * 2)  # recorded as it trains: a replay does not rescale
    assert r.notes == [
        f"train.accum_steps=4 (the recipe's: 1): optim.lr {base:.3g} -> {base * 2:.3g}, scaled by sqrt(4/1); "
        f"train.accum_lr=fixed keeps {base:.3g}"
    ]
    assert resolve(["recipe=resnet_digits"]).notes == []


def test_more_than_eight_steps_warns() -> None:
    assert accumulation.warning(8) is None
    assert accumulation.warning(9).startswith("fwk: warning: train.accum_steps=9 is above 8: ")


def test_a_run_trains_at_the_scaled_rate_and_says_it_first(runs: Path) -> None:
    out = run_fwk("train", "train.accum_steps=9", "train.max_steps=2", "train.eval_every=2", runs=runs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines() + out.stderr.splitlines()
    assert any(line.startswith("train.accum_steps=9 (the recipe's: 1): optim.lr 0.003 -> 0.009") for line in lines)
    assert any(line.startswith("fwk: warning: train.accum_steps=9 is above 8") for line in lines)
    (state,) = runs.glob("*/checkpoints/step-*/state.pt")
    groups = torch.load(state, weights_only=True)["optimizer"]["param_groups"]
    assert [g["initial_lr"] for g in groups] == pytest.approx([3e-3 * math.sqrt(9)] * len(groups))
    (config,) = runs.glob("*/config.yaml")
    assert "lr: 0.009" in config.read_text()
    assert json.loads(next(runs.glob("*/summary.json")).read_text())["final_step"] == 2
