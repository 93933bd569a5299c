"""The real ``fwk train`` under hybrid layouts of 4 gloo processes trains gpt_stdlib as one
process does, and a run written under tp=2 x pp=2 resumes under fsdp=4 and on one process
as the same run, with the loss of a straight run at the next step.

Tolerances: fp32 throughout; the layouts sum the same terms in another order (split
matmuls, all-reduces, micro-batches), a difference of ~1e-6 per step that Adam's updates
carry forward, so after 6 steps the losses agree to 1e-4 (seen: under 2e-5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.conftest import interrupt_after, require, run_fwk

ARGS = [
    "train", "recipe=gpt_stdlib", "model.n_layer=4", "model.n_embd=32", "model.n_head=4", "model.block_size=32",
    "data.seq_len=32", "train.batch_size=16", "train.max_steps=6", "train.eval_every=6", "train.log_every=1",
    "precision=fp32", "jit=off", "loader=manual", "loader.num_workers=0", "schedule.warmup_steps=2",
    "checkpoint.every=3", "checkpoint.keep=5", "parallel.collective_timeout_s=120",
]  # fmt: skip
LAYOUTS = {
    "fsdp x tp": ["parallel=hybrid", "parallel.tp=2", "parallel.dp_shard=-1"],
    "ddp x pp": ["parallel=pp", "parallel.pp=2", "parallel.dp_replicate=-1", "parallel.pp_microbatches=4"],
    "tp x pp": ["parallel=pp", "parallel.pp=2", "parallel.tp=2", "parallel.pp_microbatches=4"],
}
TOL = 1e-4  # see the module docstring


def _losses(runs: Path) -> tuple[str, list[float]]:
    (run,) = runs.glob("*/")  # run dirs, not the index
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return run.name, [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[float]]:
    runs = tmp_path_factory.mktemp("straight")
    out = run_fwk(*ARGS, "parallel=none", runs=runs, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return _losses(runs)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_hybrid_layout_trains_as_one_process(tmp_path: Path, straight: tuple[str, list[float]], layout: str) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk(*ARGS, *LAYOUTS[layout], "parallel.nproc_per_node=4", runs=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id, losses = _losses(tmp_path)
    assert run_id == straight[0]  # the layout is not part of the run's identity
    assert len(losses) == 6 and max(abs(a - b) for a, b in zip(losses, straight[1], strict=True)) < TOL, (
        losses,
        straight[1],
    )
    (run,) = tmp_path.glob("*/")
    assert json.loads((run / "summary.json").read_text())["replicas_in_sync"] is True


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tp=2 x pp=2 run stopped at its first checkpoint (step 3): the runs root, copied by
    each test that resumes it."""
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    runs = tmp_path_factory.mktemp("stopped")
    before = [*LAYOUTS["tp x pp"], "parallel.nproc_per_node=4"]
    out = interrupt_after([*ARGS, *before], runs, "*/checkpoints/step-00000003/manifest.json", timeout=600)
    assert out.returncode in (0, 130), out.stdout + out.stderr
    (run,) = runs.glob("*/")
    manifest = json.loads((run / "checkpoints" / "step-00000003" / "manifest.json").read_text())
    assert manifest["layout"] == "pp=2 x tp=2" and manifest["optimizer_flat"] is True
    return runs


@pytest.mark.xdist_group("tp-pp-resume")  # one worker: the stopped run is made once
@pytest.mark.parametrize(
    "after", [["parallel=fsdp", "parallel.nproc_per_node=4"], ["parallel=none"]], ids=["fsdp4", "one"]
)
def test_a_tp_pp_checkpoint_resumes_under_another_layout(
    tmp_path: Path, straight: tuple[str, list[float]], stopped: Path, after: list[str]
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(stopped, runs)
    resumed = run_fwk(*ARGS, *after, runs=runs, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed run" in resumed.stdout
    run_id, losses = _losses(runs)
    assert run_id == straight[0]
    # the step after the checkpoint, and every one after it, as in the straight run
    assert max(abs(a - b) for a, b in zip(losses[3:], straight[1][3:], strict=True)) < TOL, (losses, straight[1])
