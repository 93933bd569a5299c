"""`fwk export --format pt2|aoti`: the folded model's torch.export program, saved or compiled
ahead of time, reloaded by torch alone at any batch size with the checkpoint's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk
from tests.export.conftest import copy_run


def _model_and_val(runs: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    source = load(find_run(runs, None))
    return source.model, torch.stack([torch.as_tensor(source.data.val[i][0]) for i in range(5)])


def _report(runs: Path) -> dict:
    (report,) = runs.glob("*/exports/*/weights_report.json")
    return json.loads(report.read_text())


@pytest.mark.parametrize("fmt", ["pt2", "aoti"])
def test_a_program_export_runs_at_any_batch_without_fwk_with_the_checkpoints_outputs(
    digits_run: Path, tmp_path: Path, fmt: str
) -> None:
    runs = tmp_path / "runs"
    copy_run(digits_run, runs)
    target = tmp_path / f"digits.{fmt}.pt2"
    out = run_fwk("export", "--format", fmt, "--output", str(target), runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reloaded with a fresh process, without fwk's model code, on 8 held-out inputs" in out.stdout
    report = _report(runs)
    assert report["passed"] and report["max_abs_diff"] <= report["tolerance"] == 1e-5
    assert report["input"] == {"dtype": "float32", "shape": [-1, 1, 8, 8]}
    (export,) = runs.glob("*/exports/*/")
    assert sorted(p.name for p in export.iterdir()) == sorted([report["files"][0], "export.log", "weights_report.json"])
    model, x = _model_and_val(runs)
    from fwk.export.reload import loader

    run = loader(fmt, target)  # what a user does with the file: torch only
    with torch.no_grad():
        for rows in (1, 5):  # neither is the batch of 2 it was captured at
            torch.testing.assert_close(run(x[:rows]), model(x[:rows]), rtol=0, atol=1e-5)


def test_a_gpt_program_has_a_dynamic_batch_and_sequence(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "data.max_bytes=20000"]
    train = ["data.val_max_bytes=4096", "train.batch_size=8", "train.max_steps=2", "train.eval_every=0", "jit=off"]
    out = run_fwk("train", "recipe=gpt_stdlib", *tiny, *train, runs=runs)
    assert out.returncode == 0, out.stderr
    out = run_fwk("export", "--format", "pt2", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    report = _report(runs)
    assert report["passed"] and report["input"]["dtype"] == "int64" and report["input"]["shape"] == [-1, -1]
    (export,) = runs.glob("*/exports/*/")
    model, x = _model_and_val(runs)
    program = torch.export.load(str(export / "model.pt2")).module()
    with torch.no_grad():
        for rows, length in ((1, x.shape[1]), (3, 7)):
            torch.testing.assert_close(program(x[:rows, :length]), model(x[:rows, :length]), rtol=0, atol=1e-5)


def test_a_model_that_cannot_be_captured_is_one_line_and_leaves_no_export(digits_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    # the same weights, gated on the batch's values: tests/export/models.py
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(
        config.replace("  name: small_cnn\n", "  _target_: tests.export.models.GatedCNN\n", 1)
    )
    out = run_fwk("export", "--format", "pt2", runs=runs)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    expected = "fwk: error: cannot export the model to a pt2 program: torch.export failed in module gate (ValueGate) at"
    assert line.startswith(expected) and "`if x.sum() > 0:" in line, line
    (log,) = (run / "exports").iterdir()  # no export and no temp dir: the log alone, named in the line
    assert log.name.endswith(".export.log") and line.endswith(f"(full log: {log})")


def test_aoti_without_a_compiler_is_refused_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-c++")
    out = run_fwk("export", "--format", "aoti", runs=tmp_path / "runs")  # no run at all: the compiler comes first
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        "fwk: error: --format aoti compiles the model with a C++ compiler, and no-such-c++ is not on PATH: "
        "install one (apt-get install g++) or set CXX to its path"
    ]


def test_a_program_export_takes_no_onnx_flags(digits_run: Path, tmp_path: Path) -> None:
    out = run_fwk("export", "--format", "pt2", "--quantize", "int8", runs=tmp_path / "runs")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "fwk: error: --quantize applies to --format onnx; --format pt2 exports the trained model as it is"
    )
