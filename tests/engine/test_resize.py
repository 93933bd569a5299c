"""A run resumes on another number of processes than wrote its checkpoint: the same command
(train.batch_size is the global batch) is the same run, sees the same samples at every step
(tests/data/test_loader.py checks the ids), and ends where a straight run ends, within the
rounding of a gradient summed in another order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from fwk.distributed.shares import split
from fwk.errors import UserError
from tests.conftest import interrupt_after, require, run_fwk

ARGS = [
    "train",
    "model.channels1=8",
    "model.channels2=16",
    "model.hidden=32",
    "train.max_steps=60",
    "train.eval_every=60",
    "train.log_every=10",
    "checkpoint.every=20",
    "checkpoint.keep=10",
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


def _final(runs: Path) -> tuple[str, dict[str, float]]:
    (run,) = runs.glob("*/")  # run dirs, not the index
    return run.name, json.loads((run / "summary.json").read_text())["eval"]


@pytest.mark.parametrize(
    "before,after,parallel",
    [(2, 1, "auto"), (1, 2, "auto"), (2, 1, "fsdp"), (1, 2, "fsdp")],
    # fsdp on 2: torch.distributed.checkpoint reshards its state; on 1 the model is whole
    ids=["2-to-1", "1-to-2", "fsdp-2-to-1", "fsdp-1-to-2"],
)
def test_a_run_stopped_on_one_process_count_resumes_on_another_and_ends_as_a_straight_run(
    tmp_path: Path, before: int, after: int, parallel: str
) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    args = [*ARGS, f"parallel={parallel}"]
    straight = run_fwk(*args, f"parallel.nproc_per_node={before}", runs=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    runs = tmp_path / "moved"
    stopped = interrupt_after([*args, f"parallel.nproc_per_node={before}"], runs, "*/checkpoints/step-*/manifest.json")
    assert stopped.returncode in (0, 130), stopped.stderr
    resumed = run_fwk(*args, f"parallel.nproc_per_node={after}", runs=runs)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    (expected_id, expected), (got_id, got) = _final(tmp_path / "straight"), _final(runs)
    assert got_id == expected_id  # the same run, whatever the process count
    line = next(x for x in resumed.stdout.splitlines() if x.startswith("resuming step"))
    processes = f"{after} data-parallel rank{'s' if after > 1 else ''}"
    micro = ", as 2 micro-batches" if after < before else ""
    assert line.endswith(f"of run {got_id} on {processes} (written by {before}): same global batch 64{micro}"), line
    # the same samples at every step; the gradients summed in another order
    assert abs(got["val_loss"] - expected["val_loss"]) < 0.01 and abs(got["val_acc"] - expected["val_acc"]) <= 0.01
    print(f"{parallel} {before} -> {after}: val_loss {got['val_loss']:.6f} vs {expected['val_loss']:.6f} straight")


def test_fewer_processes_accumulate_what_they_cannot_hold() -> None:
    assert split(64, 2, None) == (32, 1) and split(64, 1, 2) == (32, 2) and split(64, 4, 2) == (16, 1)
    assert split(96, 4, 6) == (12, 2)  # 6 processes of 16 -> 4: 16 does not divide 96 / 4, 12 twice does
    with pytest.raises(
        UserError,
        match=r"^a global batch of 64 cannot be shared out evenly on 3 processes with at most "
        r"16 samples each \(as the 4 that wrote the checkpoint had\); set train.batch_size to a multiple",
    ):
        split(64, 3, 4)
