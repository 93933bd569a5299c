"""Trial steps are redone as decided: a run computes the same thing whether its measured
decisions were measured in it or recalled (fwk/components/trials.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fwk.components.checkpoint import model_weights
from fwk.components.resumable import Resumable
from fwk.components.trials import Replayable, Trials
from tests.conftest import run_fwk


class _Batches:
    """A resumable source of batches 0, 1, 2, ... (position: how many were produced)."""

    def __init__(self) -> None:
        self.made = 0

    def __iter__(self):
        while True:
            self.made += 1
            yield torch.full((2, 3), float(self.made - 1))

    def state_dict(self) -> dict[str, int]:
        return {"made": self.made}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.made = state["made"]


def test_replayed_batches_come_again_in_order_with_their_positions() -> None:
    source = _Batches()
    batches = Replayable(source)
    assert float(next(batches)[0, 0]) == 0
    batches.record()
    seen = [float(next(batches)[0, 0]) for _ in range(3)]
    assert seen == [1, 2, 3] and batches.state_dict() == {"made": 4}
    batches.replay()
    assert batches.state_dict() == {"made": 1}  # back where the recording began
    again = []
    for _ in range(4):
        again.append(float(next(batches)[0, 0]))
        again.append(batches.state_dict()["made"])  # a checkpoint here stores what was handed out
    assert again == [1, 2, 2, 3, 3, 4, 4, 5]
    batches.record()  # a second trial that starts while nothing is queued: recorded afresh
    assert float(next(batches)[0, 0]) == 5
    batches.replay()
    assert float(next(batches)[0, 0]) == 5 and float(next(batches)[0, 0]) == 6


class _Trying:
    """A stand-in strategy: ``trying`` for the steps given; while trying, each step's update is
    another (a trial candidate), so that only a redo gives the recalled run's weights."""

    def __init__(self, trial_steps: set[int]) -> None:
        self.trial_steps, self.step = trial_steps, 0
        self.rewound = 0

    @property
    def trying(self) -> bool:
        return self.step in self.trial_steps and not self.rewound

    def state_dict(self) -> dict:
        return {}

    def rewind(self, before: dict) -> None:
        self.rewound += 1


def _train(trial_steps: set[int], steps: int = 8) -> tuple[nn.Module, list[int]]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = _Trying(trial_steps)
    batches = Replayable(_Batches())
    trials = Trials(strategy, Resumable(model, optimizer, strategy=strategy), batches, [])
    step, done = 0, []
    while step < steps:
        strategy.step = step
        trials.before(step)
        x = next(batches)
        scale = 3.0 if strategy.trying else 1.0  # the trial's candidate computes otherwise
        loss = (model(x) * scale + torch.randn(()) * 0.01).pow(2).mean()  # draws from the RNG too
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        strategy.step = step
        if trials.active:
            redo = trials.after(step)
            step = step if redo is None else redo
            continue
        done.append(step)
    return model, done


def test_a_trial_is_redone_from_its_snapshot_and_ends_where_a_run_without_it_ends() -> None:
    recalled, done = _train(set())
    measured, redone = _train({2, 3, 4})
    assert done == redone == list(range(1, 9))  # the trial's steps are not kept: each step counts once
    for a, b in zip(recalled.parameters(), measured.parameters(), strict=True):
        assert torch.equal(a, b)


ARGS = [
    "train.max_steps=24",
    "precision.max_trial_share=1",  # a short run that times its formats all the same
    "train.batch_size=32",
    "train.eval_every=0",
    "train.log_every=4",
    "checkpoint.every=4",  # inside precision's trial steps (0-5): saved when they are redone
    "precision.probe_steps=2",
    "precision.trial_steps=2",
    "jit.stable_steps=2",
    "jit.trial_steps=2",
    "jit.min_remaining_s=0",
    "jit.max_trial_share=0",
    "jit.backend=aot_eager",  # compiles in a second; the trial's switch of step is what is tested
]


@pytest.mark.parametrize("bf16", ["1", "0"], ids=["cpu-with-bf16-units", "cpu-without"])
def test_a_deciding_run_and_a_recalling_run_end_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bf16: str
) -> None:
    """The same command twice with one decision cache: the first measures precision (with
    bf16 units: its probe and trial steps) and jit (compiled trial steps), the second recalls
    both. Same weights, same checkpoints, same logged losses, compiled from the same step."""
    monkeypatch.setenv("FWK_CPU_BF16", bf16)
    first = run_fwk("train", *ARGS, runs=tmp_path / "deciding")
    assert first.returncode == 0, first.stderr
    second = run_fwk("train", *ARGS, runs=tmp_path / "recalling")
    assert second.returncode == 0, second.stderr
    if bf16 == "1":
        assert "timing bf16 against fp32" in first.stdout and "were trial steps: redone as decided" in first.stdout
        assert "as measured before for this model on this machine" in second.stdout
    assert "jit=auto" in first.stdout and "were trial steps" not in second.stdout
    (a,), (b,) = (tmp_path / "deciding").glob("*/"), (tmp_path / "recalling").glob("*/")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (a, b)]
    sources = [{k: v["source"] for k, v in s["decisions"].items()} for s in summaries]
    assert set(sources[0].values()) <= {"measured", "hardware"} and "cached" in sources[1].values()
    jit = [s["decisions"]["jit"] for s in summaries]
    assert jit[0]["choice"] == jit[1]["choice"] and jit[0]["compile_at"] is not None  # the first run tried
    if jit[0]["choice"] == "compiled":  # the recalling run compiles where the deciding one did
        assert jit[1]["compile_at"] == jit[0]["compile_at"]
    for step in (20, 24):  # the two checkpoints kept (checkpoint.keep=2)
        wa, wb = (model_weights(d / "checkpoints" / f"step-{step:08d}") for d in (a, b))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), step

    def losses(d: Path) -> list[float]:
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"]) for r in rows if r.get("kind") == "train"]

    assert losses(a) == losses(b) and [s for s, _ in losses(a)] == [4, 8, 12, 16, 20, 24]
    assert summaries[0]["eval"] == summaries[1]["eval"]
