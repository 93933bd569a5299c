"""The worked examples of docs/extending.md, each run as a user runs it: a fresh ``fwk train``
with the examples' folder on PYTHONPATH, asserting on the numbers the run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SHORT = ["train.max_steps=100", "train.eval_every=100", "train.log_every=50"]


def train(runs: Path, *overrides: str) -> dict:
    """Run ``fwk train OVERRIDES`` in a fresh interpreter, as a user would; its summary."""
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONPATH": str(EXAMPLES)}
    out = subprocess.run(
        [sys.executable, "-m", "fwk", "train", *overrides], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (summary,) = runs.glob("*/summary.json")
    return json.loads(summary.read_text()) | {"stdout": out.stdout}


@pytest.mark.slow
def test_a_model_of_your_own_learns_the_digits(tmp_path: Path) -> None:
    summary = train(tmp_path / "runs", "model._target_=my_model.TinyMLP", "model.hidden=64", *SHORT)
    assert summary["eval"]["val_acc"] > 0.85


@pytest.mark.slow
def test_a_data_set_of_your_own_trains_the_model_of_your_own(tmp_path: Path) -> None:
    summary = train(
        tmp_path / "runs",
        "data._target_=my_data.moons",
        "data.n=2000",
        "model._target_=my_model.TinyMLP",
        "model.in_features=2",
        "model.num_classes=2",
        "train.max_steps=200",
        "train.eval_every=200",
    )
    assert summary["eval"]["val_acc"] > 0.8  # a linear boundary gets ~0.85 of the moons at noise 0.2; two layers more
    assert summary["final_step"] == 200


@pytest.mark.slow
def test_an_optimizer_of_your_own_trains_the_default_recipe(tmp_path: Path) -> None:
    summary = train(
        tmp_path / "runs", "optim._target_=my_optimizer.Signum", "optim.lr=2e-3", "+optim.momentum=0.9", *SHORT
    )
    assert summary["eval"]["val_acc"] > 0.9


@pytest.mark.slow
def test_a_model_of_your_own_under_tensor_parallel_trains_as_on_one_process(tmp_path: Path) -> None:
    model = ["model._target_=my_parallel_model.ParallelMLP", "model.hidden=64", "precision=fp32", *SHORT]
    split = train(tmp_path / "tp", *model, "parallel=tp", "parallel.nproc_per_node=2")
    whole = train(tmp_path / "one", *model)
    assert "tensor parallel: 2 ranks, 4 of 4 parameters sharded" in split["stdout"]
    # the same data order and the same initial weights: only the reductions' order differs
    assert split["eval"]["val_loss"] == pytest.approx(whole["eval"]["val_loss"], abs=1e-4)
    assert split["eval"]["val_acc"] > 0.85
