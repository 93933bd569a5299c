"""FSDP2 and HSDP on two CPU processes (gloo): they train, compose with activation
checkpointing and the JIT layer, keep their checkpoints sharded, and resume exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fwk.engine.checkpoint import model_weights
from tests.conftest import interrupt_after, require, run_fwk


@pytest.fixture(autouse=True)
def _gloo() -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")


def _summary(runs: Path) -> dict:
    (run,) = runs.glob("*/")  # run dirs, not the index
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize(
    ("strategy", "mesh", "ranks"),
    [
        (
            ["parallel=fsdp", "memory=checkpoint", "jit=compile", "jit.backend=aot_eager", "train.accum_steps=2"],
            "shard=2",
            2,
        ),
        (
            ["parallel=hsdp", "parallel.shard_size=2", "parallel.reshard_after_forward=false"],
            "replicate=2 x shard=2",
            4,
        ),
    ],
    ids=["fsdp-checkpoint-compile-accum", "hsdp-2x2"],
)
def test_sharded_training_digits(runs: Path, strategy: list[str], mesh: str, ranks: int) -> None:
    out = run_fwk(
        "train",
        f"parallel.nproc_per_node={ranks}",
        "train.max_steps=40",
        "train.eval_every=40",
        "train.log_every=10",
        *strategy,
        runs=runs,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    summary = _summary(runs)
    assert summary["world_size"] == ranks
    assert summary["replicas_in_sync"] is True  # hsdp: both replica groups hold the same weights
    assert summary["eval"]["val_acc"] > 0.8
    assert f"mesh {mesh};" in out.stdout
    (run,) = runs.glob("*/")  # run dirs, not the index
    final = run / "checkpoints" / "step-00000040"
    assert (final / "sharded" / ".metadata").exists()
    shards = sorted(p.name for p in (final / "sharded").glob("*.distcp"))
    assert shards == [f"__{r}_0.distcp" for r in range(ranks)]  # every rank wrote its own; nothing gathered
    weights = model_weights(final)
    assert weights["head.4.weight"].shape == (10, 128)  # whole tensors, not shards
    rewind = torch.load(run / "rewind" / "step-00000001.pt", weights_only=True)["model"]
    assert rewind["head.4.weight"].shape == (10, 128)  # the rewind point is gathered whole too


def test_fsdp_matches_ddp(tmp_path: Path) -> None:
    """The same run sharded or replicated: the same losses up to reduction order."""
    args = ["train", "parallel.nproc_per_node=2", "train.max_steps=30", "train.eval_every=30", "train.log_every=10"]
    for name in ("ddp", "fsdp"):
        out = run_fwk(*args, f"parallel={name}", runs=tmp_path / name, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
    ddp, fsdp = _summary(tmp_path / "ddp"), _summary(tmp_path / "fsdp")
    assert fsdp["eval"]["val_loss"] == pytest.approx(ddp["eval"]["val_loss"], rel=1e-3)


ARGS = [
    "train",
    "parallel=fsdp",
    "parallel.nproc_per_node=2",
    "train.max_steps=60",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every=20",  # stopped after the first: 40 steps to go, saved and resumed mid-run
    "checkpoint.keep=10",
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


def test_fsdp_stopped_and_resumed_is_bit_identical(tmp_path: Path) -> None:
    straight = run_fwk(*ARGS, runs=tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    (run,) = (tmp_path / "straight").glob("*/")
    expected = model_weights(run / "checkpoints" / "step-00000060")

    runs = tmp_path / "stopped"
    stopped = interrupt_after(ARGS, runs, "*/checkpoints/step-*/manifest.json")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert "checkpoint saved" in stopped.stdout
    resumed = run_fwk(*ARGS, runs=runs, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed run" in resumed.stdout
    (run,) = runs.glob("*/")  # run dirs, not the index
    got = model_weights(run / "checkpoints" / "step-00000060")
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_fp16_is_refused_under_fsdp(runs: Path) -> None:
    out = run_fwk("train", "parallel=fsdp", "parallel.nproc_per_node=2", "precision=fp16", runs=runs)
    assert out.returncode == 2
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert "precision" in line and "bf16" in line
    assert not runs.exists() or not any(runs.iterdir())
