"""The best checkpoint by a metric: saved on a large enough gain or after patience; early stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fwk.components.best import BEST_DIR, BestKeeper, read_best
from fwk.config.schema import CheckpointConfig
from fwk.distributed.group import Dist

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _rank(keeper: BestKeeper, values: list[float], metric: str) -> list[int]:
    """Feed one evaluation per value (steps 10, 20, ...); the steps at which it saved."""
    saved = []
    for i, value in enumerate(values):
        step = 10 * (i + 1)
        if keeper.after_eval(step, {metric: value}, lambda at=step: {"step": at}):
            saved.append(step)
    return saved


def test_a_better_value_is_saved_and_named_in_best_json(tmp_path: Path) -> None:
    keeper = BestKeeper(CheckpointConfig(best="val_acc"), tmp_path, SOLO, sharded=False)
    assert _rank(keeper, [0.90, 0.95, 0.93, 0.97], "val_acc") == [10, 20, 40]
    best = read_best(tmp_path)
    assert best is not None and (best["metric"], best["value"], best["step"]) == ("val_acc", 0.97, 40)
    assert [p.name for p in (tmp_path / BEST_DIR).glob("step-*")] == ["step-00000040"]  # only the best is kept
    assert torch.load(best["path"] / "state.pt", weights_only=True)["step"] == 40


def test_a_run_killed_between_the_save_and_best_json_keeps_the_best_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fwk.components import best as module

    keeper = BestKeeper(CheckpointConfig(best="val_acc"), tmp_path, SOLO, sharded=False)
    assert _rank(keeper, [0.90], "val_acc") == [10]

    def killed(*args: object) -> None:
        raise KeyboardInterrupt  # the process ends here: the new checkpoint is in, best.json not yet

    monkeypatch.setattr(module, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        keeper.after_eval(20, {"val_acc": 0.95}, lambda: {"step": 20})
    best = read_best(tmp_path)
    assert best is not None and best["step"] == 10 and (best["path"] / "state.pt").is_file()
    monkeypatch.undo()
    assert keeper.after_eval(30, {"val_acc": 0.96}, lambda: {"step": 30})  # the next best: named, the rest removed
    assert [p.name for p in (tmp_path / BEST_DIR).glob("step-*")] == ["step-00000030"]
    assert read_best(tmp_path)["step"] == 30


def test_loss_is_ranked_downwards_with_a_minimum_gain_and_patience(tmp_path: Path) -> None:
    cfg = CheckpointConfig(best="val_loss", min_improvement=0.1, patience=2)
    keeper = BestKeeper(cfg, tmp_path, SOLO, sharded=False)
    # 1.0 saved; 0.95 and 0.92 gain < 0.1: the second of them is saved by patience; 0.5 at once
    assert _rank(keeper, [1.0, 0.95, 0.92, 0.5, 0.6], "val_loss") == [10, 30, 40]
    assert json.loads((tmp_path / BEST_DIR / "best.json").read_text())["value"] == 0.5


def test_early_stop_counts_evaluations_without_a_new_best(tmp_path: Path) -> None:
    keeper = BestKeeper(CheckpointConfig(best="val_acc"), tmp_path, SOLO, sharded=False)
    _rank(keeper, [0.9, 0.95, 0.94, 0.95], "val_acc")
    assert keeper.exhausted(2) and not keeper.exhausted(3) and not keeper.exhausted(0)
    resumed = BestKeeper(CheckpointConfig(best="val_acc"), tmp_path, SOLO, sharded=False)
    resumed.load_state_dict(json.loads(json.dumps(keeper.state_dict())))
    assert resumed.exhausted(2) and _rank(resumed, [0.94], "val_acc") == []  # ranks as before the checkpoint
