"""Structured pruning (fwk/export/prune.py): what is kept whole, rewinding, replaying the history."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
import torch
import torchvision
from torch import nn

from fwk.errors import UserError
from fwk.export import prune as pr
from fwk.export.settings import PrunePlan, load_settings
from fwk.models.cnn import SmallCNN
from fwk.models.gpt import GPT
from tests.conftest import run_fwk
from tests.export.conftest import QUICK, copy_run


def _resnet18() -> nn.Module:
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model.eval()


def test_plan_checks_the_options_and_defaults_the_rounds() -> None:
    assert PrunePlan.checked("lottery_ticket", 0.5, None).rounds == 3
    assert PrunePlan.checked("taylor", 0.3, None) == PrunePlan("taylor", 0.3, 1)
    assert PrunePlan.checked("none", 0.9, 7) == PrunePlan()
    for method, ratio, rounds in (("magnitude", 1.0, 1), ("magnitude", -0.1, 1), ("magnitude", 0.5, 0), ("l1", 0.5, 1)):
        with pytest.raises(UserError):
            PrunePlan.checked(method, ratio, rounds)


def test_rounds_reach_the_ratio_together() -> None:
    for ratio, rounds in ((0.5, 3), (0.8, 2), (0.3, 1)):
        assert (1 - pr.per_round(ratio, rounds)) ** rounds == pytest.approx(1 - ratio)


def test_cnn_keeps_its_classes_and_rounds_wide_layers_to_eight() -> None:
    model = _resnet18()
    x = torch.randn(2, 1, 32, 32)
    before = pr.count(model, x[:1])
    pr.prune_round(model, x[:1], "magnitude", 0.5, 8)
    after = pr.count(model, x[:1])
    assert model.fc.out_features == 10 and model(x).shape == (2, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert all(c.out_channels % 8 == 0 for c in convs)
    assert [c.out_channels for c in convs[:2]] == [32, 32]  # 64 -> 32: half the channels removed
    # halving both the inputs and the outputs of every conv leaves about a quarter
    assert 0.2 < after["params"] / before["params"] < 0.3 and 0.2 < after["macs"] / before["macs"] < 0.3

    small = SmallCNN(1, 32, 64, 128, 10).eval()
    pr.prune_round(small, torch.randn(1, 1, 8, 8), "magnitude", 0.3, 8)
    # 32 x 0.7 keeps 22 channels: rounding them down to 16 would overshoot the ratio, so counts stay exact
    assert small.features[0].out_channels == 22 and small.head[-1].out_features == 10


def test_gpt_loses_whole_heads_and_keeps_its_residual_width() -> None:
    torch.manual_seed(0)
    model = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32).eval()
    idx = torch.randint(0, 64, (2, 16))
    pr.prune_round(model, idx[:1], "magnitude", 0.5, 8)
    for block in model.blocks:
        assert block.attn.n_head == 2
        assert block.attn.qkv.out_features == 3 * 2 * 8  # two heads of width 8 (32 / 4) each
        assert block.attn.qkv.in_features == block.attn.proj.out_features == 32
        assert block.mlp.fc.out_features == 64 and block.mlp.proj.out_features == 32
    assert model.lm_head.weight is model.tok_emb.weight and model.lm_head.out_features == 64
    assert model(idx).shape == (2, 16, 64)
    assert torch.isfinite(model(idx, idx)).all()


def test_taylor_removes_the_channels_whose_weight_times_gradient_is_zero() -> None:
    torch.manual_seed(0)
    model = SmallCNN(1, 32, 64, 128, 10).eval()

    def grads(m: nn.Module) -> None:  # only the first conv's channels 16..31 get a gradient
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        m.features[0].weight.grad[16:] = 1.0

    history = pr.prune_round(model, torch.randn(1, 1, 8, 8), "taylor", 0.5, 1, grads)
    (removed,) = [idx for name, out, idx in history if name == "features.0" and out]
    assert removed == list(range(16))


def _positions(model: nn.Module) -> nn.Module:
    """Every float tensor of ``model`` set to its own flat indices: after a replay, where each survivor came from."""
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.arange(t.numel(), dtype=t.dtype).view_as(t))
    return model


def test_lottery_ticket_rewinds_the_survivors_to_the_rewind_weights(
    digits_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fwk.engine import assemble
    from fwk.export.source import load
    from fwk.models.build import build_model
    from fwk.track.store import RunDir

    source = load(RunDir(copy_run(digits_run, tmp_path / "runs")))
    started: list[dict[str, torch.Tensor]] = []
    real_build = assemble.build_run

    def spy(cfg, run, tracking=None, model=None):  # what each round's training starts from
        started.append({k: v.clone() for k, v in model.state_dict().items()})
        return real_build(cfg, run, tracking, model)

    monkeypatch.setattr(assemble, "build_run", spy)
    out = tmp_path / "export"
    out.mkdir()
    cfg = load_settings(["export.retrain_frac=0.05"])  # 5 of the run's 100 steps per round
    pruned = pr.prune(source, PrunePlan("lottery_ticket", 0.5, 2), cfg, out)

    assert len(started) == 2 and len(pruned.rounds) == 2
    assert pr.load_history(out / pr.HISTORY) == pruned.history
    (rewind_file,) = (source.run.path / "rewind").glob("step-*.pt")
    rewind = torch.load(rewind_file, weights_only=True)["model"]
    trained = source.model.state_dict()
    example = pr.example_input(source)
    where = pr.replay(_positions(build_model(source.config.model, source.data)), example, pruned.history).state_dict()
    for key, value in started[-1].items():
        assert value.shape == pruned.model.state_dict()[key].shape
        if value.is_floating_point():
            # each survivor holds the rewind checkpoint's value from its own position
            assert torch.equal(value, rewind[key].flatten()[where[key].long()].view_as(value)), key
            assert not torch.equal(value, trained[key].flatten()[where[key].long()].view_as(value)), key
    assert started[0]["features.0.weight"].shape[0] > started[1]["features.0.weight"].shape[0]
    assert (out / "rounds" / "round-2" / "summary.json").is_file()
    assert not (out / "rounds" / "round-2" / "checkpoints").exists()


def test_lottery_ticket_needs_rewind_weights(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    train = ["train.max_steps=5", "train.eval_every=0", "checkpoint.rewind_at=0", "jit=off"]
    assert run_fwk("train", *train, runs=runs).returncode == 0
    out = run_fwk("export", "--prune", "lottery_ticket", *QUICK, runs=runs)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "has no rewind weights" in line and "checkpoint.rewind_at=0.02" in line
    (run,) = runs.glob("*/")  # run dirs, not the index
    assert not list((run / "exports").glob("*/export_report.json"))


def test_export_of_a_pruned_model_is_rebuilt_from_its_history(digits_run: Path, tmp_path: Path) -> None:
    """--prune magnitude end to end; pruned.pt + pruning_history.json rebuild the model the ONNX file holds."""
    from fwk.export.source import load
    from fwk.models.build import build_model
    from fwk.track.store import RunDir

    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    args = ["--prune", "magnitude", "--ratio", "0.5", "--quantize", "none", "--max-accuracy-drop", "100"]
    out = run_fwk("export", *args, *QUICK, "export.finetune_frac=0.1", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (export,) = (run / "exports").iterdir()
    report = json.loads((export / "export_report.json").read_text())
    p = report["prune"]
    assert p["method"] == "magnitude" and p["rounds"] == 1 and len(p["rounds_run"]) == 1
    assert p["after"]["params"] < 0.35 * p["before"]["params"] and p["macs_left"] < 0.35
    stages = {s["stage"]: s for s in report["stages"]}
    assert report["reference"] == "torch pruned" and stages["onnx fp32"]["rel_diff"] <= 1e-4
    assert stages["torch pruned"]["weights"] == p["after"]["params"]
    assert "parameters 151.3 K -> " in out.stdout

    source = load(RunDir(run))
    model = build_model(source.config.model, source.data)
    pr.replay(model, pr.example_input(source), pr.load_history(export / pr.HISTORY))
    model.load_state_dict(torch.load(export / "pruned.pt", weights_only=True))  # strict: same architecture
    x = torch.stack([source.data.val[i][0] for i in range(16)])
    with torch.no_grad():
        ref = model.eval()(x).numpy()
    onnx_out = ort.InferenceSession(str(export / "fp32.onnx")).run(None, {"input": x.numpy()})[0]
    assert abs(onnx_out - ref).max() <= 1e-4 * abs(ref).max()
