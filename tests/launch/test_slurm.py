"""SLURM: what an allocation means for `fwk train`, when a job requeues itself, and, on a real
single-node cluster (tests/launch/conftest.py), scripts/slurm/train.sbatch as a user runs it:
a job trains a run; a preempted job (USR1) saves, requeues itself, resumes the same run and
ends with the weights of an uninterrupted run, in one process and with torchrun's two."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from fwk.errors import UserError
from fwk.launch import slurm
from tests.conftest import run_fwk

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts/slurm/train.sbatch"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _no_host(nodelist: str) -> str:
    raise AssertionError("a one-node job needs no rendezvous host")


# --- the allocation -> `fwk train` overrides ----------------------------------------------


def test_one_cpu_node_is_one_process() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "vm"}
    assert slurm.overrides(env, ["recipe=digits_cnn"], host=_no_host) == [
        "parallel.nnodes=1",
        "parallel.nproc_per_node=1",
    ]


def test_gpu_nodes_meet_on_the_first_host() -> None:
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_JOB_NODELIST": "gpu[07-10]",
        "SLURM_GPUS_ON_NODE": "8",
    }
    assert slurm.overrides(env, [], host={"gpu[07-10]": "gpu07"}.__getitem__) == [
        "parallel.nnodes=4",
        "parallel.nproc_per_node=8",
        "parallel.rdzv_endpoint=gpu07:18456",  # 15000 + job id % 10000: the same after a requeue
    ]


@pytest.mark.parametrize("value,gpus", [("4", 4), ("a100:4", 4), ("a100:2,v100:2", 4)])
def test_gpus_per_node_option(value: str, gpus: int) -> None:
    assert slurm.gpus_per_node({"SLURM_GPUS_PER_NODE": value}) == gpus


def test_the_users_overrides_win() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "8"}
    args = ["parallel.nproc_per_node=2", "++parallel.rdzv_endpoint=n2:29400", "parallel.nnodes=2"]
    assert slurm.overrides(env, args, host=_no_host) == []


def test_nnodes_must_match_the_allocation() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "vm"}
    with pytest.raises(UserError, match=r"parallel.nnodes=2 but the job has 1 node.*sbatch --nodes=2"):
        slurm.overrides(env, ["parallel.nnodes=2"], host=_no_host)
    # an elastic range admits any allocation within it: a job requeued onto fewer nodes goes on
    assert slurm.overrides(env, ["parallel.nnodes=1:2"], host=_no_host) == ["parallel.nproc_per_node=1"]
    with pytest.raises(UserError, match=r"parallel.nnodes=2:4 but the job has 1 node.*sbatch --nodes=2-4"):
        slurm.overrides(env, ["parallel.nnodes=2:4"], host=_no_host)


def test_outside_a_job_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fwk.launch.slurm", "overrides", "recipe=digits_cnn"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fwk: error: SLURM_JOB_NUM_NODES is not set: run this inside a SLURM job (sbatch or salloc)"
    ]


# --- the requeue decision -------------------------------------------------------------------


def test_requeue_target_names_the_array_task() -> None:
    assert slurm.requeue_target({"SLURM_JOB_ID": "105"}) == "105"
    array_task = {"SLURM_JOB_ID": "105", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "5"}
    assert slurm.requeue_target(array_task) == "100_5"


def _requeue(tmp_path: Path, env: dict[str, str], status: int = 0) -> tuple[int, list[list[str]]]:
    calls: list[list[str]] = []

    def scontrol(argv: list[str]) -> int:
        calls.append(argv)
        return status

    run_dir = tmp_path / "abc"
    return slurm.requeue(env, ["recipe=digits_cnn"], run_dir=lambda args: run_dir, scontrol=scontrol), calls


def test_an_unfinished_run_is_requeued(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "abc/checkpoints/step-00000040").mkdir(parents=True)
    (tmp_path / "abc/checkpoints/step-00000040/manifest.json").write_text("{}")
    (tmp_path / "abc/checkpoints/.tmp-step-00000050").mkdir()  # cut off mid-write: not the one resumed
    env = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_RESTART_COUNT": "1"}
    status, calls = _requeue(tmp_path, env)
    assert (status, calls) == (0, [["scontrol", "requeue", "7_3"]])
    assert capsys.readouterr().out == (
        "fwk: run abc stopped (step-00000040); requeueing job 7_3 (restart 2): it resumes from that checkpoint\n"
    )


def test_a_finished_run_is_not_requeued(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc/summary.json").write_text('{"status": "complete"}')
    assert _requeue(tmp_path, {"SLURM_JOB_ID": "9"}) == (0, [])
    assert "run abc is complete; the job is not requeued" in capsys.readouterr().out


def test_a_refused_requeue_fails_the_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "abc").mkdir()
    status, calls = _requeue(tmp_path, {"SLURM_JOB_ID": "9"}, status=1)
    assert status == slurm.PREEMPTED_STATUS and calls == [["scontrol", "requeue", "9"]]
    assert "`scontrol requeue 9` failed (exit 1); resubmit the job" in capsys.readouterr().err


def test_the_preemption_notice_may_come_twice() -> None:
    # SLURM signals every process of a job step, and fwk's launcher forwards USR1 too
    from fwk.engine.state import StopSignal

    before = signal.getsignal(signal.SIGUSR1)
    stop = StopSignal()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # with the default action, this would end pytest
        assert stop.requested
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR1) == before


# --- on a real cluster ------------------------------------------------------------------------


def _scontrol(cluster: dict[str, str], *args: str) -> str:
    out = subprocess.run(["scontrol", *args], env=cluster, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _job(cluster: dict[str, str], job: str) -> dict[str, str]:
    text = _scontrol(cluster, "show", "job", "--oneliner", job)
    return {k: re.search(rf"\b{k}=(\S+)", text).group(1) for k in ("JobState", "Reason", "Restarts", "ExitCode")}


def _submit(cluster: dict[str, str], where: Path, runs: Path, *args: str) -> str:
    # sbatch passes this environment on to the job: fwk's Python and the runs root; one
    # thread per process, as the job and a reference run may share few cores
    env = {**cluster, "FWK_RUNS": str(runs), "FWK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    env["OMP_NUM_THREADS"] = "1"
    argv = ["sbatch", "--parsable", f"--chdir={where}", f"--output={where}/job-%j.out", str(SBATCH), *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _wait(
    cluster: dict[str, str], job: str, log: Path, done: Callable[[dict[str, str]], bool], timeout: float = 300
) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _job(cluster, job)
        if done(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} still {state} after {timeout} s:\n{log.read_text() if log.exists() else ''}")


def _ended(state: dict[str, str]) -> bool:
    return state["JobState"] in ENDED


def _training(runs: Path) -> bool:
    """True once a run under ``runs`` has logged a training step."""
    return any('"kind": "train"' in m.read_text() for m in runs.glob("*/metrics.jsonl"))


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run / f"checkpoints/step-{step:08d}/state.pt", weights_only=True)["model"]


def test_first_host_comes_from_scontrol(slurm_cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PATH", "SLURM_CONF"):
        monkeypatch.setenv(key, slurm_cluster[key])
    assert slurm.first_host("node[03-05],gpu1") == "node03"


def test_sbatch_trains_a_run(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = ["recipe=digits_cnn", "train.max_steps=60", "train.eval_every=0", "train.log_every=10"]
    job = _submit(slurm_cluster, tmp_path, runs, *args)
    log = tmp_path / f"job-{job}.out"
    state = _wait(slurm_cluster, job, log, _ended)
    out = log.read_text()
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "0"), out
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 60 and summary["world_size"] == 1
    assert summary["eval"]["val_acc"] >= 0.9, summary  # 60 steps reach about 0.97 on the digits
    parallel = yaml.safe_load((run / "config.yaml").read_text())["parallel"]
    assert (parallel["nnodes"], parallel["nproc_per_node"]) == (1, 1)  # from the allocation
    assert f"run {run.name} complete: step 60" in out


# fp32 and no JIT: jit=auto compiles or not by measured step times, which differ between runs
PREEMPTED = ["train.max_steps=300", "train.eval_every=0", "train.log_every=10", "checkpoint.every=100"]
PREEMPTED += ["precision=fp32", "jit=off"]


@pytest.mark.parametrize("nproc", [1, 2], ids=["in-process", "torchrun"])
def test_preempted_job_requeues_and_resumes_exactly(
    slurm_cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nproc: int
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # for the reference run: as in the job
    runs = tmp_path / "preempted"
    job = _submit(slurm_cluster, tmp_path, runs, f"parallel.nproc_per_node={nproc}", *PREEMPTED)
    log = tmp_path / f"job-{job}.out"
    state = _wait(slurm_cluster, job, log, lambda s: _training(runs) or _ended(s))
    assert not _ended(state), log.read_text()
    # what --signal=B:USR1@90 does before the time limit: USR1 to the batch shell only
    assert subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm_cluster, timeout=60).returncode == 0
    _wait(slurm_cluster, job, log, lambda s: s["Restarts"] == "1" or _ended(s))
    # the uninterrupted run, while the requeued job waits to start again
    launch = ["parallel.nnodes=1", f"parallel.nproc_per_node={nproc}"]
    straight = run_fwk("train", *launch, *PREEMPTED, runs=tmp_path / "straight", timeout=300)
    assert straight.returncode == 0, straight.stderr
    state = _wait(slurm_cluster, job, log, _ended)
    out = log.read_text()
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "1"), out

    (run,) = runs.glob("*/")  # run dirs, not the index
    stopped = re.search(r"stopped at step (\d+); checkpoint saved", out)
    assert stopped and 0 < int(stopped.group(1)) < 300, out
    step = int(stopped.group(1))
    assert "fwk: preemption notice (USR1)" in out
    assert f"fwk: run {run.name} stopped (step-{step:08d}); requeueing job {job} (restart 1)" in out
    assert f"resumed run {run.name} from step-{step:08d} (step {step})" in out
    assert f"run {run.name} complete: step 300" in out
    assert "Traceback" not in out
    if nproc > 1:  # torchrun ignored the USR1 that SLURM sent it too: no SignalException of its own
        assert "Traceback" not in (run / "logs/torchrun.log").read_text()
    (reference,) = (tmp_path / "straight").glob("*/")
    assert reference.name == run.name  # the same command outside SLURM is the same run
    expected, got = _weights(reference, 300), _weights(run, 300)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
