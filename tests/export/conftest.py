"""One small trained digits run, shared by the export tests that only read it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_fwk

# Tiny but real: 100 steps of the default recipe reach ~97% validation accuracy, enough
# for int8's agreement with fp32 to mean something.
DIGITS = ["train.max_steps=100", "train.eval_every=0", "train.log_every=50", "jit=off"]
# Export settings sized for tests: a few calibration batches, few timed runs.
QUICK = ["export.calib_batches=4", "export.latency_batch=8", "export.warmup=1", "export.iterations=2"]


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs root holding one complete digits_cnn run (read it; copy it before changing it)."""
    runs = tmp_path_factory.mktemp("digits") / "runs"
    out = run_fwk("train", *DIGITS, runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    assert json.loads((run / "summary.json").read_text())["eval"]["val_acc"] > 0.9
    return run


def copy_run(run: Path, runs: Path, name: str | None = None) -> Path:
    """A copy of ``run`` under another runs root (and id), for tests that damage it."""
    dst = runs / (name or run.name)
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("exports"))
    return dst
