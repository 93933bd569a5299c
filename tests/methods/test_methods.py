"""Speed-up methods: their schedules, EMA's average, one-line refusals, and exact resume
(and DDP) through the real `fwk train`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fwk.config.schema import MethodConfig
from fwk.errors import UserError
from fwk.methods.base import Methods
from fwk.methods.progressive_resize import ProgressiveResize, ProgressiveResizeConfig
from fwk.methods.seq_warmup import SeqWarmup, SeqWarmupConfig
from tests.conftest import require, resumes_bit_exactly, run_fwk


def test_seq_warmup_ramps_the_length_as_a_function_of_the_step() -> None:
    m = SeqWarmup(SeqWarmupConfig(start_len=16, duration=0.5, multiple=8), max_steps=100)
    lengths = [m.length(step, 128) for step in range(0, 101, 10)]
    assert lengths == [16, 32, 56, 80, 104, 128, 128, 128, 128, 128, 128]
    x = torch.arange(4 * 128).reshape(4, 128)
    short, target = m.batch(10, x, x + 1)
    assert short.shape == (4, 32) and torch.equal(target, (x + 1)[:, :32])


def test_progressive_resize_holds_ramps_and_finishes_at_full_size() -> None:
    m = ProgressiveResize(ProgressiveResizeConfig(initial_scale=0.5, delay_fraction=0.4, finetune_fraction=0.2), 100)
    assert [m.side(step, 32) for step in (0, 40, 60, 79, 80, 99)] == [16, 16, 24, 28, 32, 32]
    x, y = m.batch(0, torch.rand(2, 1, 32, 32), torch.tensor([1, 2]))
    assert x.shape == (2, 1, 16, 16) and y.tolist() == [1, 2]


def test_ema_averages_every_step_and_evaluation_uses_the_average() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    methods = Methods(["ema"], MethodConfig(), max_steps=10)
    methods.prepare(model, "classification")
    decay = 0.5 ** (1 / 100)
    expected = None
    for step in range(3):
        with torch.no_grad():
            model.weight.add_(1.0)
        methods.after_step(step, model)
        w = model.weight.detach().clone()  # the first update takes the weights as they are
        expected = w if expected is None else decay * expected + (1 - decay) * w
    with methods.evaluated(model) as averaged:
        assert averaged is not model and torch.allclose(averaged.weight, expected)
    again = Methods(["ema"], MethodConfig(), max_steps=10)
    again.prepare(nn.Linear(3, 1), "classification")
    again.load_state_dict(methods.state_dict())
    with again.evaluated(model) as restored:
        assert torch.equal(restored.weight, averaged.weight)
    # fwk export takes the average from a checkpoint's state, through the same protocol
    exported = Methods.exported({"methods": methods.state_dict()})
    assert exported is not None and torch.equal(exported["weight"], averaged.weight)
    assert Methods.exported({"methods": {}}) is None


def test_a_method_the_model_cannot_serve_is_one_line() -> None:
    with pytest.raises(UserError, match="^methods: seq_warmup serves lm recipes, not this classification model"):
        Methods(["seq_warmup"], MethodConfig(), 10).prepare(nn.Linear(2, 2), "classification")


def test_a_bad_method_name_is_one_line_before_any_run_dir(runs: Path) -> None:
    out = run_fwk("train", "methods=[ema,warp_drive]", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "fwk: error: methods=['ema', 'warp_drive'] is not allowed: expected a list of early_exit, ema, "
        "label_smoothing, progressive_resize, prune_gradually, seq_warmup (fix it with methods=...)"
    )
    assert not runs.exists()


CASES = {
    "ema": ["methods=[ema]", "method.ema.half_life=5"],
    "label_smoothing": ["methods=[label_smoothing]"],
    "progressive_resize": ["methods=[progressive_resize]"],  # the digits' 8 px: 4 px, then 8
    # 16 KB of val text: its two evaluations a run take 128 windows, not 2,048 (~1 s each)
    "seq_warmup": [
        "methods=[seq_warmup]",
        "recipe=gpt_stdlib",
        "model.n_embd=32",
        "model.n_head=2",
        "data.val_max_bytes=16384",
    ],
    "prune_gradually": ["methods=[prune_gradually]"],  # stages after steps 2, 5, 8, 10: the resume replays two
}


@pytest.mark.parametrize("method", list(CASES))
def test_a_run_stopped_mid_way_resumes_bit_exactly(tmp_path: Path, method: str) -> None:
    args = ["train", *CASES[method], "train.max_steps=20", "train.eval_every=10", "train.log_every=5", "jit=off"]
    args += ["checkpoint.every=5", "checkpoint.keep=10", "train.batch_size=16"]
    straight, _, _ = resumes_bit_exactly(args, tmp_path, final_step=20)  # ema: its average's evaluation too
    assert f"{method}: " in straight.stdout  # the method's line: what it does and when


def test_methods_under_two_process_ddp_keep_replicas_in_sync(runs: Path) -> None:
    import torch.distributed as dist

    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk(
        "train", "methods=[ema,label_smoothing,progressive_resize]", "method.ema.half_life=5", "parallel=ddp",
        "parallel.nproc_per_node=2",
        "train.max_steps=30", "train.eval_every=30", "jit=off", runs=runs, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True and summary["eval"]["val_acc"] > 0.5


def test_label_smoothing_sets_the_steps_loss_through_the_loss_hook() -> None:
    from fwk.models.loss import CrossEntropy

    plain = CrossEntropy(fused=True)
    assert Methods(["ema"], MethodConfig(), 10).loss(plain) is plain  # a method without the hook changes nothing
    smoothed = Methods(["ema", "label_smoothing"], MethodConfig(), 10).loss(plain)
    assert (smoothed.label_smoothing, smoothed.fused) == (0.1, True)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    unfused = Methods(["label_smoothing"], MethodConfig(), 10).loss(CrossEntropy())
    expected = torch.nn.functional.cross_entropy(x, y, label_smoothing=0.1)
    assert torch.allclose(unfused(nn.Identity(), x, y), expected)
    assert not torch.allclose(CrossEntropy()(nn.Identity(), x, y), expected)
