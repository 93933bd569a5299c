"""Two CPU processes through torchrun: DDP keeps replicas identical and the loss falls."""

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.conftest import require, run_fwk


def test_two_process_ddp_digits(runs: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk(
        "train",
        "parallel.nproc_per_node=2",
        "train.max_steps=60",
        "train.eval_every=60",
        "train.log_every=10",
        runs=runs,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["replicas_in_sync"] is True
    assert summary["eval"]["val_acc"] > 0.8
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] / 3
    assert "parallel=auto chose ddp" in out.stdout


@pytest.mark.parametrize(
    "strategy",
    [
        ["memory=microbatch", "memory.micro_batches=4", "precision=fp16"],
        ["memory=checkpoint", "precision=staged", "precision.warmup_steps=10", "train.accum_steps=2"],
    ],
    ids=["microbatch-fp16", "checkpoint-staged-accum"],
)
def test_two_process_ddp_with_strategies(runs: Path, strategy: list[str]) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk(
        "train",
        "parallel.nproc_per_node=2",
        "train.max_steps=40",
        "train.eval_every=40",
        "train.log_every=10",
        *strategy,
        runs=runs,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True  # no_sync on all but the last piece still syncs every step
    assert summary["eval"]["val_acc"] > 0.8
