"""optim=muon: which parameters Muon takes, one state dict, exact resume, DDP, FSDP refused."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from fwk.models.gpt import GPT
from fwk.optim import MuonConfig, build_optimizer, state_floats_per_param
from fwk.optim.muon import MuonAdamW, newton_schulz, split
from tests.conftest import require, run_fwk


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest() -> None:
    model = _gpt()
    muon, adamw, names = split(model)
    assert names and all(n.startswith("blocks.") and n.endswith(".weight") for n in names)
    assert all(p.dim() == 2 for p in muon)
    ids = {id(p) for p in adamw}
    assert id(model.tok_emb.weight) in ids and id(model.lm_head.weight) in ids  # tied: one parameter, AdamW's
    assert all(id(p) in ids for p in model.parameters() if p.dim() == 1)  # norms and biases
    assert len(muon) + len(adamw) == len(list(model.parameters()))
    convnet = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, 8), nn.Linear(8, 2))
    muon, adamw, names = split(convnet)
    assert names == ["2.weight"]  # the conv kernel (4-D) and the head stay with AdamW


def _steps(opt: torch.optim.Optimizer, model: GPT, steps: range, scheduler=None) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in steps:
        x = torch.randint(0, 32, (4, 16), generator=g)
        model(x, targets=x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()


def test_one_state_dict_and_a_bit_exact_resume() -> None:
    from fwk.config.schema import ScheduleConfig
    from fwk.optim import build_schedule

    cfg = MuonConfig(lr=0.02, weight_decay=0.01)
    straight = _gpt()
    opt = build_optimizer(cfg, straight)
    assert isinstance(opt, MuonAdamW) and {type(opt.muon).__name__, type(opt.adamw).__name__} == {"Muon", "AdamW"}
    sched = build_schedule(ScheduleConfig(warmup_steps=2), opt, 6)
    _steps(opt, straight, range(6), sched)
    assert opt.muon.param_groups[0]["lr"] == opt.param_groups[0]["lr"] != 0.02  # the scheduler reached Muon

    first = _gpt()
    opt1 = build_optimizer(cfg, first)
    sched1 = build_schedule(ScheduleConfig(warmup_steps=2), opt1, 6)
    _steps(opt1, first, range(3), sched1)
    saved = {"model": first.state_dict(), "optim": opt1.state_dict(), "sched": sched1.state_dict()}
    assert set(saved["optim"]) == {"muon", "adamw"}
    resumed = _gpt()
    opt2 = build_optimizer(cfg, resumed)
    sched2 = build_schedule(ScheduleConfig(warmup_steps=2), opt2, 6)
    resumed.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["optim"])
    sched2.load_state_dict(saved["sched"])
    g = torch.Generator().manual_seed(0)  # the data of steps 3-5 as the straight run saw them
    for _ in range(3):
        torch.randint(0, 32, (4, 16), generator=g)
    for _ in range(3):
        x = torch.randint(0, 32, (4, 16), generator=g)
        resumed(x, targets=x).backward()
        opt2.step()
        opt2.zero_grad(set_to_none=True)
        sched2.step()
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_newton_schulz_is_torchs_in_bf16_and_runs_in_the_dtype_asked() -> None:
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz

    g = torch.Generator().manual_seed(0)
    abc = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    for shape in ((16, 48), (48, 16)):  # wide, and tall (transposed inside)
        grad = torch.randn(shape, generator=g)
        ours = newton_schulz(grad, abc, 5, 1e-7, torch.bfloat16)
        assert torch.equal(ours, _zeropower_via_newtonschulz(grad, abc, 5, 1e-7))
        fp32 = newton_schulz(grad, abc, 5, 1e-7, torch.float32)
        assert fp32.dtype == torch.float32 and fp32.shape == shape
        assert (fp32 - ours.float()).abs().max() < 0.05  # the same orthogonalization, to bf16's precision
        singular = torch.linalg.svdvals(fp32)
        assert 0.5 < singular.min() and singular.max() < 1.5  # the quintic's band: U S' V^T, S' ~ (0.5, 1.5)


def test_muon_orthogonalizes_in_the_runs_compute_dtype() -> None:
    """fp32 where the step computes in fp32 (bf16 matmuls are emulated on many CPUs), torch's
    bf16 otherwise; torch's function is put back after each step."""
    from torch.optim import _muon

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4))

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    stepped = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        net = model()
        opt = build_optimizer(MuonConfig(lr=0.02, weight_decay=0.1), net, compute_dtype=lambda dtype=dtype: dtype)
        before = net[1].weight.detach().clone()
        net(x).square().mean().backward()
        grad = net[1].weight.grad.clone()
        opt.step()
        assert _muon._zeropower_via_newtonschulz.__module__ == "torch.optim._muon"
        stepped[dtype] = (before, grad, net[1].weight.detach().clone())
    before, grad, after = stepped[torch.float32]
    momentum = 0.95
    update = grad.lerp(grad * (1 - momentum), momentum)  # Nesterov, the buffer's first step
    ortho = newton_schulz(update, (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C), 5, 1e-7, torch.float32)
    lr = _muon._adjust_lr(0.02, "match_rms_adamw", before.shape)
    assert torch.allclose(after, before * (1 - 0.02 * 0.1) - lr * ortho, atol=1e-6)
    assert not torch.equal(after, stepped[torch.bfloat16][2])  # torch's bf16 iteration lands elsewhere
    assert torch.equal(stepped[torch.float16][2], after)  # fp16 autocast: fp32 too


def test_the_memory_estimate_counts_muons_momentum() -> None:
    assert state_floats_per_param(MuonConfig()) == 1.0  # one momentum buffer per matrix element


def test_a_model_without_hidden_matrices_is_one_line(runs: Path) -> None:
    out = run_fwk("train", "recipe=resnet_digits", "optim=muon", "train.max_steps=1", runs=runs)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "optim=muon: ResNet has no hidden weight matrices for Muon" in out.stderr.strip().splitlines()[-1]


def test_fsdp_is_refused_in_one_line(runs: Path) -> None:
    out = run_fwk("train", "recipe=gpt_stdlib", "optim=muon", "parallel=fsdp", "parallel.nproc_per_node=2", runs=runs)
    assert out.returncode == 2
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert line.startswith("fwk: error: parallel.name='fsdp' is not allowed: expected ddp, none or auto with")
    assert not runs.exists() or not any(p for p in runs.iterdir() if p.is_dir())


def test_two_process_ddp_trains_in_sync_and_resumes_exactly(tmp_path: Path) -> None:
    import torch.distributed as dist

    from fwk.components.checkpoint import model_weights
    from tests.conftest import interrupt_after

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    args = [
        "train", "recipe=gpt_stdlib", "optim=muon", "parallel=ddp", "parallel.nproc_per_node=2", "jit=off",
        "train.max_steps=20", "train.eval_every=0", "train.log_every=5", "checkpoint.every=5", "checkpoint.keep=10",
        "model.n_embd=32", "model.n_head=2", "train.batch_size=8",
    ]  # fmt: skip
    straight = run_fwk(*args, runs=tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    (run,) = (tmp_path / "straight").glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True
    expected = model_weights(run / "checkpoints" / "step-00000020")
    stopped = interrupt_after(args, tmp_path / "stopped", "*/checkpoints/step-*/manifest.json")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    resumed = run_fwk(*args, runs=tmp_path / "stopped", timeout=600)
    assert resumed.returncode == 0 and "resumed run" in resumed.stdout, resumed.stdout + resumed.stderr
    (run,) = (tmp_path / "stopped").glob("*/")
    got = model_weights(run / "checkpoints" / "step-00000020")
    assert all(torch.equal(got[k], v) for k, v in expected.items())
