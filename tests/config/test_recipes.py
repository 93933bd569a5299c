"""A recipe's optim settings hold only for the optimizer it picks (fwk/config/recipes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fwk.config.compose import compose
from fwk.config.grammar import resources_root
from fwk.config.recipes import dropped
from fwk.errors import UserError
from tests.conftest import run_fwk


def test_another_optimizer_than_the_recipes_starts_from_its_own_defaults() -> None:
    optim = compose(["recipe=resnet_digits", "optim=adamw"])["optim"]
    assert optim == {"name": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    (left_out,) = dropped(["recipe=resnet_digits", "optim=adamw"], resources_root())
    assert left_out.line() == (
        "optim=adamw: recipe resnet_digits's optim settings (lr=0.05, momentum=0.9, nesterov=True, "
        "weight_decay=0.0005) are for its sgd and are not applied; adamw's defaults hold (set optim.KEY=... to tune)"
    )


def test_the_recipes_own_optimizer_and_the_command_lines_keys_keep_their_settings() -> None:
    assert compose(["recipe=resnet_digits", "optim=sgd"])["optim"]["lr"] == 0.05
    assert dropped(["recipe=resnet_digits", "optim=sgd"], resources_root()) == []
    assert compose(["recipe=resnet_digits", "optim=adamw", "optim.lr=0.02"])["optim"]["lr"] == 0.02


def test_an_extended_recipe_falls_back_to_the_settings_of_the_recipe_that_picked_the_optimizer() -> None:
    # gpt_stdlib_fast picks muon over gpt_stdlib's adamw: with optim=adamw, gpt_stdlib's adamw settings hold
    optim = compose(["recipe=gpt_stdlib_fast", "optim=adamw"])["optim"]
    assert (optim["lr"], optim["beta2"], optim["weight_decay"]) == (5e-3, 0.95, 0.1)
    assert [d.recipe for d in dropped(["recipe=gpt_stdlib_fast", "optim=adamw"], resources_root())] == [
        "gpt_stdlib_fast"
    ]


def test_a_model_key_the_picked_model_lacks_is_one_line() -> None:
    with pytest.raises(UserError) as err:
        compose(["recipe=gpt_stdlib", "model=small_cnn"])
    assert str(err.value) == (
        "recipe gpt_stdlib sets model.n_layer, which the model picked instead of the recipe's has no key for; "
        "keep the recipe's model, or use a recipe made for this model"
    )


def test_the_launch_says_which_settings_were_left_out(runs: Path) -> None:
    out = run_fwk("train", "recipe=resnet_digits", "optim=adamw", "train.max_steps=1", "data.image_size=8", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[0].startswith("optim=adamw: recipe resnet_digits's optim settings (lr=0.05")


def test_a_recipe_that_picks_another_optimizer_than_the_one_it_extends_drops_its_parents_silently() -> None:
    optim = compose(["recipe=resnet_digits_fast"])["optim"]
    assert optim["name"] == "adamw_schedulefree" and optim["lr"] == 2.5e-3 and "momentum" not in optim
    (left_out,) = dropped(["recipe=resnet_digits_fast"], resources_root())
    assert (left_out.recipe, left_out.recipes_option, left_out.by_user) == ("resnet_digits", "sgd", False)
