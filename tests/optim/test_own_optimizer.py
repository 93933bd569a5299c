"""An optimizer of your own is one class, named by ``optim._target_``: this file's signSGD
trains the default recipe through the real ``fwk train``; a setting it does not take is one
line before any run dir."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fwk.optim import build_optimizer
from tests.conftest import run_fwk

OWN = f"{__name__}.SignSGD"


class SignSGD(torch.optim.Optimizer):
    """Each weight steps by ``lr`` against the sign of its gradient (signSGD)."""

    def __init__(self, params, lr: float = 1e-3) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch.optim.Optimizer's signature
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


def test_weight_decay_goes_to_the_matrices_only_as_fwks_own_optimizers_do() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    plain = build_optimizer({"_target_": OWN, "lr": 0.5}, model)
    assert isinstance(plain, SignSGD) and len(plain.param_groups) == 1 and plain.param_groups[0]["lr"] == 0.5
    decayed = build_optimizer({"_target_": "torch.optim.AdamW", "lr": 0.5, "weight_decay": 0.1}, model)
    groups = [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in decayed.param_groups]
    assert groups == [(0.1, [(4, 3)]), (0.0, [(4,), (4,), (4,)])]


def test_your_optimizer_trains_the_default_recipe(runs: Path) -> None:
    out = run_fwk("train", f"optim._target_={OWN}", "optim.lr=0.002", "train.max_steps=150", "jit=off", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")
    assert f"optim:\n  _target_: {OWN}\n  lr: 0.002\n" in (run / "config.yaml").read_text()
    assert json.loads((run / "summary.json").read_text())["eval"]["val_acc"] > 0.9


def test_a_setting_it_does_not_take_is_one_line_before_any_run_dir(runs: Path) -> None:
    out = run_fwk("train", f"optim._target_={OWN}", "optim.momentum=0.9", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"fwk: error: optim._target_={OWN} cannot be built with optim.momentum=0.9 (TypeError: "
        "SignSGD.__init__() got an unexpected keyword argument 'momentum'); give only the arguments of its "
        "__init__ after the parameters"
    )
    assert not list(runs.glob("*/"))
