"""`fwk profile` end to end on the digits: every file written and readable, the figures add up,
the run that `fwk train` would make is left untouched but for its profile/ folder."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import run_fwk

ARGS = ["--steps", "2", "--warmup", "1", "--graph", "train.batch_size=32"]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    runs = tmp_path_factory.mktemp("profile") / "runs"
    out = run_fwk("profile", *ARGS, runs=runs)
    assert out.returncode == 0, out.stderr + out.stdout
    (run,) = runs.glob("*/")
    return out, runs, run


def test_writes_every_file(profiled: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    out, _, run = profiled
    prof = run / "profile"
    assert f"profile of run {run.name} in {prof}" in out.stdout
    trace = json.loads((prof / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#1", "fwk.forward", "fwk.backward", "fwk.optimizer", "fwk.data"} <= names
    for name in ("flame_time.svg", "flame_memory.svg"):
        root = ET.parse(prof / name).getroot()
        assert root.tag == f"{SVG}svg"
        assert len(list(root.iter(f"{SVG}rect"))) > 10, name
    figs = json.loads((prof / "profile.json").read_text())
    assert {"operators", "modules", "split", "memory", "facts", "signals", "advice", "files", "settings"} <= set(figs)
    assert figs["settings"]["run_id"] == run.name and figs["steps"] == 2
    log = (prof / "engine.log").read_text()
    assert "precision=auto chose" in log and "step      3/3  train" in log
    assert "step      3/3  train" not in out.stdout  # the progress rows of a 3-step run stay in the log
    graph = (prof / "graph.html").read_text()
    assert "Before: the captured graph" in graph and "features.0" in graph
    assert "cpp_fused_" in graph or "torch.compile failed" in graph


def test_figures_add_up(profiled: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    out, _, run = profiled
    figs = json.loads((run / "profile" / "profile.json").read_text())
    ops = figs["operators"]
    assert sum(r["share"] for r in ops["rows"]) == pytest.approx(1.0, abs=1e-6)  # shares of one total
    assert ops["rows"][-1]["cumulative"] == pytest.approx(1.0, abs=1e-6)
    assert sum(r["share"] for r in figs["split"]["rows"]) == pytest.approx(1.0, abs=1e-6)
    shares = {r["part"]: r["share"] for r in figs["split"]["rows"]}
    assert shares["forward"] > 0.05 and shares["backward"] > 0.05 and shares["optimizer"] > 0.0
    assert re.search(rf"\b{ops['k']} of {ops['n']} operators take 80% of the time", out.stdout)
    # k is the fewest operators, taken by share, whose cumulative share reaches 80%
    k = ops["k"]
    assert ops["rows"][k - 1]["cumulative"] >= 0.8 - 1e-9 and (k == 1 or ops["rows"][k - 2]["cumulative"] < 0.8)
    assert ops["n"] == len(ops["rows"])


def test_the_start_up_is_shown_phase_by_phase(profiled: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    out, _, run = profiled
    start = json.loads((run / "profile" / "profile.json").read_text())["startup"]
    phases = [r["phase"] for r in start["rows"]]
    assert phases[:4] == ["python", "config", "imports", "profiler"] and {"data", "model", "strategies"} <= set(phases)
    assert start["seconds_total"] == pytest.approx(sum(r["seconds"] for r in start["rows"]), abs=1e-3)
    assert all(r["mib"] is not None for r in start["rows"])
    assert start["mib_at_first_step"] > 100  # torch's libraries, wherever this process imported them
    assert start["mib_at_first_step"] == pytest.approx(sum(r["mib"] for r in start["rows"]), abs=1.0)
    assert "Start-up of this process, phase by phase" in out.stdout
    assert re.search(r"start-up \d+\.\d\d s to the first step, \d+ MiB resident then", out.stdout)


def test_modules_have_real_names(profiled: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    out, _, run = profiled
    rows = {r["name"]: r for r in json.loads((run / "profile" / "profile.json").read_text())["modules"]["rows"]}
    for name in ("features.0", "features.2", "head.1", "head.4"):
        assert rows[name]["forward_ms_per_step"] > 0 and rows[name]["backward_ms_per_step"] > 0, name
    assert rows["features.0"]["type"] == "Conv2d"
    assert "features.0" in out.stdout and "Conv2d" in out.stdout


def test_advice_lines_carry_their_figure(profiled: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    out, _, run = profiled
    figs = json.loads((run / "profile" / "profile.json").read_text())
    printed = [line[2:] for line in out.stdout.splitlines() if line.startswith("- ")]
    assert printed == [a["line"] for a in figs["advice"]]
    for line in printed:
        assert re.search(r"\d", line.split(":")[0]), line
    if not printed:
        assert "Advice: none; no figure crosses a threshold" in out.stdout


def test_shown_advice_quotes_figures() -> None:
    from fwk.profile import advice, report

    signals = {
        "device": "cuda", "data_share": 0.3, "comm_share": 0.0, "fp32_compute_share": 0.0, "bf16_compute_share": 0.0,
        "nchw_amp_conv_share": 0.0, "calls_per_step": 0, "short_call_share": 0.0, "short_time_share": 0.0,
        "peak_memory_share": 0.0, "peak_memory_mb": 0.0, "device_memory_mb": 1.0, "bf16_fast": True,
        "hardware": "a GPU", "precision": "bf16", "memory": "none", "jit": "auto", "comm_hook": "none",
        "num_workers": 0, "pin_memory": True,
    }  # fmt: skip
    figs = {
        "device": "cuda", "hardware": {"text": "a GPU"}, "steps": 1, "notes": [],
        "operators": {"basis": "device", "rows": [], "k": 0, "n": 0, "cover": 0.8},
        "modules": {"rows": [], "memory_device": "cuda"},
        "split": {"step_ms": 1.0, "rows": [{"part": "data", "ms_per_step": 0.3, "share": 0.3}]},
        "memory": {"peak_mb": 1.0, "device": "cuda"},
        "advice": advice.as_dicts(advice.advise(signals)),
    }  # fmt: skip
    console = Console(record=True, width=200)
    report.show(figs, console)
    text = console.export_text()
    assert "- data wait 30% of the step (> 10%): load ahead in worker processes: loader.num_workers=" in text


def test_run_dir_is_the_train_run_and_holds_only_the_profile(
    profiled: tuple[subprocess.CompletedProcess, Path, Path],
) -> None:
    _, runs, run = profiled
    dry = run_fwk("train", "--dry-run", "train.batch_size=32", runs=runs)
    assert dry.returncode == 0, dry.stderr
    assert f"run {run.name} -> " in dry.stdout  # the id fwk train would give the same overrides
    assert [p.name for p in run.iterdir()] == ["profile"]  # no config, checkpoints or summary to resume from


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--steps", "0"], "--steps=0 is not allowed: expected a whole number of steps >= 1"),
        (["--warmup", "0"], "--warmup=0 is not allowed"),
        (["train.nope=3"], "train.nope"),
        (["--step", "3"], "unknown option '--step' for fwk profile; its options are --steps, --warmup, --graph"),
    ],
)
def test_bad_input_is_one_line(runs: Path, args: list[str], expected: str) -> None:
    out = run_fwk("profile", *args, runs=runs)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fwk: error: ") and expected in line
    assert not runs.exists()
