"""Elastic node loss (``parallel.nnodes=MIN:MAX``): a machine dies and the run goes on without it.

Two machines' launches of one command on localhost meet at torchrun's c10d rendezvous. Its
store lives in the first, and the machine that holds it cannot be lost. The second machine
dies at once, launcher, agent and worker (SIGKILL, as a power cut). The first machine's
worker fails at its next collective. Its agent meets again without the dead machine, and
the run resumes from its last checkpoint on 1 process with the same global batch
(fwk/distributed/resize.py). It ends where a straight run ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import torch.distributed as dist

from tests import zygote
from tests.conftest import require, run_fwk
from tests.engine.test_resize import ARGS  # the digits CNN, small: 60 steps, a checkpoint every 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid, *(p for child in children for p in _tree(int(child)))]


def _trained_on_two_after_a_checkpoint(runs: Path) -> bool:
    """A checkpoint of 2 processes, and a logged step after it."""
    manifests = list(runs.glob("*/checkpoints/step-*/manifest.json"))
    steps = [json.loads(m.read_text()) for m in manifests]
    saved = [m["step"] for m in steps if m.get("world_size") == 2]
    if not saved:
        return False
    for line in manifests[0].parents[2].joinpath("metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # being written
        if row["kind"] == "train" and row["step"] > max(saved):
            return True
    return False


def test_a_dead_machine_leaves_the_run_to_the_others_which_resume_and_finish(tmp_path: Path) -> None:
    require(dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is needed")
    straight = run_fwk(*ARGS, runs=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr

    runs = tmp_path / "elastic"
    # the second machine joins within rdzv_last_call_s of the first, so both start together; a
    # collective waits 60 s at most for a dead peer (a dead machine's sockets may never close)
    port = _free_port()
    endpoint = f"parallel.rdzv_endpoint=127.0.0.1:{port}"
    timeouts = ["parallel.rdzv_last_call_s=5", "parallel.collective_timeout_s=60"]
    elastic = ["parallel.nnodes=1:2", endpoint, *timeouts]
    env = {**os.environ, "FWK_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}
    first = zygote.popen([*ARGS, *elastic], env)
    deadline = time.monotonic() + 120
    while not _listening(port):  # the first holds the rendezvous: the machine that dies is the other
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    second = zygote.popen([*ARGS, *elastic], env)
    while not _trained_on_two_after_a_checkpoint(runs):  # killed mid-step, as a machine dies
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    victims = _tree(second.pid)  # its launcher, torchrun's agent and its worker
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    assert second.wait(30) == -signal.SIGKILL and len(victims) == 3, victims

    (path,) = runs.glob("*/")  # run dirs, not the index
    while len(json.loads((path / "env.json").read_text())["launches"]) < 2:  # the survivor's restart
        assert first.poll() is None and time.monotonic() < killed + 120, first.communicate()
        time.sleep(0.01)
    again = time.monotonic() - killed
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err

    (straight_path,) = (tmp_path / "straight").glob("*/")
    assert path.name == straight_path.name  # one run, whatever the number of machines
    resumed = json.loads((path / "env.json").read_text())["launches"][-1]["from_step"]
    line = next(x for x in out.splitlines() if x.startswith("resuming step"))
    assert line == (
        f"resuming step {resumed} of run {path.name} on 1 data-parallel rank (written by 2): "
        "same global batch 64, as 2 micro-batches"
    )
    # every step once: those after the checkpoint, done again by the survivor, are not counted twice
    rows = map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10, 20, 30, 40, 50, 60]
    got, expected = (json.loads((p / "summary.json").read_text()) for p in (path, straight_path))
    assert got["world_size"] == 1 and got["final_step"] == 60
    assert abs(got["eval"]["val_loss"] - expected["eval"]["val_loss"]) < 0.01
    print(
        f"machine killed after a step past the checkpoint of step {resumed}: training again from it on 1 process "
        f"{again:.1f} s later; "
        f"60 steps x 64 samples; val_loss {got['eval']['val_loss']:.6f} vs {expected['eval']['val_loss']:.6f} straight"
    )
