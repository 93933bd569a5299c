"""Multi-process runs as a user sees them: Ctrl-C / SIGTERM end with fwk's line and 130 /
143; a dead worker is restarted (max_restarts) and the run resumes bit-exactly, or ends
with one line naming the rank; torchrun's own output stays in runs/<id>/logs/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fwk.launch.supervise import LAUNCHER_ENV, workers_of
from tests.conftest import require, run_fwk

# Long enough to outlast a signal or a kill sent just after the step-40 checkpoint (120 steps
# of two processes: seconds), with checkpoints left to resume from after it
ARGS = [
    "train",
    "parallel.nproc_per_node=2",
    "train.max_steps=160",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every=40",
    "checkpoint.keep=20",
    "jit=off",  # jit=auto compiles or not by measured step times, which differ between two runs
]


@pytest.fixture(autouse=True)
def _gloo() -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")


def _start(runs: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fwk", *ARGS, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(runs: Path, proc: subprocess.Popen, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(runs.glob(f"*/checkpoints/step-{step:08d}/manifest.json")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint of step {step} appeared")


def _worker(runs: Path, rank: int) -> int:
    """The pid of the worker of this rank of the run under ``runs``."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"fwk.launch.worker" in cmdline and str(runs).encode() in b" ".join(cmdline):
            if f"RANK={rank}".encode() in environ:
                return int(entry.name)
    raise AssertionError(f"no worker of rank {rank}")


def _weights(runs: Path, step: int = 160) -> dict[str, torch.Tensor]:
    (run,) = runs.glob("*/")  # run dirs, not the index
    return torch.load(run / f"checkpoints/step-{step:08d}/state.pt", weights_only=True)["model"]


@pytest.mark.parametrize(
    "sig,code",
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
    ids=["ctrl-c", "sigterm", "terminal-closed"],
)
def test_stop_shows_fwk_line_and_exit_code(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc = _start(tmp_path)
    _wait_for(tmp_path, proc, 40)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert "checkpoint saved. Run the same command to resume." in out
    assert err == ""  # no torchrun traceback, banner or warning
    (run,) = tmp_path.glob("*/")  # run dirs, not the index
    assert "SignalException" not in (run / "logs/torchrun.log").read_text()


def _torchrun(runs: Path) -> int:
    """The pid of the torchrun of the run under ``runs``."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" in cmdline and str(runs).encode() in b" ".join(cmdline):
            return int(entry.name)
    raise AssertionError("no torchrun")


def test_preemption_notice_to_every_process_stops_once(tmp_path: Path) -> None:
    # SLURM sends a job step's signals to each of its processes: fwk, torchrun, the workers
    proc = _start(tmp_path)
    _wait_for(tmp_path, proc, 40)
    torchrun = _torchrun(tmp_path)
    ignored = next(line for line in Path(f"/proc/{torchrun}/status").read_text().splitlines() if line[:7] == "SigIgn:")
    assert int(ignored.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1, "torchrun would die of SIGUSR1"
    for pid in (proc.pid, torchrun, _worker(tmp_path, 0), _worker(tmp_path, 1)):
        os.kill(pid, signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 138  # 128 + SIGUSR1: train.sbatch requeues the job
    assert out.count("checkpoint saved. Run the same command to resume.") == 1
    assert err == ""


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of ARGS run without interruption."""
    runs = tmp_path_factory.mktemp("straight")
    out = run_fwk(*ARGS, runs=runs, timeout=600)
    assert out.returncode == 0, out.stderr
    return _weights(runs)


def _assert_bit_identical(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_killed_worker_is_restarted_and_resumes_bit_exactly(tmp_path: Path, straight: dict) -> None:
    runs = tmp_path / "killed"
    proc = _start(runs, "parallel.max_restarts=1")
    _wait_for(runs, proc, 40)
    os.kill(_worker(runs, 1), signal.SIGKILL)  # a node's process dies mid-run
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    assert "resumed run" in out  # the restarted group found the latest complete checkpoint
    _assert_bit_identical(_weights(runs), straight)


def test_killed_agent_leaves_no_worker_and_the_run_resumes_bit_exactly(tmp_path: Path, straight: dict) -> None:
    """What the kernel's OOM killer does to torchrun: its workers must not train on as orphans."""
    proc = _start(tmp_path)
    _wait_for(tmp_path, proc, 40)
    (run,) = tmp_path.glob("*/")  # run dirs, not the index
    assert len(workers_of(run)) == 2
    agent = _torchrun(tmp_path)
    os.kill(agent, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, out + err
    assert workers_of(run) == []  # fwk returns once no process of the run is left
    (line,) = err.strip().splitlines()
    assert line.startswith(f"fwk: error: torchrun's agent (pid {agent}) was killed by SIGKILL")
    assert "; its workers were stopped with it;" in line  # by the kernel (PR_SET_PDEATHSIG), not fwk's backstop
    assert line.endswith(f"run {run.name} is interrupted at its last checkpoint: run the same command to resume it")
    assert not (run / "summary.json").exists()  # no orphan trained on to the end
    meta = json.loads((run / "meta.json").read_text())
    assert meta["launches"][-1]["outcome"] == "interrupted"
    resumed = run_fwk(*ARGS, runs=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed run" in resumed.stdout
    _assert_bit_identical(_weights(tmp_path), straight)


def test_a_worker_whose_agent_is_gone_exits_at_once(tmp_path: Path) -> None:
    """The race die_with_agent closes: a worker that starts after its agent died trains nothing."""
    code = "import sys; from fwk.launch.supervise import die_with_agent; die_with_agent(); print('trained')"
    env = {**os.environ, LAUNCHER_ENV: str(os.getpid() + 1_000_000)}  # not this worker's grandparent
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 128 + signal.SIGKILL and "trained" not in out.stdout
    env[LAUNCHER_ENV] = str(os.getppid())  # pytest's parent: the grandparent of the child
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "trained"


def test_dead_worker_without_restarts_is_one_line(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    _wait_for(tmp_path, proc, 40)
    os.kill(_worker(tmp_path, 1), signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    (run,) = tmp_path.glob("*/")  # run dirs, not the index
    assert lines[0].startswith("fwk: error: rank 1 failed (killed by SIGKILL)")
    assert lines[0].endswith(f"full logs: {run / 'logs'}")


def test_a_workers_user_error_is_its_own_line(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA to make the workers fail on train.device=cuda")
    out = run_fwk("train", "parallel.nproc_per_node=2", "train.device=cuda", runs=tmp_path, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fwk: error: train.device='cuda' but no CUDA device is visible; use train.device=auto or cpu"
    ]


def test_a_rank_that_aborted_because_its_peer_died_is_not_the_cause(tmp_path: Path) -> None:
    """torchrun saw rank 0's SIGABRT (gloo lost its peer) first, in the same instant as rank 1's SIGKILL."""
    from fwk.launch.supervise import failure_line

    failures = [(1, -9, "SIGKILL"), (0, -6, "SIGABRT")]  # listed, then the "root cause"
    blocks = [
        f"[{r}]:\n  rank      : {r} (local_rank: {r})\n  exitcode  : {c} (pid: 1{r})  ({name})\n"
        for r, c, name in failures
    ]
    report = "fwk.launch.worker FAILED\nFailures:\n" + blocks[0] + "Root Cause (first observed failure):\n" + blocks[1]
    (tmp_path / "torchrun.log").write_text(report)
    (tmp_path / "rank0.log").write_text("terminate called without an active exception\n")
    (tmp_path / "rank1.log").write_text("step 10/100\n")
    assert (
        failure_line(tmp_path, {})
        == f"rank 1 failed (killed by SIGKILL); its last line: step 10/100; full logs: {tmp_path}"
    )
    # a root cause that is not an abort stays the cause
    (tmp_path / "torchrun.log").write_text(report.replace("-6 (pid", "1 (pid"))
    assert failure_line(tmp_path, {}).startswith("rank 0 failed (exit code 1)")
