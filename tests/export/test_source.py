"""A run that cannot be exported: missing, unfinished, without a checkpoint, or damaged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fwk.errors import UserError
from tests.conftest import run_fwk
from tests.export.conftest import copy_run


def test_unknown_run_names_the_closest_ids(digits_run: Path) -> None:
    runs = digits_run.parent
    out = run_fwk("export", "0000", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == f"fwk: error: no run '0000' under {runs}; closest ids: {digits_run.name}"


def test_unfinished_run_says_how_to_finish_it(digits_run: Path, tmp_path: Path) -> None:
    run = copy_run(digits_run, tmp_path / "runs")
    (run / "summary.json").unlink()
    out = run_fwk("export", run.name, runs=tmp_path / "runs")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"fwk: error: run {run.name} is not complete (no summary.json; newest checkpoint: step-")
    assert line.endswith("fwk train train.max_steps=100 train.eval_every=0 train.log_every=50 jit=off")
    assert not (run / "exports").exists()


def test_run_without_checkpoint(digits_run: Path, tmp_path: Path) -> None:
    run = copy_run(digits_run, tmp_path / "runs")
    shutil.rmtree(run / "checkpoints")
    out = run_fwk("export", run.name, runs=tmp_path / "runs")
    assert out.returncode == 2
    assert out.stderr.strip().startswith(f"fwk: error: run {run.name} has no complete checkpoint in ")
    assert not (run / "exports").exists()


def test_damaged_checkpoint_is_named(digits_run: Path, tmp_path: Path) -> None:
    from fwk.export.source import load
    from fwk.track.store import RunDir

    run = copy_run(digits_run, tmp_path / "runs")
    (ckpt,) = (run / "checkpoints").iterdir()
    data = bytearray((ckpt / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (ckpt / "state.pt").write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"checkpoint {ckpt} is damaged \(state.pt: missing or checksum mismatch\)"):
        load(RunDir(run))


def test_load_rebuilds_the_trained_model(digits_run: Path) -> None:
    from fwk.export.source import load
    from fwk.track.store import RunDir

    source = load(RunDir(digits_run))
    assert not source.model.training and source.step == 100 and source.checkpoint.name == "step-00000100"
    assert source.config.recipe == "digits_cnn" and len(source.data.val) == 300
    summary = json.loads((digits_run / "summary.json").read_text())
    assert summary["final_step"] == source.step


def test_the_best_checkpoint_is_exported_when_the_run_kept_one(digits_run: Path, tmp_path: Path) -> None:
    from fwk.components.best import BEST_DIR
    from fwk.export.source import check_exportable
    from fwk.track.store import RunDir

    run = copy_run(digits_run, tmp_path / "runs")
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert check_exportable(RunDir(run)) == newest  # no best kept: the newest
    best = run / BEST_DIR / "step-00000050"
    shutil.copytree(newest, best)  # a stand-in for the best of an earlier evaluation
    (run / BEST_DIR / "best.json").write_text(
        json.dumps({"metric": "val_acc", "value": 0.99, "step": 50, "checkpoint": best.name})
    )
    assert check_exportable(RunDir(run)) == best
