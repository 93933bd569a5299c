"""`fwk export` arguments: each mistake is one line and exit 2, before any work or any file is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_fwk


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--quantize", "int4"], "--quantize=int4 is not allowed: expected one of none, int8, dynamic_int8, fp16"),
        (["--prune", "l1"], "--prune=l1 is not allowed: expected one of none, magnitude, taylor, lottery_ticket"),
        (["--prune", "magnitude", "--ratio", "1"], "--ratio=1 is not allowed: expected a share of channels"),
        (["--prune", "magnitude", "--ratio", "0"], "--ratio=0 is not allowed"),
        (["--prune", "lottery_ticket", "--rounds", "0"], "--rounds=0 is not allowed: expected an integer >= 1"),
        (["--overwrite", "--bogus"], "unknown option '--bogus' for fwk export"),
        (["abc", "def"], "fwk export takes one run id, got 2: abc, def"),
        (["--max-accuracy-drop", "-1"], "--max-accuracy-drop=-1 is not allowed"),
        (["--qat-steps", "-1"], "--qat-steps=-1 is not allowed: expected 0 (off), a whole number of training steps"),
        (["--qat-steps", "2.5"], "--qat-steps=2.5 is not allowed: expected 0 (off), a whole number"),
        (["--qat-steps", "lots"], "--qat-steps=lots is not allowed"),
        (
            ["--quantize", "dynamic_int8", "--qat-steps", "10"],
            "--qat-steps=10 needs --quantize int8 (got --quantize dynamic_int8)",
        ),
        (["--quantize", "fp16", "--qat-steps", "auto"], "--qat-steps=auto needs --quantize int8 (got --quantize fp16)"),
    ],
)
def test_bad_arguments_are_one_line(runs: Path, args: list[str], expected: str) -> None:
    out = run_fwk("export", *args, runs=runs)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"fwk: error: {expected}")
    assert "Traceback" not in out.stderr and not runs.exists()


def test_existing_output_is_refused_and_kept(runs: Path, tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"mine")
    out = run_fwk("export", "--output", str(target), runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"fwk: error: --output {target} already exists; pass --overwrite to replace it, or choose another path"
    )
    assert target.read_bytes() == b"mine"


def test_no_runs_is_one_line(runs: Path) -> None:
    out = run_fwk("export", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"fwk: error: no complete run to export: {runs} has no runs; train one with `fwk train` (or set FWK_RUNS)"
    )


def test_runs_root_from_paths_runs(runs: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    out = run_fwk("export", f"paths.runs={other}", runs=runs)
    assert out.returncode == 2
    assert f"no complete run to export: {other} has no runs" in out.stderr
