"""FSDP2 and HSDP on two CPU processes (gloo): they train, compose with activation
checkpointing and the JIT layer, keep their checkpoints sharded, and resume exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fwk.components.checkpoint import model_weights
from tests.conftest import both_cpus, interrupt_after, require, run_fwk
from tests.strategies.test_ddp import trained_in_sync


@pytest.fixture(autouse=True)
def _gloo() -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")


def _summary(runs: Path) -> dict:
    (run,) = runs.glob("*/")  # run dirs, not the index
    return json.loads((run / "summary.json").read_text())


FSDP_ACCUM = ["parallel=fsdp", "memory=checkpoint", "jit=compile", "jit.backend=aot_eager", "train.accum_steps=2"]
HSDP = ["parallel=hsdp", "parallel.shard_size=2", "parallel.reshard_after_forward=false"]


# HSDP's 4 processes run once, as on a CPU with bf16 units: precision=auto's trial steps
# under HSDP, then redone in whichever format this CPU measured faster.
@pytest.mark.parametrize(
    ("strategy", "mesh", "ranks", "cpu_bf16"),
    [
        pytest.param(FSDP_ACCUM, "dp_shard=2", 2, False, id="cpu-fp32-fsdp-checkpoint-compile-accum"),
        pytest.param(FSDP_ACCUM, "dp_shard=2", 2, True, id="cpu-bf16-fsdp-checkpoint-compile-accum"),
        pytest.param(HSDP, "dp_replicate=2 x dp_shard=2", 4, True, id="cpu-bf16-hsdp-2x2"),
    ],
    indirect=["cpu_bf16"],
)
def test_sharded_training_digits(runs: Path, strategy: list[str], mesh: str, ranks: int, cpu_bf16: bool) -> None:
    out = run_fwk(
        "train",
        f"parallel.nproc_per_node={ranks}",
        "train.max_steps=40",
        "train.eval_every=40",
        "train.log_every=10",
        "precision.max_trial_share=1",  # a short run that times its formats all the same
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
    # with bf16 units auto times bf16 against fp32 (steps 0-7) and keeps what it measured
    # faster; channels-last follows the units, and FSDP keeps the conv weights contiguous
    decision = summary["decisions"]["precision"]
    assert summary["precision"] == decision["choice"] == (decision["choice"] if cpu_bf16 else "fp32")
    assert ("precision=auto: CPU" in out.stdout and "timing bf16 against fp32 on steps 0-7" in out.stdout) is cpu_bf16
    assert (decision["source"], decision["trial"] is not None) == (
        ("measured", True) if cpu_bf16 else ("hardware", False)
    )
    assert ("inputs channels-last" in out.stdout) is cpu_bf16
    (run,) = runs.glob("*/")  # run dirs, not the index
    final = run / "checkpoints" / "step-00000040"
    assert (final / "sharded" / ".metadata").exists()
    shards = sorted(p.name for p in (final / "sharded").glob("*.distcp"))
    assert shards == [f"__{r}_0.distcp" for r in range(ranks)]  # every rank wrote its own; nothing gathered
    weights = model_weights(final)
    assert weights["head.4.weight"].shape == (10, 128)  # whole tensors, not shards
    rewind = torch.load(run / "rewind" / "step-00000001.pt", weights_only=True)["model"]
    assert rewind["head.4.weight"].shape == (10, 128)  # the rewind point is gathered whole too


@pytest.mark.parametrize(
    ("recipe", "size"),
    [
        (["train.max_steps=30", "train.eval_every=30"], ["train.batch_size=16", "data.val_size=64"]),
        # ResNet-18 (BatchNorms, residuals, 1x1 downsample convs) at 16 px, 2 images a rank: the
        # mechanics, not accuracy (a step of it in emulated bf16 takes seconds on a CPU without bf16 units)
        (
            ["recipe=resnet_digits", "train.max_steps=2", "train.eval_every=0"],
            ["data.image_size=16", "train.batch_size=4", "data.val_size=8"],
        ),
    ],
    ids=["digits_cnn", "resnet_digits"],
)
def test_fsdp_with_bf16_and_channels_last(runs: Path, recipe: list[str], size: list[str]) -> None:
    """FSDP2 refuses channels-last (non-contiguous) parameters: the conv weights stay
    contiguous under FSDP while the inputs, and so the activations, are channels-last."""
    layout = ["precision=bf16", "precision.channels_last=true", "jit=off"]
    args = ["parallel=fsdp", "parallel.nproc_per_node=2", "train.log_every=1", *layout]
    out = run_fwk("train", *recipe, *size, *args, runs=runs, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "precision=bf16 (" in out.stdout and "channels_last" in out.stdout
    assert "conv weights contiguous (FSDP shards no other), inputs channels-last" in out.stdout
    summary = _summary(runs)
    assert summary["precision"] == "bf16" and summary["replicas_in_sync"] is True
    (run,) = runs.glob("*/")  # run dirs, not the index
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses and all(math.isfinite(v) for v in losses)
    if "recipe=resnet_digits" not in recipe:
        assert summary["eval"]["val_acc"] > 0.6  # 30 steps of the digits CNN: it learns under this layout


def test_fsdp_matches_ddp(tmp_path: Path) -> None:
    """The same run sharded or replicated: the same losses up to reduction order. The
    replicated one is what two processes get by default (parallel=auto chooses DDP), checked
    as every DDP case of tests/strategies/test_ddp.py is."""
    args = ["train", "parallel.nproc_per_node=2", "train.max_steps=40", "train.eval_every=40", "train.log_every=10"]
    for name, choice in (("ddp", []), ("fsdp", ["parallel=fsdp"])):
        out = run_fwk(*args, *choice, runs=tmp_path / name, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        if name == "ddp":
            trained_in_sync(out, tmp_path / name)
    ddp, fsdp = _summary(tmp_path / "ddp"), _summary(tmp_path / "fsdp")
    assert fsdp["eval"]["val_loss"] == pytest.approx(ddp["eval"]["val_loss"], rel=1e-3)


ARGS = [
    "train",
    "parallel=fsdp",
    "parallel.nproc_per_node=2",
    "train.max_steps=40",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every=20",  # stopped after the first: 20 steps to go, saved and resumed mid-run
    "checkpoint.keep=10",
    "precision.max_trial_share=1",  # a short run that times its formats all the same
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


@both_cpus
def test_fsdp_stopped_and_resumed_is_bit_identical(tmp_path: Path, cpu_bf16: bool) -> None:
    """On a bf16 CPU the straight run times bf16 against fp32 (its trial steps redone on a
    snapshot, fwk/components/trials.py) and the two that stop and resume recall that choice."""
    straight = run_fwk(*ARGS, runs=tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    assert f"precision=auto chose {'' if cpu_bf16 else 'fp32: CPU'}" in straight.stdout
    assert ("timing bf16 against fp32" in straight.stdout) is cpu_bf16, straight.stdout
    (run,) = (tmp_path / "straight").glob("*/")
    expected = model_weights(run / "checkpoints" / "step-00000040")

    runs = tmp_path / "stopped"
    stopped = interrupt_after(ARGS, runs, "*/checkpoints/step-*/manifest.json")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert "checkpoint saved" in stopped.stdout
    resumed = run_fwk(*ARGS, runs=runs, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed run" in resumed.stdout
    assert ("as measured before for this model on this machine" in stopped.stdout) is cpu_bf16
    (run,) = runs.glob("*/")  # run dirs, not the index
    got = model_weights(run / "checkpoints" / "step-00000040")
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_fp16_is_refused_under_fsdp(runs: Path) -> None:
    out = run_fwk("train", "parallel=fsdp", "parallel.nproc_per_node=2", "precision=fp16", runs=runs)
    assert out.returncode == 2
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert "precision" in line and "bf16" in line
    assert not runs.exists() or not any(runs.iterdir())
