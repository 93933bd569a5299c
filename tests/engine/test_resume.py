"""A run stopped at step k and resumed ends with bit-identical weights (CPU, fp32)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk

ARGS = [
    "train",
    "train.max_steps=120",
    "train.eval_every=60",
    "train.log_every=5",
    "checkpoint.every=20",
    "checkpoint.keep=10",
]


def _final_weights(runs: Path) -> dict[str, torch.Tensor]:
    (run,) = runs.iterdir()
    final = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert final.name == "step-00000120"
    return torch.load(final / "state.pt", weights_only=True)["model"]


def _start(runs: Path) -> subprocess.Popen:
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fwk", *ARGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_checkpoint(runs: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(runs.glob("*/checkpoints/step-*/manifest.json")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["killed", "interrupted"])
def test_resume_is_bit_identical(tmp_path: Path, sig: signal.Signals) -> None:
    straight = run_fwk(*ARGS, runs=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    expected = _final_weights(tmp_path / "straight")

    runs = tmp_path / "stopped"
    proc = _start(runs)
    _wait_for_checkpoint(runs, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    (run,) = runs.iterdir()
    assert not (run / "summary.json").exists(), "the run was stopped before its end"
    if sig == signal.SIGINT:
        assert proc.returncode == 0, err
        assert "checkpoint saved" in out

    resumed = run_fwk(*ARGS, runs=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed run" in resumed.stdout
    got = _final_weights(runs)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    # the resumed metrics have no duplicate steps
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "train"' in line]
    assert len(steps) == 120 // 5
