"""Memory strategies: checkpoint/offload give the same gradients, micro-batches and
accumulation the same step as one big batch, auto decides within a budget and survives OOM."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

from fwk.config.schema import JitConfig, MemoryConfig, PrecisionConfig, TrainConfig
from fwk.distributed.group import Dist
from fwk.engine.step import TrainStep
from fwk.errors import UserError
from fwk.models.cnn import SmallCNN
from fwk.models.gpt import GPT
from fwk.models.loss import CrossEntropy
from fwk.strategies.jit import Jit
from fwk.strategies.memory import Memory, MemoryPlan
from fwk.strategies.modules import blocks
from fwk.strategies.precision import Precision
from fwk.strategies.step_plan import StepPlan

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
# Splitting a batch changes only the order of float32 additions in the gradient sums
# (one reduction over 16 samples vs four over 4, then added): about 1e-7 relative.
SPLIT_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _gpt() -> nn.Module:
    torch.manual_seed(0)
    return GPT(vocab_size=32, block_size=16, n_layer=3, n_head=2, n_embd=16)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN(in_channels=1, channels1=4, channels2=8, hidden=16, num_classes=10)


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def _batch(model: nn.Module, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if isinstance(model, GPT):
        return torch.randint(0, 32, (n, 16), generator=g), torch.randint(0, 32, (n, 16), generator=g)
    size, channels = (16, 3) if isinstance(model, torchvision.models.ResNet) else (8, 1)
    return torch.randn(n, channels, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def _stepper(
    model: nn.Module, memory: MemoryConfig, lr: float = 0.1, decisions: Any = None, **train
) -> tuple[TrainStep, Memory]:
    precision = Precision(PrecisionConfig(name="fp32"), SOLO, 100)
    mem = Memory(memory, SOLO, per_rank_batch=16, decisions=decisions)
    model = mem.apply(precision.prepare(model))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    jit = Jit(JitConfig(name="off"), SOLO, 100)
    cfg = TrainConfig(**train)
    plan = StepPlan(cfg.accum_steps, mem)
    return TrainStep(model, opt, [precision, mem, jit], plan, CrossEntropy(), cfg.grad_clip, SOLO), mem


def _grads(model: nn.Module, memory: MemoryConfig) -> dict[str, torch.Tensor]:
    step, _ = _stepper(model, memory, lr=0.0)  # lr 0: the step leaves the weights, we read the grads
    grads: dict[str, torch.Tensor] = {}
    step.optimizer.zero_grad = lambda set_to_none=True: None  # keep them for the test
    step(0, [_batch(model)])
    for name, p in model.named_parameters():
        grads[name] = p.grad.clone()
    return grads


@pytest.mark.parametrize("build", [_gpt, _cnn, _resnet], ids=["gpt", "small_cnn", "resnet18"])
@pytest.mark.parametrize("strategy", ["checkpoint", "offload"])
def test_checkpoint_and_offload_gradients_equal_none_exactly(build, strategy: str) -> None:
    expected = _grads(build(), MemoryConfig(name="none"))
    model = build()
    got = _grads(model, MemoryConfig(name=strategy))
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    plain = build()
    _grads(plain, MemoryConfig(name="none"))
    for (name, a), b in zip(model.named_buffers(), plain.buffers(), strict=False):  # BatchNorm stats updated once
        assert torch.equal(a, b), name


def test_checkpoint_every_second_block_and_by_name() -> None:
    _, mem = _stepper(_gpt(), MemoryConfig(name="checkpoint", every=2))
    assert mem.targets == ["blocks.0", "blocks.2"]
    _, mem = _stepper(_gpt(), MemoryConfig(name="checkpoint", modules=["blocks.1.mlp", "ln_f"]))
    assert mem.targets == ["blocks.1.mlp", "ln_f"]


def test_blocks_are_found_from_the_model() -> None:
    with torch.device("meta"):
        resnet50 = torchvision.models.resnet50()
    names = [n for n, _ in blocks(resnet50)]
    assert len(names) == 16 and names[0] == "layer1.0" and names[-1] == "layer4.2"  # the bottlenecks
    assert [n for n, _ in blocks(_gpt())] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [n for n, _ in blocks(_cnn())] == ["features", "head"]  # no repeated block: top-level parts


@pytest.mark.parametrize("build", [_gpt, _cnn], ids=["gpt", "small_cnn"])
def test_microbatch_step_equals_the_full_batch_step(build) -> None:
    full, split = build(), build()
    _stepper(full, MemoryConfig(name="none"))[0](0, [_batch(full)])
    _stepper(split, MemoryConfig(name="microbatch", micro_batches=4))[0](0, [_batch(split)])
    for (name, a), b in zip(full.named_parameters(), split.parameters(), strict=False):
        torch.testing.assert_close(b, a, **SPLIT_TOL, msg=name)


def test_accum_steps_equal_one_batch_twice_as_big() -> None:
    big, accum = _cnn(), _cnn()
    x, y = _batch(big, 16)
    _stepper(big, MemoryConfig(name="none"))[0](0, [(x, y)])
    _stepper(accum, MemoryConfig(name="none"), accum_steps=2)[0](0, [(x[:8], y[:8]), (x[8:], y[8:])])
    for (name, a), b in zip(big.named_parameters(), accum.parameters(), strict=False):
        torch.testing.assert_close(b, a, **SPLIT_TOL, msg=name)


def test_auto_picks_the_fastest_plan_within_the_budget() -> None:
    model = _gpt()
    # what none keeps for backward, measured the same way auto does
    probe, probe_mem = _stepper(_gpt(), MemoryConfig(name="auto", budget_gb=1.0))
    probe(0, [_batch(model)])
    probe(1, [_batch(model)])
    none_bytes = probe_mem.trials[MemoryPlan()][0] if probe_mem.trials else None
    assert none_bytes and none_bytes > 0
    budget = none_bytes * 0.6 / 1e9  # none does not fit; micro-batching or checkpointing does
    step, mem = _stepper(model, MemoryConfig(name="auto", budget_gb=budget))
    plans = []
    for i in range(6):
        plans.append(mem.plan)
        step(i, [_batch(model)])
    # warm-up, then the trials
    assert plans[:4] == [MemoryPlan(), MemoryPlan(), MemoryPlan(micro_batches=2), MemoryPlan(checkpoint=True)]
    assert mem.trials is None  # decided
    assert mem.plan in (MemoryPlan(micro_batches=2), MemoryPlan(checkpoint=True))
    assert mem.state_dict() == {
        "plan": {"checkpoint": mem.plan.checkpoint, "offload": False, "micro_batches": mem.plan.micro_batches},
        "deciding": False,
    }


def test_auto_with_a_budget_nothing_fits_is_one_clear_line() -> None:
    model = _cnn()
    step, _ = _stepper(model, MemoryConfig(name="auto", budget_gb=1e-12))
    with pytest.raises(UserError) as err:
        for i in range(20):
            step(i, [_batch(model)])
    assert "memory.budget_gb=0.00 is too small" in str(err.value)
    assert "raise memory.budget_gb or lower train.batch_size" in str(err.value)


class _Tight(nn.Module):
    """Runs 'out of memory' on batches larger than 4 samples, as a GPU would: after the forward,
    whose output (and what it saved for backward) the failed step leaves behind."""

    def __init__(self, most: int = 4) -> None:
        super().__init__()
        self.inner, self.most = _cnn(), most
        self.attempts: list[int] = []
        self.left: list[weakref.ref[torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.attempts.append(x.shape[0])
        out = self.inner(x)
        if x.shape[0] > self.most:
            self.left.append(weakref.ref(out))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return out


def test_auto_redoes_an_oom_step_with_twice_the_micro_batches() -> None:
    tight, reference = _Tight(), _cnn()
    step, mem = _stepper(tight, MemoryConfig(name="auto"))  # CPU, no budget: starts as none
    x, y = _batch(reference)
    step(0, [(x, y)])
    assert mem.plan == MemoryPlan(micro_batches=4)
    assert tight.attempts == [16, 8, 4, 4, 4, 4]  # none, x2 (fails at once), x4: the same 16 samples
    _stepper(reference, MemoryConfig(name="none"))[0](0, [(x, y)])
    for (name, a), b in zip(reference.named_parameters(), tight.inner.parameters(), strict=False):
        torch.testing.assert_close(b, a, **SPLIT_TOL, msg=name)


def test_the_failed_steps_tensors_are_freed_before_the_redo() -> None:
    # inside the except block the traceback's frames would keep the failed forward's tensors
    # alive, and empty_cache could not give their memory back for the redo
    tight = _Tight()
    step, mem = _stepper(tight, MemoryConfig(name="auto"))
    alive_at_retry: list[list[bool]] = []
    retry = mem.retry_after_oom

    def watched(at: int) -> None:
        alive_at_retry.append([ref() is not None for ref in tight.left])
        retry(at)

    mem.retry_after_oom = watched
    step(0, [_batch(_cnn())])
    assert alive_at_retry == [[False], [False, False]]


def test_auto_reports_the_trial_plans_that_ran_out_of_memory(said: pytest.LogCaptureFixture) -> None:
    step, mem = _stepper(_Tight(), MemoryConfig(name="auto", budget_gb=1.0))
    said.clear()  # the lines of the steps only
    for i in range(8):
        step(i, [_batch(_cnn())])
    assert mem.plan == MemoryPlan(checkpoint=True, micro_batches=4)  # the first plan of 4 samples
    chosen = [s for s in said.messages if s.startswith("memory=auto chose")]
    assert len(chosen) == 1
    assert "tried none out of memory; microbatch x2 out of memory; checkpoint out of memory;" in chosen[0]
    assert "inf" not in chosen[0]


def test_auto_when_every_plan_runs_out_of_memory_is_one_clear_line() -> None:
    tight = _Tight(most=0)
    step, _ = _stepper(tight, MemoryConfig(name="auto", budget_gb=1.0))
    with pytest.raises(UserError) as err:
        for i in range(3):
            step(i, [_batch(_cnn())])
    assert str(err.value).startswith(
        "out of memory at step 0 with every plan memory=auto tried, down to checkpoint + microbatch x16;"
    )
    assert str(err.value).endswith("lower train.batch_size, use a smaller model, or more processes")
    assert sorted(set(tight.attempts), reverse=True) == [16, 8, 4, 2, 1]  # down to one sample, never again


def test_oom_without_auto_is_one_clear_line() -> None:
    step, _ = _stepper(_Tight(), MemoryConfig(name="none"))
    with pytest.raises(UserError) as err:
        step(7, [_batch(_cnn())])
    assert str(err.value).startswith("out of memory at step 7 with memory=none; use memory=auto")


def test_checkpoint_keeps_less_for_backward() -> None:
    counted = {}
    for strategy in ("none", "checkpoint"):
        model = _gpt()
        _, mem = _stepper(model, MemoryConfig(name=strategy))
        x, y = _batch(model)
        with mem.meter.counting(None):
            nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        counted[strategy] = mem.meter.take()
    # 3 blocks: each keeps only its input instead of ~20 tensors of attention and MLP
    assert 0 < counted["checkpoint"] < 0.3 * counted["none"]


def test_auto_on_cpu_counts_what_offload_holds_and_chooses_it_when_only_it_fits() -> None:
    def deep() -> nn.Module:  # 12 convolutions at one size: every saved activation 2 MiB, over offload's 64 KiB
        torch.manual_seed(0)
        layers = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()]
        for _ in range(11):
            layers += [nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def batch(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)

    def decide(budget_gb: float) -> tuple[Memory, dict[str, float]]:
        kept = _Kept()
        step, mem = _stepper(deep(), MemoryConfig(name="auto", budget_gb=budget_gb), decisions=kept)
        for i in range(6):  # a warm-up, then one step under each of the 4 plans
            step(i, [batch()])
        assert mem.trials is None  # decided
        return mem, {name: peak for name, peak, _ in kept.kept["memory"]["trials"]}

    _, measured = decide(1.0)
    assert set(measured) == {"none", "microbatch x2", "checkpoint", "offload"}
    none, offload = measured["none"], measured["offload"]
    assert none > 20 * 2**20  # 12 activations of 2 MiB (a ReLU and the next convolution share one)
    assert 0 < offload < 0.45 * none  # what waits for its write or was read back, not every activation
    others = min(v for name, v in measured.items() if name != "offload")
    assert offload < 0.8 * others
    tight, _ = decide(0.95 * others / 1e9)  # below every plan but offload
    assert tight.plan == MemoryPlan(offload=True)


class _Kept:
    """Where memory=auto puts its decision: here, only kept to be read."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    def recall(self, name: str) -> tuple[None, str]:
        return None, ""  # nothing measured before: auto measures

    def keep(self, name: str, record: dict[str, Any], source: str) -> None:
        self.kept[name] = record
