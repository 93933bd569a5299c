"""Diagnostics: a NaN is located, the run rolls back (or skips, or stops), spikes, gradient norms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fwk.components.diagnostics import Diagnostics, TrainingDiverged
from fwk.config.schema import DiagnosticsConfig, PrecisionConfig
from fwk.distributed.group import Dist
from fwk.strategies.precision import Precision
from tests.components.nan_models import Poison, SqrtOfZero
from tests.conftest import require, run_fwk

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
POISONED = ["model=custom", "model._target_=tests.components.nan_models.PoisonedCNN", "+model.at=12"]
SHORT = ["train.max_steps=40", "train.eval_every=0", "train.log_every=10", "diagnostics.snapshot_every=5", "jit=off"]


def _diagnostics(model: nn.Module, **cfg: object) -> Diagnostics:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    precision = Precision(PrecisionConfig(name="fp32"), SOLO, 100)
    return Diagnostics(DiagnosticsConfig(**cfg), SOLO, model, optimizer, scheduler, precision, 10)


def diag_of(model: nn.Module) -> Diagnostics:
    return _diagnostics(model)


def _backward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


def test_nan_output_is_located_in_its_module_and_the_update_dropped(said: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Poison(at=2), nn.Linear(8, 2))
    diag = _diagnostics(model, on_nan="skip")
    said.clear()
    x = torch.randn(16, 4)
    assert diag.check(0, _backward(model, x), lambda: _backward(model, x))  # call 1: fine
    before = [p.detach().clone() for p in model.parameters()]
    assert not diag.check(1, _backward(model, x), lambda: _backward(model, x))  # call 2 NaN, re-run (call 3) too
    assert all(p.grad is None for p in model.parameters())  # the update is dropped: nothing to step with
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    (line,) = said.messages
    assert line.startswith("non-finite loss or gradient at step 2 (loss nan): first non-finite output in module 1")
    assert "(Poison)" in line and line.endswith("skipped that batch (diagnostics.on_nan=skip)")


def test_a_nan_born_in_the_backward_is_located_where_the_gradient_turns() -> None:
    model = nn.Sequential(nn.Linear(4, 4), SqrtOfZero(), nn.Linear(4, 2))
    diag = _diagnostics(model)
    x = torch.randn(8, 4)
    found = diag.locate(lambda: _backward(model, x))
    assert (found.module, found.where) == ("1", "gradient")


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_finite_loss_with_a_non_finite_gradient_is_a_bad_step(bad: float, said: pytest.LogCaptureFixture) -> None:
    """The loss and the gradients' norms reach the host together: a gradient of the
    optimizer's that is not finite makes the step bad even when the loss is finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    diag = _diagnostics(model, on_nan="skip")
    x = torch.randn(8, 4)
    loss = _backward(model, x)
    assert diag.check(0, loss, lambda: _backward(model, x))
    assert diag.losses[-1] == float(loss)  # the value kept is the loss itself
    loss = _backward(model, x)
    model[1].bias.grad[0] = bad
    assert math.isfinite(float(loss))
    assert not diag.check(1, loss, lambda: _backward(model, x))
    assert diag.bad_steps == 1 and all(p.grad is None for p in model.parameters())  # the update dropped


def test_transient_nan_and_bad_input_are_told_apart() -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    diag = _diagnostics(model)
    found = diag.locate(lambda: _backward(model, torch.randn(3, 4)))
    assert (found.module, found.where) == (None, "transient")
    bad = torch.randn(3, 4)
    bad[0, 0] = float("inf")
    found = diag.locate(lambda: _backward(model, bad))
    assert found.module is None and "the batch itself holds NaN/Inf" in found.suggestion


def test_suggestions_fit_the_module() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    with torch.no_grad():
        model[2].weight.fill_(3e5)
    diag = _diagnostics(model)
    assert "keep it in fp32 with precision.keep_fp32=[1]" in diag._suggest("1")
    assert diag._suggest("2").startswith("its weights blew up (max |w| 3e+05): lower optim.lr")
    assert "lower optim.lr, or clip the gradients" in diag._suggest("0")
    relu = diag_of(nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))._suggest("0")
    assert relu.startswith("it has no weights: its forward makes NaN/Inf")


def test_rollback_restores_the_snapshot_and_scales_the_lr(said: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Poison(at=4), nn.Linear(8, 2))
    diag = _diagnostics(model, snapshot_every=2, lr_factor=0.5)
    x = torch.randn(16, 4)
    snapshots = {}
    for step in range(3):
        if step == 2:
            snapshots[step] = [p.detach().clone() for p in model.parameters()]
        assert diag.check(step, _backward(model, x), lambda: _backward(model, x))
        diag.optimizer.step()
        diag.optimizer.zero_grad()
    assert not diag.check(3, _backward(model, x), lambda: _backward(model, x))
    assert all(torch.equal(a, b) for a, b in zip(snapshots[2], model.parameters(), strict=True))
    assert diag.scheduler.base_lrs == [0.05] and diag.optimizer.param_groups[0]["lr"] == 0.05
    assert said.messages[-1].endswith(
        "rolled back to the state of step 2 (rollback 1 of at most 3, learning rate x0.5); skipping batches 3-4"
    )
    assert diag.summary() == {"bad_steps": 1, "rollbacks": 1}


def test_the_snapshot_is_refreshed_in_place_and_survives_two_rollbacks() -> None:
    """One snapshot's memory, rewritten every snapshot_every steps; a rollback hands the
    optimizer copies, so the steps after it cannot change what the next rollback restores."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Poison(at=6), nn.Linear(8, 2))
    diag = _diagnostics(model, snapshot_every=4, max_rollbacks=5)
    diag.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(16, 4)

    def step(n: int) -> bool:
        ok = diag.check(n, _backward(model, x), lambda: _backward(model, x))
        if ok:
            diag.optimizer.step()
        diag.optimizer.zero_grad()
        return ok

    def held() -> tuple[torch.Tensor, torch.Tensor]:
        state = diag._snapshot[1]
        return state["model"]["0.weight"], state["optimizer"]["state"][0]["momentum_buffer"]

    assert step(0)
    weights = diag._snapshot[1]["model"]["0.weight"]
    assert all(step(n) for n in range(1, 5))  # a snapshot after step 4: the weights written in place
    assert held()[0] is weights
    kept = [t.clone() for t in held()]
    assert not step(5)  # the poison's 6th call (and its re-run): rolled back to step 4
    live = diag.optimizer.state[model[0].weight]["momentum_buffer"]
    assert live is not held()[1] and torch.equal(live, kept[1])
    assert step(6)  # a good step after the rollback: the snapshot stays as taken
    model[1].calls = 5
    assert not step(7)  # a second rollback to step 4
    assert torch.equal(model[0].weight, kept[0])
    assert torch.equal(diag.optimizer.state[model[0].weight]["momentum_buffer"], kept[1])
    momentum = held()[1]
    assert step(8)  # the next snapshot: the same tensors again
    assert held()[0] is weights and held()[1] is momentum
    assert diag.rollbacks == 2


def test_no_snapshot_is_kept_unless_a_bad_step_rolls_back() -> None:
    for on_nan in ("skip", "stop"):
        model = nn.Linear(4, 2)
        diag = _diagnostics(model, on_nan=on_nan, snapshot_every=1)
        for n in range(3):
            assert diag.check(n, _backward(model, torch.randn(2, 4)), lambda: None)
        assert diag._snapshot is None


def test_too_many_bad_steps_stop_the_run() -> None:
    model = nn.Sequential(nn.Linear(4, 2), Poison(at=1))
    diag = _diagnostics(model, on_nan="skip", max_rollbacks=0)
    with pytest.raises(TrainingDiverged, match="more than diagnostics.max_rollbacks=0"):
        diag.check(0, _backward(model, torch.randn(2, 4)), lambda: None)


def test_a_bad_first_step_under_rollback_stops_in_one_line() -> None:
    """Nothing good to go back to: the snapshot is taken at the first good step."""
    model = nn.Sequential(nn.Linear(4, 2), Poison(at=1))
    diag = _diagnostics(model)  # on_nan=rollback, the default
    x = torch.randn(2, 4)
    with pytest.raises(TrainingDiverged) as err:
        diag.check(0, _backward(model, x), lambda: _backward(model, x))
    line = str(err.value)
    assert line.startswith("non-finite loss or gradient at step 1 (loss nan): first non-finite output in module 1")
    assert line.endswith("stopped: no good step of this launch to roll back to (diagnostics.on_nan=rollback)")


def test_a_spike_is_a_bad_step(said: pytest.LogCaptureFixture) -> None:
    model = nn.Linear(2, 1)
    diag = _diagnostics(model, on_nan="skip", spike_k=4.0, spike_window=10)
    losses = [1.0, 1.1, 0.9, 1.05, 0.95] * 2
    for step, value in enumerate(losses):
        assert diag.check(step, torch.tensor(value), lambda: None)
    assert diag.check(10, torch.tensor(1.2), lambda: None)  # within 4 std (std ~0.07): not a spike
    assert not diag.check(11, torch.tensor(5.0), lambda: None)
    assert said.messages[-1].startswith("loss spike at step 12: 5 against a mean of")


def test_gradient_norms_per_module_every_log_window() -> None:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("stem", nn.Linear(4, 4))
    model.add_module("blocks", nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
    model.forward = lambda x: model.blocks[1](model.blocks[0](model.stem(x)))  # type: ignore[method-assign]
    diag = _diagnostics(model, grad_stats=True)
    _backward(model, torch.randn(8, 4))
    diag.check(9, torch.tensor(1.0), lambda: None)  # the 10th step: a logged one
    row = diag.metrics()
    assert set(row) == {"grad_norm/stem", "grad_norm/blocks.0", "grad_norm/blocks.1"}
    grads = [p.grad for p in model.stem.parameters()]
    assert row["grad_norm/stem"] == pytest.approx(float(torch.nn.utils.get_total_norm(grads)))
    assert diag.metrics() == {}  # once per window


def test_a_run_that_emits_nan_rolls_back_and_finishes(runs: Path) -> None:
    out = run_fwk("train", *POISONED, *SHORT, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("non-finite"))
    assert "at step 12 (loss nan): first non-finite output in module poison (Poison)" in line
    assert "rolled back to the state of step 10" in line and "skipping batches 11-12" in line
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rollbacks"] == 1 and summary["bad_steps"] == 1
    assert summary["eval"]["val_acc"] > 0.6 and math.isfinite(summary["eval"]["val_loss"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows if r["kind"] == "train")


def test_a_run_that_emits_nan_stops_under_stop(runs: Path) -> None:
    out = run_fwk("train", *POISONED, *SHORT, "diagnostics=stop", runs=runs)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fwk: error: non-finite loss or gradient at step 12")
    assert line.endswith("stopped (diagnostics.on_nan=stop)")


def test_a_run_whose_first_step_is_bad_stops_in_one_line(runs: Path) -> None:
    poisoned = [*POISONED[:2], "+model.at=1"]
    out = run_fwk("train", *poisoned, *SHORT, runs=runs)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fwk: error: non-finite loss or gradient at step 1 (loss nan)")
    assert line.endswith("no good step of this launch to roll back to (diagnostics.on_nan=rollback)")


def test_both_ddp_ranks_roll_back_together(runs: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    args = [*POISONED, "+model.rank=1", *SHORT, "parallel.nproc_per_node=2"]
    out = run_fwk("train", *args, runs=runs, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    # the NaN came from rank 1 only; rank 0 reports it and both restored the same snapshot
    assert summary["rollbacks"] == 1 and summary["replicas_in_sync"] is True
    assert (
        "non-finite loss or gradient at step 12: on rank 1 (its finding is in runs/<id>/logs/rank1.log)" in out.stdout
    )
    assert "rolled back to the state of step 10" in out.stdout
    assert (
        "rank 1: non-finite loss or gradient at step 12 (loss nan): first non-finite output in module poison"
        in (run / "logs" / "rank1.log").read_text()
    )
    assert summary["eval"]["val_acc"] > 0.6
