"""parallel=auto decides from measured memory; the communication monitor measures the
wait share and climbs its ladder when one rank's all-reduce is slowed on purpose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fwk.config.schema import ParallelConfig
from fwk.distributed.dims import Dims
from fwk.distributed.group import Dist
from fwk.optim import AdamWConfig, LionConfig, SGDConfig, state_floats_per_param
from fwk.strategies import parallel
from fwk.strategies.parallel import decide, training_bytes
from tests.conftest import interrupt_after, require

CPU = torch.device("cpu")


def test_optimizer_state_is_measured() -> None:
    assert state_floats_per_param(AdamWConfig()) == 2
    assert state_floats_per_param(SGDConfig()) == 1
    assert state_floats_per_param(SGDConfig(momentum=0.0)) == 0
    assert state_floats_per_param(LionConfig()) == 1


def test_training_bytes_counts_params_grads_and_state() -> None:
    model = nn.Linear(100, 10)  # 1,010 fp32 parameters
    assert training_bytes(model, 2.0) == 1010 * 4 * 4


@pytest.mark.parametrize(
    ("world", "nnodes", "free", "expected", "dims"),
    [
        (1, 1, 10**12, "none", Dims()),
        (2, 1, 10**12, "ddp", Dims(dp_replicate=2)),
        (2, 1, 10_000, "fsdp", Dims(dp_shard=2)),
        (4, 2, 10_000, "hsdp", Dims(dp_replicate=2, dp_shard=2)),
    ],
)
def test_auto_decides_from_memory(
    monkeypatch: pytest.MonkeyPatch, world: int, nnodes: int, free: int, expected: str, dims: Dims
) -> None:
    monkeypatch.setattr(parallel, "_free_device_bytes", lambda device: free)
    cfg = ParallelConfig(nproc_per_node=world // nnodes, nnodes=nnodes)
    chosen, facts = decide(cfg, Dist(0, 0, world, CPU), nn.Linear(100, 10), 2.0)
    assert (chosen, parallel.preset(chosen)) == (dims, expected)
    if world > 1:
        assert "0.00015 GiB" not in facts and "GiB free on cpu" in facts


def test_explicit_strategy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_free_device_bytes", lambda device: 1)
    ddp = Dist(0, 0, 2, CPU, dims=Dims(dp_replicate=2))
    assert decide(ParallelConfig(name="ddp", dp_replicate=-1), ddp, nn.Linear(4, 4), 2.0)[0] == Dims(dp_replicate=2)


SLOW = [
    "train",
    "parallel.nproc_per_node=2",
    "train.max_steps=80",
    "train.eval_every=0",
    "train.log_every=5",
    "checkpoint.every=40",
    "parallel.bucket_cap_mb=1",
    "parallel.adapt.max_bucket_mb=4",
    "parallel.adapt.max_accum_steps=2",
    "parallel.adapt.enabled=true",
]


def _env(runs: Path) -> dict[str, str]:
    return {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1", "FWK_DEBUG_SLOW_RANK": "1:0.03"}


def _rows(runs: Path) -> list[dict]:
    (run,) = runs.glob("*/")  # run dirs, not the index
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def _gloo() -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One slowed run with adapting on, Ctrl-C'd after its step-40 checkpoint (the whole
    ladder is climbed by then) and resumed without the slow rank: what it said before the
    stop, and its runs root. The ladder's test and the resume's read the same run."""
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    runs = tmp_path_factory.mktemp("adapted") / "runs"
    # a cache of decisions of its own, as conftest's decision_cache gives each test (set up after this)
    env = {**_env(runs), "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg-cache"))}
    stopped = interrupt_after(SLOW, runs, "*/checkpoints/step-00000040/manifest.json", env=env)
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    env["FWK_DEBUG_SLOW_RANK"] = ""  # no slow rank now: nothing new to adapt
    resumed = subprocess.run([sys.executable, "-m", "fwk", *SLOW], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return stopped.stdout, runs


def test_slow_rank_climbs_the_ladder(adapted: tuple[str, Path]) -> None:
    first, runs = adapted
    said = [line for line in first.splitlines() if "communication wait" in line]
    rungs = [line for line in said if "parallel.adapt.threshold=0.15" in line]
    # fp16 compression, buckets 1 -> 4 MB (x4, the limit), accumulation 1 -> 2 (the limit); then no rung is left
    assert len(rungs) == 3, "\n".join(said)
    assert "turned on fp16 gradient compression" in rungs[0]
    assert "grew DDP buckets 1 -> 4 MB" in rungs[1]
    assert "raised gradient accumulation 1 -> 2 steps" in rungs[2]
    after = [line for line in said if "after '" in line]
    assert after and re.search(r"communication wait \d+% of step time \(was \d+%\)", after[0])
    shares = [r["comm_wait"] for r in _rows(runs) if r["kind"] == "train"]
    assert max(shares) > 0.15  # the slowed all-reduce shows as waiting
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True
    assert len(summary["comm_adaptations"]) == len(rungs)


@pytest.mark.usefixtures("_gloo")
def test_adapting_is_opt_in(runs: Path) -> None:
    """By default a high wait is measured and said once, with what would help; nothing changes."""
    off = [a for a in SLOW if not a.startswith("parallel.adapt.enabled")]
    out = subprocess.run(
        [sys.executable, "-m", "fwk", *off], env=_env(runs), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (advice,) = [line for line in out.stdout.splitlines() if "parallel.adapt.threshold" in line]
    assert "parallel.adapt.enabled=true lets fwk adapt" in advice
    shares = [r["comm_wait"] for r in _rows(runs) if r["kind"] == "train"]
    assert max(shares) > 0.15
    (run,) = runs.glob("*/")  # run dirs, not the index
    assert json.loads((run / "summary.json").read_text())["comm_adaptations"] == []


def test_adaptations_survive_a_resume(adapted: tuple[str, Path]) -> None:
    first, runs = adapted
    before = [line for line in first.splitlines() if "parallel.adapt.threshold" in line]
    assert len(before) == 3, first  # the whole ladder by step 40: nothing is left to adapt after the resume
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert [c.split(": ", 1)[1] for c in summary["comm_adaptations"]] == [line.split("): ", 1)[1] for line in before]
