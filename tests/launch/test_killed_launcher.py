"""A killed `fwk train` (SIGKILL, a crash): its run stops cleanly and stays locked until it has.

torchrun's agent gets SIGTERM when the launcher dies and passes it on; the workers save a
checkpoint and exit as on SIGTERM; the agent holds the run lock's descriptor until then. So
the same command, run again at once, is refused in one line, and once the run has stopped
it resumes, bit-identical to a straight run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fwk.components.checkpoint import model_weights
from fwk.track.status import lock_holder
from fwk.track.store import RunDir
from tests import zygote
from tests.conftest import require, run_fwk

# The stop comes at a log step: 380 steps (several seconds, on a loaded 2-core machine too)
# after the first checkpoint, so the run is still training, and locked, when the command is
# run again
ARGS = [
    "train",
    "parallel.nproc_per_node=2",
    "model.channels1=8",
    "model.channels2=16",
    "model.hidden=32",
    "train.max_steps=500",
    "train.eval_every=0",
    "train.log_every=400",
    "checkpoint.every=20",
    "checkpoint.keep=30",
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


def test_a_killed_launcher_stops_its_run_which_stays_locked_until_then_and_resumes_exactly(tmp_path: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    straight = run_fwk(*ARGS, runs=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr

    runs = tmp_path / "killed"
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    launcher = zygote.popen(ARGS, env)
    deadline = time.monotonic() + 120
    while not list(runs.glob("*/checkpoints/step-*/manifest.json")):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.01)
    launcher.kill()
    assert launcher.wait(30) == -signal.SIGKILL
    (path,) = runs.glob("*/")
    run = RunDir(path)

    # at once: the workers are still training
    removed = run_fwk("runs", "rm", run.id, "--yes", runs=runs)
    assert removed.returncode == 2 and f"run {run.id} is running" in removed.stderr and path.is_dir()
    again = run_fwk(*ARGS, runs=runs)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stdout + again.stderr
    assert again.stderr.startswith(f"fwk: error: run {run.id} is already running in process "), again.stderr

    deadline = time.monotonic() + 120
    while lock_holder(run):  # the workers save a checkpoint at their next log step, then all exit
        assert time.monotonic() < deadline, "the run is still locked two minutes after its launcher died"
        time.sleep(0.05)
    saved = sorted(p.name for p in (path / "checkpoints").glob("step-*"))
    assert saved[-1] == "step-00000400" and not (path / "summary.json").exists(), saved  # stopped, as on SIGTERM

    resumed = run_fwk(*ARGS, runs=runs)
    assert resumed.returncode == 0 and "resumed run" in resumed.stdout, resumed.stdout + resumed.stderr
    (first,) = (tmp_path / "straight").glob("*/")
    expected, got = (model_weights(p / "checkpoints" / "step-00000500") for p in (first, path))
    assert expected.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in expected.items())
