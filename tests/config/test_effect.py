"""Settings a run could never act on: refused at launch (``check_inputs``), one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from fwk.config.effect import evaluations_before_end
from fwk.config.locate import missing_module
from fwk.config.resolve import check_inputs, resolve
from fwk.config.schema import TrainConfig
from fwk.errors import UserError

REFUSED = [
    (
        ["train.stop_at=val_acc>=1.5"],
        "train.stop_at='val_acc>=1.5' can never be reached: val_acc lies in [0, 1]; use a value in that range",
    ),
    (
        ["train.stop_at=val_acc>=0.9", "train.eval_every=0"],
        "train.stop_at is checked only at evaluations, and train.eval_every=0 evaluates only at the end: "
        "set train.eval_every=N below train.max_steps=300 (e.g. 30)",
    ),
    (
        ["train.stop_at=val_loss<=0.1", "train.eval_every=300"],
        "train.stop_at is checked only at evaluations, and train.eval_every=300 evaluates only at the end of "
        "train.max_steps=300: set train.eval_every=N below train.max_steps=300 (e.g. 30)",
    ),
    (
        ["train.stop_at=val_acc>=0.9", "train.max_steps=1"],
        "train.stop_at is checked only at evaluations, and train.eval_every=100 evaluates only at the end of "
        "train.max_steps=1: train more than one step (train.max_steps) and set train.eval_every=N",
    ),
    (
        ["train.early_stop_patience=3", "checkpoint.best=val_acc", "train.eval_every=0"],
        "train.early_stop_patience=3 counts evaluations, and train.eval_every=0 evaluates only at the end: "
        "set train.eval_every=N below train.max_steps=300 (e.g. 30)",
    ),
    (  # evaluations at 100 and 200 before the end; a patience of 2 stops at the third at the earliest
        ["train.early_stop_patience=2", "checkpoint.best=val_acc"],
        "train.early_stop_patience=2 can never end this run early: it stops at evaluation 3 at the earliest, "
        "and train.eval_every=100 gives 2 before the end of train.max_steps=300; lower train.early_stop_patience "
        "to 1, or train.eval_every to 99",
    ),
    (
        ["checkpoint.best=val_loss", "train.eval_every=0"],
        "checkpoint.best=val_loss ranks evaluations, and train.eval_every=0 evaluates only at the end: the best "
        "checkpoint would be the final one; set train.eval_every=N below train.max_steps=300 (e.g. 30), or leave "
        "checkpoint.best empty",
    ),
    (
        ["checkpoint.min_improvement=0.01"],
        "checkpoint.min_improvement=0.01 applies to the best checkpoint, and checkpoint.best is empty: "
        "set checkpoint.best=val_acc (or val_loss), or drop checkpoint.min_improvement",
    ),
    (
        ["checkpoint.patience=2"],
        "checkpoint.patience=2 applies to the best checkpoint, and checkpoint.best is empty: "
        "set checkpoint.best=val_acc (or val_loss), or drop checkpoint.patience",
    ),
    (
        ["recipe=gpt_stdlib", "methods=[seq_warmup]", "method.seq_warmup.start_len=128"],
        "method.seq_warmup.start_len=128 is not below data.seq_len=128: every step would train full-length "
        "sequences; lower start_len, or drop seq_warmup from methods",
    ),
    (  # the digits' 8 px at half size is 4, rounded down to a multiple of 8: 0, at least 8
        ["methods=[progressive_resize]", "method.progressive_resize.size_increment=8"],
        "methods=[progressive_resize] would never resize data.image_size=8 images: "
        "method.progressive_resize.initial_scale=0.5 of them, rounded down to a multiple of size_increment=8, "
        "is still 8 px; lower initial_scale or size_increment, or drop progressive_resize from methods",
    ),
    (
        ["model._target_=nosuch.Module"],
        "model._target_=nosuch.Module: there is no module 'nosuch' to import here; install it, or add the folder "
        "that holds nosuch to PYTHONPATH",
    ),
]


@pytest.mark.parametrize(("overrides", "line"), REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_a_setting_that_cannot_take_effect_is_one_line(overrides: list[str], line: str) -> None:
    config = resolve(overrides).config  # it validates: only the launch refuses it
    with pytest.raises(UserError) as err:
        check_inputs(config)
    assert str(err.value) == line


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.stop_at=val_acc>=1", "train.eval_every=299"],  # one evaluation (step 299) before the end
        ["train.early_stop_patience=2", "checkpoint.best=val_acc", "train.eval_every=99"],  # 3 before the end
        ["checkpoint.best=val_acc", "checkpoint.min_improvement=0.01", "checkpoint.patience=2"],
        ["recipe=gpt_stdlib", "methods=[seq_warmup]", "method.seq_warmup.start_len=127"],
        ["methods=[progressive_resize]"],  # 4 px, then 8
        ["model._target_=tests.strategies.user_models.UserNet"],
    ],
)
def test_the_same_settings_where_they_act_pass(overrides: list[str]) -> None:
    check_inputs(resolve(overrides).config)


@pytest.mark.parametrize(
    ("max_steps", "eval_every", "before"), [(300, 100, 2), (301, 100, 3), (300, 0, 0), (300, 300, 0), (1, 1, 0)]
)
def test_evaluations_before_end_are_the_loops(max_steps: int, eval_every: int, before: int) -> None:
    # the loop evaluates at every multiple of eval_every, and after its last step
    loop = [s for s in range(1, max_steps) if eval_every and s % eval_every == 0]
    assert len(loop) == before == evaluations_before_end(TrainConfig(max_steps=max_steps, eval_every=eval_every))


def test_first_side_is_progressive_resizes() -> None:
    from fwk.methods.progressive_resize import ProgressiveResize, ProgressiveResizeConfig

    for scale in (0.3, 0.5, 0.75, 1.0):
        for increment in (1, 4, 8, 32):
            cfg = ProgressiveResizeConfig(initial_scale=scale, size_increment=increment)
            method = ProgressiveResize(cfg, max_steps=100)
            for full in (8, 10, 32, 224):
                assert cfg.first_side(full) == method.side(0, full), (scale, increment, full)


def test_missing_module_looks_on_sys_path_and_in_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert missing_module("nosuch.Module") == "nosuch"
    assert missing_module("torch.nn.Linear") is None
    assert missing_module("torch.nn.NoSuchLayer") is None  # an attribute: only importing torch would tell
    (tmp_path / "my_models_here.py").write_text("class Net: ...\n")
    assert missing_module("my_models_here.Net") == "my_models_here"
    monkeypatch.chdir(tmp_path)  # where torchrun's `python -m` workers import from
    assert missing_module("my_models_here.Net") is None
