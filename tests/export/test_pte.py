"""`fwk export --format pte`: the model lowered by ExecuTorch with the XNNPACK delegate, run by
ExecuTorch's runtime with no fwk model code; int8 through PT2E and pruning chained in front."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk
from tests.export.conftest import copy_run


def _reports(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*/exports/*/weights_report.json"))]


def _model_and_val(runs: Path, rows: int) -> tuple[torch.nn.Module, torch.Tensor]:
    from fwk.export.source import load
    from fwk.track.lookup import find_run

    source = load(find_run(runs, None))
    return source.model, torch.stack([torch.as_tensor(source.data.val[i][0]) for i in range(rows)])


def test_an_fp32_pte_runs_in_executorch_at_any_batch_up_to_its_bound(digits_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    copy_run(digits_run, runs)
    target = tmp_path / "digits.pte"
    out = run_fwk("export", "--format", "pte", "--output", str(target), "export.max_batch=16", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run by ExecuTorch's runtime in a fresh process on 300 validation samples" in out.stdout
    (report,) = _reports(runs)
    assert report["passed"] and report["runtime"] == "executorch" and report["quantize"] == "none"
    assert report["max_abs_diff"] <= report["tolerance"] == 1e-4
    assert report["quality"]["pte fp32"]["val_acc"] == report["quality"]["torch"]["val_acc"] > 0.9
    assert report["input"] == {"dtype": "float32", "shape": [-1, 1, 8, 8]} and report["max_batch"] == 16
    from fwk.export.edge import loader

    model, x = _model_and_val(runs, 17)
    run = loader(target)  # what a user does with the file: ExecuTorch's runtime
    with torch.no_grad():
        for rows in (1, 5, 16):  # none is the batch of 2 it was captured at; 16 is the bound
            torch.testing.assert_close(run(x[:rows]), model(x[:rows]), rtol=0, atol=1e-4)
    with pytest.raises(RuntimeError):  # past the bound its memory was planned for
        run(x)


def test_a_pruned_int8_pte_keeps_accuracy_within_the_budget_and_is_smaller(digits_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    copy_run(digits_run, runs)
    out = run_fwk("export", "--format", "pte", runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    flags = ["--prune", "magnitude", "--ratio", "0.5", "--quantize", "int8", "--max-accuracy-drop", "1.0"]
    out = run_fwk("export", "--format", "pte", *flags, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    fp32, int8 = sorted(_reports(runs), key=lambda r: r["quantize"] == "int8")
    assert int8["quantize"] == "int8" and int8["reference"] == "torch pruned" and int8["tolerance"] is None
    assert int8["files"] == ["model.pte", "pruning_history.json"] and int8["pruning"]["params_left"] < 0.5
    assert int8["drop"] <= 1.0 and int8["passed"]
    assert set(int8["seconds"]) == {"prune", "fold", "capture", "quantize", "lower", "verify"}
    assert int8["size_bytes"] * 5 < fp32["size_bytes"]  # a quarter of the weights, at a quarter of the bytes each


def test_a_program_fails_on_accuracy_past_the_budget_or_an_fp32_difference_past_the_tolerance() -> None:
    from fwk.export.edge_pipeline import TOLERANCE, failure

    assert failure("classification", "pte int8", 1.0, 1.0, None) == ""  # at the limit: kept
    assert failure("classification", "pte int8", 1.5, 1.0, None) == (
        "the pte int8 program lost 1.50 points of accuracy (limit 1, --max-accuracy-drop)"
    )
    assert failure("lm", "pte fp32", 2.0, 1.0, 0.0).startswith("the pte fp32 program lost 2.00% of the loss")
    assert failure("classification", "pte fp32", 0.0, 1.0, TOLERANCE) == ""
    assert failure("classification", "pte fp32", 0.0, 1.0, 2e-4) == (
        "the fp32 program's outputs differ from torch's by 0.0002 (> 0.0001)"
    )
    assert failure("classification", "pte int8", 0.0, 1.0, None) == ""  # int8 is judged on accuracy alone


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--quantize", "fp16"], "--format pte takes --quantize none or int8, not fp16"),
        (["--qat-steps", "10"], "--qat-steps applies to --format onnx"),
        (["--max-accuracy-drop", "-1"], "--max-accuracy-drop=-1 is not allowed: expected a number >= 0"),
        (["export.max_batch=0"], "export.max_batch=0 is not allowed: expected an integer >= 1"),
    ],
)
def test_pte_flags_it_cannot_honour_are_one_line_before_any_work(
    digits_run: Path, tmp_path: Path, words: list[str], said: str
) -> None:
    runs = tmp_path / "runs"
    run = copy_run(digits_run, runs)
    out = run_fwk("export", "--format", "pte", *words, runs=runs)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [f"fwk: error: {out.stderr.split('fwk: error: ')[1].strip()}"]
    assert said in out.stderr
    assert not (run / "exports").exists()


def test_an_op_executorch_cannot_run_is_one_line(tmp_path: Path) -> None:
    from fwk.errors import UserError
    from fwk.export import edge

    class Odd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.adaptive_max_pool2d(x, 3)  # 8 is no multiple of 3

    x = torch.randn(2, 1, 8, 8)
    program = torch.export.export(Odd(), (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=8)},))
    with pytest.raises(UserError, match=r"adaptive_max_pool2d from 8x8 to 3x3 has no ExecuTorch kernel"):
        edge.lower(program, tmp_path / "export.log")


def test_a_missing_executorch_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from fwk.errors import UserError
    from fwk.export import edge

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else real(name, *a))
    with pytest.raises(UserError, match=r"--format pte needs the executorch package: pip install 'fwk\[edge\]'"):
        edge.check_installed()
