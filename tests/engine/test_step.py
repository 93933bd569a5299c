"""TrainStep through the one per-step interface: a toy strategy, written here, is called as
the built-in ones are, and the step plan splits and accumulates as it says."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from fwk.distributed.group import Dist
from fwk.engine.step import TrainStep
from fwk.models.loss import CrossEntropy
from fwk.strategies.per_step import PerStep
from fwk.strategies.step_plan import StepPlan

SOLO = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


@dataclass
class _Plan:  # what StepPlan reads of memory's plan
    micro_batches: int = 1


class _Memory:
    def __init__(self, micro: int = 1) -> None:
        self.plan = _Plan(micro)
        self.oom_at: list[int] = []

    def retry_after_oom(self, step: int) -> None:
        self.oom_at.append(step)
        self.plan = _Plan(self.plan.micro_batches * 2)


class Recorder(PerStep):
    """A strategy of a user's own: it sees every hook of every step, in order."""

    def __init__(self, name: str, calls: list[str], decides_at: int = 0) -> None:
        self.name, self.calls, self.decides_at = name, calls, decides_at

    def begin(self, step: int, turn: bool = True) -> bool:
        self.calls.append(f"{self.name}.begin({step}, {turn})")
        return turn and step >= self.decides_at

    @contextlib.contextmanager
    def around_step(self):
        self.calls.append(f"{self.name}.step<")
        yield
        self.calls.append(f"{self.name}.step>")

    @contextlib.contextmanager
    def around_piece(self):
        self.calls.append(f"{self.name}.piece")
        yield

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(f"{self.name}.input{tuple(x.shape)}")
        return x

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        self.calls.append(f"{self.name}.scale")
        return loss

    def step_done(self, step: int, seconds: float) -> None:
        self.calls.append(f"{self.name}.done({step})")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def _batch(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _step(model: nn.Module, strategies: list[PerStep], plan: StepPlan, clip: float = 0.0) -> TrainStep:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return TrainStep(model, opt, strategies, plan, CrossEntropy(), clip, SOLO)


def test_each_hook_of_each_strategy_runs_in_order_and_the_turn_passes_on() -> None:
    calls: list[str] = []
    first, second = Recorder("a", calls, decides_at=1), Recorder("b", calls)
    step = _step(_model(), [first, second], StepPlan(2, _Memory(micro=2)))
    step(0, [_batch(), _batch(seed=2)])
    # a's decision is not made at step 0: b's turn has not come
    assert calls[:4] == ["a.begin(0, True)", "b.begin(0, False)", "a.step<", "b.step<"]
    pieces = calls[4:-4]
    assert len(pieces) == 4 * 6  # two batches, two micro-batches each; six hook calls per piece
    assert pieces[:6] == ["a.piece", "b.piece", "a.input(4, 4)", "b.input(4, 4)", "a.scale", "b.scale"]
    assert calls[-4:] == ["b.step>", "a.step>", "a.done(0)", "b.done(0)"]
    calls.clear()
    step(1, [_batch(), _batch(seed=2)])
    assert calls[:2] == ["a.begin(1, True)", "b.begin(1, True)"]


def test_the_pieces_give_the_gradient_of_one_big_batch() -> None:
    (x1, y1), (x2, y2) = _batch(6), _batch(10, seed=2)  # unequal sizes: each piece weighs its share
    whole, split = _model(), _model()
    _step(whole, [], StepPlan(1, _Memory()))(0, [(torch.cat([x1, x2]), torch.cat([y1, y2]))])
    plan = StepPlan(2, _Memory(micro=3))
    assert len(plan.pieces([(x1, y1), (x2, y2)])) == 6
    _step(split, [], plan)(0, [(x1, y1), (x2, y2)])
    for a, b in zip(whole.parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


class _Scaler(PerStep):
    """Steps the optimizer itself, as fp16's gradient scaler does: the step must not step it again."""

    def __init__(self) -> None:
        self.unscaled = self.stepped = 0

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        self.unscaled += 1

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        self.stepped += 1
        return True  # and it skips the update


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_a_strategy_that_steps_the_optimizer_replaces_the_plain_step(clip: float) -> None:
    model, scaler = _model(), _Scaler()
    before = [p.detach().clone() for p in model.parameters()]
    _step(model, [scaler], StepPlan(1, _Memory()), clip=clip)(0, [_batch()])
    assert (scaler.stepped, scaler.unscaled) == (1, int(clip > 0))  # unscaled only to clip
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class _Flaky(PerStep):
    """Fails the first forward, then recovers (as jit does when compiled code fails)."""

    def __init__(self) -> None:
        self.failed = False
        self.recovered: list[str] = []

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        if not self.failed:
            self.failed = True
            raise RuntimeError("compiled code failed")
        return x

    def recover(self, exc: BaseException) -> bool:
        self.recovered.append(str(exc))
        return True


def test_an_error_a_strategy_recovers_from_redoes_the_step_and_one_it_does_not_is_raised() -> None:
    flaky = _Flaky()
    loss = _step(_model(), [flaky], StepPlan(1, _Memory()))(0, [_batch()])
    assert flaky.recovered == ["compiled code failed"] and torch.isfinite(loss)

    class Breaks(PerStep):  # no strategy claims its error
        def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("a user's bug")

    with pytest.raises(RuntimeError, match="a user's bug"):
        _step(_model(), [Breaks(), PerStep()], StepPlan(1, _Memory()))(0, [_batch()])


def test_out_of_memory_asks_the_plan_and_redoes_the_step_with_more_micro_batches() -> None:
    memory, sizes = _Memory(), []
    model = _model()

    def tight(module: nn.Module, args: tuple) -> None:
        sizes.append(len(args[0]))
        if len(args[0]) > 4:
            raise torch.cuda.OutOfMemoryError("simulated")

    model.register_forward_pre_hook(tight)
    _step(model, [], StepPlan(1, memory))(3, [_batch(8)])
    assert memory.oom_at == [3] and sizes == [8, 4, 4]


def test_the_plan_accumulates_more_up_to_its_limit_and_resumes_on_fewer_processes() -> None:
    plan = StepPlan(2, _Memory())
    assert plan.accumulate_more(8) == "raised gradient accumulation 2 -> 4 steps"
    assert plan.accumulate_more(6) == "raised gradient accumulation 4 -> 6 steps"
    assert plan.accumulate_more(6) is None and plan.accum_steps == 6
    halved = StepPlan(4, _Memory(), factor=2)  # train.accum_steps=2, on half the processes
    halved.resume(3)  # the written run had adapted to 3
    assert halved.accum_steps == 6
