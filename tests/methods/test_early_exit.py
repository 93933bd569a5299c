"""`methods=[early_exit]`: exit heads where the blocks end, their losses weighted into the
step's, and the entropy threshold calibrated on the validation split after training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fwk.config.schema import MethodConfig
from fwk.engine.exit_calibration import calibrate, exit_taken
from fwk.errors import UserError
from fwk.methods.base import Methods
from fwk.models.loss import CrossEntropy
from tests.conftest import run_fwk


def _prepared(model: nn.Module, example: torch.Tensor, **settings) -> Methods:
    cfg = MethodConfig()
    for key, value in settings.items():
        setattr(cfg.early_exit, key, value)
    methods = Methods(["early_exit"], cfg, 10)
    methods.prepare(model, "lm" if example.dtype == torch.int64 else "classification", example)
    return methods


def _cnn() -> nn.Module:
    from fwk.models.cnn import SmallCNN

    return SmallCNN(in_channels=1, channels1=8, channels2=16, hidden=32, num_classes=10)


def _gpt(n_layer: int = 4) -> nn.Module:
    from fwk.models.gpt import GPT

    return GPT(vocab_size=50, block_size=8, n_layer=n_layer, n_head=2, n_embd=16, dropout=0.0, bias=True)


def test_heads_follow_the_blocks_each_model_has() -> None:
    import torchvision

    cnn = _cnn()
    _prepared(cnn, torch.randn(1, 1, 8, 8))
    assert [h[-1].in_features for h in cnn.exit_heads] == [8]  # after the first conv block only
    resnet = torchvision.models.resnet18(num_classes=10)
    method = _prepared(resnet, torch.randn(1, 3, 32, 32)).active[0]
    assert method.exits == [0, 1, 2] and [h[-1].in_features for h in resnet.exit_heads] == [64, 128, 256]
    gpt = _gpt(8)
    before = sum(p.numel() for p in gpt.parameters())
    method = _prepared(gpt, torch.zeros(1, 8, dtype=torch.int64)).active[0]
    assert method.exits == [1, 3, 5]  # every quarter of 8 layers, never the last
    # a norm per exit; the LM head is the model's own, not a vocabulary matrix per exit
    assert sum(p.numel() for p in gpt.parameters()) - before == 3 * 2 * 16
    assert method.weights == [0.25, 0.5, 0.75]


def test_the_loss_is_the_weighted_mean_of_the_exits_and_the_final_output() -> None:
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = _cnn()
    methods = _prepared(model, torch.randn(1, 1, 8, 8), weights=[0.5])
    loss = methods.loss(CrossEntropy())
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))
    got = loss(model, x, y)
    hidden = model.features[:2](x)  # the first conv block's output
    exit_ce = F.cross_entropy(model.exit_heads[0](hidden), y)
    final_ce = F.cross_entropy(model(x), y)
    torch.testing.assert_close(got, (0.5 * exit_ce + final_ce) / 1.5)


def test_calibration_keeps_the_largest_threshold_within_max_drop() -> None:
    # 4 samples, 1 exit: entropies at the exit and correctness at the exit, then at the end
    entropies = np.array([[0.1], [0.5], [0.9], [2.0]])
    scores = np.array([[1, 1], [1, 1], [0, 1], [0, 1]], dtype=float)
    # t = 2.0: all leave, acc 0.5; t = 0.9: three leave, acc 0.75; t = 0.5: two leave, acc 1.0
    out = calibrate(entropies, scores, 1, "classification", 0.25, [0.5])
    assert out["threshold"] == 0.9 and out["with_exits"] == 0.75 and out["full"] == 1.0
    assert out["share"] == [0.75, 0.25] and sum(out["share"]) == 1.0
    assert out["mean_depth"] == 0.75 * 0.5 + 0.25 * 1.0 and out["exit_metric"] == [0.5]
    assert calibrate(entropies, scores, 1, "classification", 0.0, [0.5])["threshold"] == 0.5
    # a sample leaves at the first exit at or below the threshold: the smallest entropy so far
    two = np.array([[0.3, 0.1], [0.9, 0.2], [0.9, 0.8]])
    assert exit_taken(two, 0.25).tolist() == [1, 1, 2]
    # language models: mean loss per token, which may rise by max_drop nats
    lm = calibrate(np.array([[0.2], [1.0]]), np.array([[2.0, 1.0], [3.0, 1.0]]), 1, "lm", 0.6, [0.5])
    assert lm["threshold"] == 0.2 and lm["with_exits"] == 1.5
    none = calibrate(np.array([[0.2]]), np.array([[0.0, 1.0]]), 1, "classification", 0.1, [0.5])
    assert none["threshold"] is None and none["share"] == [0.0, 1.0]


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(UserError, match=r"this model has blocks 0..1, and an exit after the last one"):
        _prepared(_cnn(), torch.randn(1, 1, 8, 8), exits=[1])
    with pytest.raises(UserError, match=r"fused head loss"):
        _prepared(_cnn(), torch.randn(1, 1, 8, 8)).loss(CrossEntropy(fused=True))
    with pytest.raises(UserError, match=r"finds no blocks in Linear"):
        _prepared(nn.Linear(4, 2), torch.randn(1, 4))


@pytest.mark.parametrize(
    ("word", "said"),
    [
        (
            "method.early_exit.weights=[0.5,0.5]",
            "method.early_exit.weights=[0.5, 0.5] is not allowed: expected one weight per exit",
        ),
        ("method.early_exit.max_drop=-1", "method.early_exit.max_drop=-1.0 is not allowed: expected a number >= 0"),
    ],
)
def test_bad_settings_on_the_command_line_are_one_line_before_any_run_dir(tmp_path: Path, word: str, said: str) -> None:
    runs = tmp_path / "runs"
    out = run_fwk("train", "methods=[early_exit]", "method.early_exit.exits=[0]", word, runs=runs)
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not runs.exists()


def test_the_default_digits_run_with_exits_calibrates_within_max_drop_and_exports_the_plain_model(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    out = run_fwk("train", "methods=[early_exit]", runs=runs)  # the default recipe, as a user runs it
    assert out.returncode == 0, out.stdout + out.stderr
    assert "early_exit: threshold" in out.stdout
    (run,) = [p for p in runs.iterdir() if (p / "summary.json").is_file()]
    summary = json.loads((run / "summary.json").read_text())
    ee = summary["early_exit"]
    assert ee["full"] == pytest.approx(summary["eval"]["val_acc"])
    assert ee["with_exits"] >= ee["full"] - ee["max_drop"] and ee["samples"] == 300
    assert sum(ee["share"]) == pytest.approx(1.0) and 0.5 <= ee["mean_depth"] <= 1.0
    out = run_fwk("export", "--format", "safetensors", runs=runs)  # the model without its heads
    assert out.returncode == 0, out.stdout + out.stderr
