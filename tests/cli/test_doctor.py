"""`fwk doctor`: the environment report, and collectives across processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import require, run_fwk


def test_report_names_versions_features_and_choices(runs: Path) -> None:
    out = run_fwk("doctor", runs=runs, timeout=120)
    assert out.returncode == 0, out.stderr
    fields = dict(line.split(None, 1) if " " in line else (line, "") for line in out.stdout.splitlines())
    assert fields["torch"].startswith(torch.__version__)
    # the CPU features auto precision rests on, each named yes or no, as this CPU has them
    from fwk.strategies.hardware import cpu_units

    for unit, present in cpu_units().items():
        assert re.search(rf"\b{unit} {'yes' if present else 'no'}\b", fields["cpu"]), fields["cpu"]
    assert "precision=auto picks" in out.stdout and "kernels=auto picks" in out.stdout
    from fwk.strategies.hardware import probe
    from fwk.strategies.precision import choose_format

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prior = choose_format(probe(device), device)
    tried = f"{prior} if it beats fp32 in the run's trial steps" if prior != "fp32" else "fp32 (no fast bf16 units)"
    assert fields["precision=auto"] == f"picks   {tried}"


def test_collectives_across_two_processes(runs: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk("doctor", "--dist", "2", runs=runs, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "barrier + all-reduce across 2 processes ok" in out.stdout


def test_a_rank_that_does_not_answer_is_named(runs: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    out = run_fwk("doctor", "--dist", "3", "--timeout", "4", "--stall-rank", "1", runs=runs, timeout=180)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fwk: error: collectives across 3 processes failed: rank(s) 1 did not answer within 4 s"
    ]


@pytest.mark.parametrize("count", ["1", "0", "-3"])
def test_dist_below_two_is_one_line(runs: Path, count: str) -> None:
    out = run_fwk("doctor", "--dist", count, runs=runs, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"fwk: error: --dist={count} is not allowed: expected an integer >= 2 (processes to check)"
    ]
    assert out.stdout == ""  # refused before the report
