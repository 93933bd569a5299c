"""Two CPU processes through torchrun: DDP keeps replicas identical and the loss falls,
also with the precision and memory strategies on top."""

import json
import subprocess
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.conftest import require, run_fwk


@pytest.mark.parametrize(
    "strategy",
    [
        # the plain case (parallel=auto, the default recipe): test_fsdp.py::test_fsdp_matches_ddp
        ["memory=microbatch", "memory.micro_batches=4", "precision=fp16"],
        ["memory=checkpoint", "precision=staged", "precision.warmup_steps=10", "train.accum_steps=2"],
        ["jit=compile", "jit.backend=aot_eager", "memory=checkpoint"],
        ["parallel.comm_hook=fp16", "parallel.bucket_cap_mb=1"],
        ["parallel.comm_hook=powersgd", "parallel.powersgd_start=2", "parallel.static_graph=true"],
    ],
    ids=["microbatch-fp16", "checkpoint-staged-accum", "compile-checkpoint", "fp16-hook", "powersgd"],
)
def test_two_process_ddp_digits(runs: Path, strategy: list[str]) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    args = ["parallel.nproc_per_node=2", "train.max_steps=40", "train.eval_every=40", "train.log_every=10"]
    out = run_fwk("train", *args, *strategy, runs=runs, timeout=600)
    trained_in_sync(out, runs)


def trained_in_sync(out: subprocess.CompletedProcess, runs: Path) -> None:
    """Assert that a two-process run of the digits CNN under parallel=auto finished, chose
    DDP, kept its replicas identical and learned."""
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["replicas_in_sync"] is True  # with micro-batches, DDP syncs on the last piece of every step
    assert summary["eval"]["val_acc"] > 0.8
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] / 3
    assert "parallel=auto chose ddp" in out.stdout
