"""The kernels strategy: which path runs, the swapped modules, the GPT's chunked head loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fwk.config.schema import KernelsConfig
from fwk.errors import UserError
from fwk.kernels import available
from fwk.models.gpt import GPT
from fwk.models.loss import CrossEntropy
from fwk.strategies.kernels import Kernels
from tests.conftest import require, run_fwk

CPU = torch.device("cpu")


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def test_auto_is_plain_pytorch_on_cpu(said: pytest.LogCaptureFixture) -> None:
    kernels = Kernels(KernelsConfig(name="auto"), CPU)
    model = kernels.apply(_gpt())
    assert not kernels.triton and not kernels.fused_loss
    assert type(model.ln_f) is torch.nn.LayerNorm
    assert said.messages == ["kernels: plain PyTorch (no CUDA device)"]


def test_triton_without_a_gpu_or_interpreter_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    require(available(), "Triton is needed")  # imported now, under the interpreter setting it keeps
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError) as err:
        Kernels(KernelsConfig(name="triton"), CPU)
    assert str(err.value).startswith("kernels=triton needs a CUDA device (or TRITON_INTERPRET=1")


def test_triton_swaps_norms_and_the_head_loss_and_matches_plain(said: pytest.LogCaptureFixture) -> None:
    require(available(), "Triton is needed")
    from fwk.kernels.cross_entropy import linear_cross_entropy
    from fwk.kernels.layernorm import LayerNorm

    plain, fast = _gpt(), _gpt()
    kernels = Kernels(KernelsConfig(name="triton"), CPU)  # the interpreter (conftest)
    kernels.apply(fast)
    assert kernels.triton and kernels.fused_loss
    assert fast.head_loss is linear_cross_entropy
    assert all(type(m) is LayerNorm for m in (fast.ln_f, fast.blocks[0].ln_1, fast.blocks[1].ln_2))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert said.messages == ["kernels: Triton for 5 norm layers, chunked linear cross-entropy, fused optimizer step"]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)
    plain_loss = CrossEntropy(0.1)(plain, x, y)
    fast_loss = CrossEntropy(0.1, fused=kernels.fused_loss)(fast, x, y)
    plain_loss.backward()
    fast_loss.backward()
    # the same math in other summation orders (row sums, chunked log-sum-exp): fp32 ulps
    torch.testing.assert_close(fast_loss, plain_loss, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_lion_trains_digits(runs: Path) -> None:
    # Lion wants a ~3x smaller lr and ~100x larger weight decay than the recipe's AdamW
    out = run_fwk("train", "optim=lion", "optim.lr=1e-3", "optim.weight_decay=1e-2", runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    assert json.loads((run / "summary.json").read_text())["eval"]["val_acc"] >= 0.98
