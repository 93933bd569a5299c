"""optim=adamw_schedulefree: the averaged point around evaluation, BatchNorm statistics
recomputed there, its weights in checkpoints and exports, exact resume, DDP, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fwk.config.schema import ScheduleConfig
from fwk.optim import ScheduleFreeConfig, build_optimizer, build_schedule, is_schedule_free, state_floats_per_param
from fwk.optim.schedule_free import AveragedPoint
from tests.conftest import require, resumes_bit_exactly, run_fwk


def _trained(model: nn.Module, steps: int = 3) -> torch.optim.Optimizer:
    optimizer = build_optimizer(ScheduleFreeConfig(lr=0.1), model)
    optimizer.train()
    for _ in range(steps):
        model(torch.randn(8, model[0].in_features)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_it_holds_two_floats_per_weight_and_only_warms_up() -> None:
    assert state_floats_per_param(ScheduleFreeConfig()) == 2.0  # z and the squared-gradient average
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = build_optimizer(ScheduleFreeConfig(lr=0.5), model)
    assert is_schedule_free(optimizer)
    scheduler = build_schedule(ScheduleConfig(warmup_steps=2, decay="cosine"), optimizer, max_steps=10)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    assert lrs == [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]  # warmup, then constant: cosine is not applied


def test_evaluation_runs_at_the_average_and_training_resumes_at_its_point() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    optimizer = _trained(model)
    y = model[0].weight.detach().clone()
    weights = AveragedPoint(optimizer, model, lambda: iter(()), bn_batches=0, autocast=_no_autocast)
    saved = weights.state_dict()
    assert torch.equal(model[0].weight, y)  # computing x out of place leaves the parameters alone
    with weights.evaluated(model):
        x = model[0].weight.detach().clone()
    assert not torch.allclose(x, y)
    assert torch.allclose(saved["0.weight"], x, atol=1e-7)  # the checkpoint's x is the evaluated one
    assert torch.equal(model[0].weight, y)  # back at y, bit for bit, for the next step
    assert optimizer.param_groups[0]["train_mode"] is True


def test_batchnorm_statistics_are_recomputed_at_the_average_from_the_calibration_batches() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    optimizer = _trained(model)
    model[1].running_mean.fill_(100.0)  # stale statistics: the recompute must replace them
    batches = [torch.randn(16, 4) for _ in range(3)]
    weights = AveragedPoint(
        optimizer, model, lambda: iter([(b, None) for b in batches]), bn_batches=2, autocast=_no_autocast
    )
    with weights.evaluated(model):
        with torch.no_grad():
            features = torch.cat([model[0](b) for b in batches[:2]])  # the first bn_batches only, at x
        assert torch.allclose(model[1].running_mean, features.mean(0), atol=1e-5)
    assert model[1].momentum == 0.1  # the norm's own momentum is back for training
    assert torch.equal(model[1].running_mean, torch.full((4,), 100.0))  # training's statistics, as they were
    assert torch.allclose(weights.state_dict()["1.running_mean"], features.mean(0), atol=1e-5)  # export's: at x


class _no_autocast:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_with_any_other_optimizer_it_does_nothing() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    weights = AveragedPoint(optimizer, model, lambda: iter(()), bn_batches=8, autocast=_no_autocast)
    before = model[0].weight.detach().clone()
    with weights.evaluated(model):
        assert torch.equal(model[0].weight, before)
    assert not weights.active


ARGS = ["optim=adamw_schedulefree", "train.max_steps=20", "train.eval_every=10", "train.log_every=5", "jit=off"]


def test_a_run_stopped_mid_way_resumes_bit_exactly_and_exports_the_average(tmp_path: Path) -> None:
    from fwk.components.checkpoint import model_weights
    from fwk.export.source import exported_weights

    args = ["train", *ARGS, "checkpoint.every=5", "checkpoint.keep=10", "train.batch_size=16"]
    straight, run, _ = resumes_bit_exactly(args, tmp_path, final_step=20)
    line = "optim=adamw_schedulefree: warmup over 20 steps, then no decay (schedule.decay=cosine unused)"
    assert line in straight.stdout
    final = run / "checkpoints" / "step-00000020"
    trained, exported = model_weights(final), exported_weights(final)  # x, with BatchNorm statistics recomputed there
    assert set(exported) == set(trained)
    assert any(not torch.equal(exported[k], trained[k]) for k in trained if k.endswith("weight"))


def test_two_process_ddp_keeps_replicas_in_sync(runs: Path) -> None:
    import torch.distributed as dist

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk("train", *ARGS, "parallel=ddp", "parallel.nproc_per_node=2", runs=runs, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True and summary["eval"]["val_acc"] > 0.5


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["parallel=fsdp", "parallel.nproc_per_node=2"],  # (on one process nothing is sharded)
            "parallel.name='fsdp' is not allowed: expected ddp, none or auto with optim=adamw_schedulefree",
        ),
        (["methods=[ema]"], "methods=['ema'] is not allowed: expected no ema with optim=adamw_schedulefree"),
    ],
)
def test_what_it_cannot_be_combined_with_is_one_line_before_any_run_dir(runs: Path, args: list, line: str) -> None:
    out = run_fwk("train", "optim=adamw_schedulefree", *args, runs=runs)
    assert out.returncode == 2 and out.stderr.startswith(f"fwk: error: {line}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not runs.exists()
