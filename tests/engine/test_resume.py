"""A run stopped at step k and resumed ends with bit-identical weights (CPU, fp32)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import run_fwk

# A narrow CNN: what is checked is the state a checkpoint restores, not what the model learns
TINY = ["model.channels1=8", "model.channels2=16", "model.hidden=32"]
ARGS = [
    "train",
    *TINY,
    "train.max_steps=120",
    "train.eval_every=60",
    "train.log_every=5",
    "checkpoint.every=20",
    "checkpoint.keep=10",
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs root holding one uninterrupted run of ARGS (read it; copy it before changing it)."""
    runs = tmp_path_factory.mktemp("straight") / "runs"
    out = run_fwk(*ARGS, runs=runs)
    assert out.returncode == 0, out.stderr
    return runs


def _final_weights(runs: Path) -> dict[str, torch.Tensor]:
    (run,) = runs.glob("*/")  # run dirs, not the index
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
def test_resume_is_bit_identical(straight: Path, tmp_path: Path, sig: signal.Signals) -> None:
    expected = _final_weights(straight)

    runs = tmp_path / "stopped"
    proc = _start(runs)
    _wait_for_checkpoint(runs, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    (run,) = runs.glob("*/")  # run dirs, not the index
    assert not (run / "summary.json").exists(), "the run was stopped before its end"
    if sig == signal.SIGINT:
        assert proc.returncode == 0, err
        assert "checkpoint saved" in out
    else:  # what else a kill (or a power loss) can leave: a torn last metrics line, a save cut short
        with open(run / "metrics.jsonl", "a") as f:
            f.write('{"kind": "train", "step": 9')
        (run / "checkpoints" / ".tmp-step-00000099").mkdir()
        (run / "checkpoints" / ".tmp-step-00000099" / "state.pt").write_bytes(b"\0" * 10)

    resumed = run_fwk(*ARGS, runs=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed run" in resumed.stdout
    if sig == signal.SIGKILL:
        assert "metrics.jsonl: dropped its torn last line" in resumed.stdout, resumed.stdout
        assert "checkpoints: removed .tmp-step-00000099 (a save cut short)" in resumed.stdout
        assert not list((run / "checkpoints").glob(".tmp-*"))
        assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    got = _final_weights(runs)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    # the resumed metrics have no duplicate steps
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "train"' in line]
    assert len(steps) == 120 // 5


def test_a_run_started_again_from_step_0_keeps_its_earlier_rows_aside(tmp_path: Path) -> None:
    """Its checkpoints moved away, the run starts over: its metrics.jsonl must not hold two
    rows of each step it logged before."""
    runs = tmp_path / "runs"
    proc = _start(runs)
    _wait_for_checkpoint(runs, proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    (run,) = runs.glob("*/")
    before = (run / "metrics.jsonl").read_text()
    shutil.move(run / "checkpoints", tmp_path / "elsewhere")
    again = run_fwk(*ARGS, runs=runs)
    assert again.returncode == 0, again.stderr
    assert "metrics.jsonl: no checkpoint to resume from, so the run starts at step 0; the " in again.stdout
    assert (run / "metrics.jsonl.restart-1").read_text() == before
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["step"] for r in rows if r["kind"] == "train"]
    assert train == list(range(5, 121, 5))


STAGED = [
    "train",
    *TINY,
    "train.max_steps=60",
    "train.eval_every=0",
    "train.log_every=5",
    "checkpoint.every=10",
    "checkpoint.keep=10",
    "precision=staged",
    "precision.dtype=fp16",  # exercises the loss scaler's state too
    "precision.warmup_steps=15",
    "precision.final_frac=0.25",  # phases: warmup 0-14, main 15-44, final 45-59
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


def test_staged_resumes_mid_phase_exactly(tmp_path: Path) -> None:
    straight = run_fwk(*STAGED, runs=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    assert "step 15: precision phase warmup -> main (fp16 autocast)" in straight.stdout
    assert "step 45: precision phase main -> final (fp16, final layers fp32)" in straight.stdout
    (run,) = (tmp_path / "straight").glob("*/")
    expected = torch.load(run / "checkpoints/step-00000060/state.pt", weights_only=True)
    for resume_at, phase in ((50, "final"), (30, "main")):  # as if the run had died after that checkpoint
        (run / "summary.json").unlink()
        for ckpt in (run / "checkpoints").glob("step-*"):
            if int(ckpt.name[5:]) > resume_at:
                shutil.rmtree(ckpt)
        resumed = run_fwk(*STAGED, runs=tmp_path / "straight")
        assert resumed.returncode == 0, resumed.stderr
        assert f"from step-{resume_at:08d} (step {resume_at})" in resumed.stdout
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["phase"] for r in rows if r["kind"] == "train" and r["step"] in (resume_at + 5, 60)] == [
            phase,
            "final",
        ]
        got = torch.load(run / "checkpoints/step-00000060/state.pt", weights_only=True)
        for name, tensor in expected["model"].items():
            assert torch.equal(got["model"][name], tensor), (resume_at, name)
        assert got["precision"] == expected["precision"]  # loss scale and skipped-step count


def test_corrupt_newest_checkpoint_falls_back_and_stays_exact(straight: Path, tmp_path: Path) -> None:
    expected = _final_weights(straight)
    runs = tmp_path / "runs"
    (original,) = straight.glob("*/")  # run dirs, not the index
    run = runs / original.name
    shutil.copytree(original, run)  # the shared run stays as it is
    (run / "summary.json").unlink()
    for ckpt in (run / "checkpoints").glob("step-*"):
        if int(ckpt.name[5:]) > 60:
            shutil.rmtree(ckpt)
    state = run / "checkpoints/step-00000060/state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # as if the node died while it was written
    resumed = run_fwk(*ARGS, runs=runs)
    assert resumed.returncode == 0, resumed.stderr
    assert "warning: skipped corrupt checkpoint step-00000060 (state.pt: missing or checksum mismatch); " in (
        resumed.stdout
    )
    assert "resumed run" in resumed.stdout and "from step-00000040 (step 40)" in resumed.stdout
    got = _final_weights(runs)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
