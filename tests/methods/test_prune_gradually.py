"""prune_gradually: the optimizer's state follows the kept channels, the stages shrink the
model as configured, DDP replicas stay in sync, the run exports its smaller model, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fwk.methods.prune_gradually import PruneGradually, PruneGraduallyConfig
from fwk.models.pruning import following, prune_round
from fwk.optim import MuonConfig, build_optimizer
from tests.conftest import require, run_fwk


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(8, 4)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _kept(history: list, name: str, size: int) -> torch.Tensor:
    removed = {i for n, out, idxs in history if n == name and out for i in idxs}
    return torch.tensor([i for i in range(size) if i not in removed])


def test_the_optimizer_state_is_sliced_as_the_weights_and_training_goes_on() -> None:
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer)
    before = {n: {k: v.clone() for k, v in optimizer.state[p].items()} for n, p in model.named_parameters()}
    with following(optimizer):
        history = prune_round(model, torch.randn(1, 4), "magnitude", 0.5, 1)
    rows = _kept(history, "0", 16)  # the first layer's outputs kept, which the second's inputs follow
    assert model[0].weight.shape == (8, 4) and model[2].weight.shape[1] == 8
    new = dict(model.named_parameters())
    assert torch.equal(optimizer.state[new["0.weight"]]["exp_avg"], before["0.weight"]["exp_avg"][rows])
    assert torch.equal(optimizer.state[new["0.bias"]]["exp_avg_sq"], before["0.bias"]["exp_avg_sq"][rows])
    second = _kept(history, "2", 16)
    expected = before["2.weight"]["exp_avg"][second][:, rows]  # sliced twice: its outputs, then its inputs
    assert torch.equal(optimizer.state[new["2.weight"]]["exp_avg"], expected)
    assert torch.equal(optimizer.state[new["0.weight"]]["step"], before["0.weight"]["step"])
    assert [id(p) for g in optimizer.param_groups for p in g["params"]] == [id(p) for p in model.parameters()]
    assert len(optimizer.state) == len(list(model.parameters()))  # no state left for removed tensors
    _step(model, optimizer)  # the smaller model trains on


def test_muons_two_optimizers_follow_too() -> None:
    model = _mlp()
    optimizer = build_optimizer(MuonConfig(lr=1e-2), model)
    _step(model, optimizer)
    with following(optimizer):
        prune_round(model, torch.randn(1, 4), "magnitude", 0.5, 1)
    hidden = model[2].weight
    assert hidden in optimizer.muon.state and optimizer.muon.state[hidden]["momentum_buffer"].shape == hidden.shape
    _step(model, optimizer)


def test_stages_are_even_and_reach_the_ratio() -> None:
    method = PruneGradually(PruneGraduallyConfig(ratio=0.5, steps=3, start=0.2, end=0.6), max_steps=100)
    assert method.at == [20, 40, 60]
    model = _mlp()
    method.example = torch.randn(1, 4)
    method.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    calls: list = []
    method.attach(optimizer, model, calls.append)
    for step in range(100):
        _step(model, optimizer)
        method.after_step(step, model)
    assert calls == [20, 40, 60]  # reshaped after each stage, with the steps taken
    widths = [model[0].out_features, model[2].out_features]
    assert all(7 <= w <= 9 for w in widths), widths  # half the channels, in three stages (torch-pruning rounds)
    again = PruneGradually(PruneGraduallyConfig(ratio=0.5, steps=3, start=0.2, end=0.6), max_steps=100)
    fresh = _mlp()
    again.example = torch.randn(1, 4)
    again.prepare(fresh)
    again.attach(torch.optim.SGD(fresh.parameters(), lr=0.1), fresh, calls.append)
    again.load_state_dict(method.state_dict())  # a resume: the removals replayed on a fresh model
    assert [p.shape for p in fresh.parameters()] == [p.shape for p in model.parameters()]
    assert again.done == 3 and calls[-1] is None


def test_two_process_ddp_keeps_replicas_in_sync_and_the_run_exports_its_smaller_model(runs: Path) -> None:
    import torch.distributed as dist

    from fwk.export.source import load
    from fwk.track.store import RunDir

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    args = ["methods=[prune_gradually]", "train.max_steps=30", "train.eval_every=30", "jit=off"]
    out = run_fwk("train", *args, "parallel=ddp", "parallel.nproc_per_node=2", runs=runs, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prune_gradually stage 4/4" in out.stdout
    (run,) = runs.glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True and summary["eval"]["val_acc"] > 0.5
    source = load(RunDir(run))  # the export's source: the fresh model with the removals replayed
    assert source.model.features[0].out_channels < 32 and len(source.history) == 12  # 3 groups x 4 stages


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["parallel=fsdp", "parallel.nproc_per_node=2"],  # (one process shards nothing)
            "parallel.name='fsdp' is not allowed: expected ddp, none or auto with methods=[prune",
        ),
        (["methods=[prune_gradually,ema]"], "methods=['prune_gradually', 'ema'] is not allowed: expected no ema"),
        (["memory=checkpoint"], "memory.name='checkpoint' is not allowed: expected none with methods=[prune"),
    ],
)
def test_what_it_cannot_be_combined_with_is_one_line_before_any_run_dir(runs: Path, args: list, line: str) -> None:
    out = run_fwk("train", "methods=[prune_gradually]", *args, runs=runs)
    assert out.returncode == 2 and out.stderr.startswith(f"fwk: error: {line}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not runs.exists()
