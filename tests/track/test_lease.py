"""The lease of a multi-node run: one launch holds it, renews it, and another is refused
while it is fresh; a stale one is taken over, saying so; two launches at once: one wins."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from fwk.errors import UserError
from fwk.track import lease
from fwk.track.lease import Lease, launch_key
from fwk.track.status import derive_status, running
from fwk.track.store import RunDir


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "SETTLE", 0.01)


def _held(path: Path, key: str, age: float) -> None:
    (path / lease.LEASE).write_text(
        json.dumps({"key": key, "host": "node7", "pid": 4242, "renewed": time.time() - age})
    )


def test_the_launch_key_is_the_job_and_the_rendezvous() -> None:
    assert launch_key("n1:15007", {"SLURM_JOB_ID": "7"}) == "SLURM job 7, rendezvous n1:15007"
    assert launch_key("n1:29500", {}) == "rendezvous n1:29500"


def test_another_launch_is_refused_while_the_lease_is_fresh(tmp_path: Path) -> None:
    _held(tmp_path, "SLURM job 7, rendezvous n1:15007", age=2)
    with pytest.raises(UserError) as err, Lease(tmp_path, "abc", "SLURM job 8, rendezvous n3:15008"):
        pass
    assert str(err.value) == (
        "run abc is already running as SLURM job 7, rendezvous n1:15007 (host node7, pid 4242; renewed 2 s ago); "
        "wait for it to finish, or stop it; its lease is taken over once not renewed for 15 s"
    )
    assert json.loads((tmp_path / lease.LEASE).read_text())["key"] == "SLURM job 7, rendezvous n1:15007"


def test_another_machine_of_the_same_launch_shares_it_and_the_last_one_out_removes_it(
    tmp_path: Path, said: pytest.LogCaptureFixture
) -> None:
    _held(tmp_path, "rendezvous n1:29500", age=1)
    with Lease(tmp_path, "abc", "rendezvous n1:29500"):
        held = json.loads((tmp_path / lease.LEASE).read_text())
        assert held["host"] == socket.gethostname() and time.time() - held["renewed"] < 1
    assert not (tmp_path / lease.LEASE).exists() and said.messages == []


def test_a_stale_lease_is_taken_over_saying_whose(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    _held(tmp_path, "SLURM job 7, rendezvous n1:15007", age=40)
    with Lease(tmp_path, "abc", "SLURM job 9, rendezvous n2:15009"):
        assert json.loads((tmp_path / lease.LEASE).read_text())["key"] == "SLURM job 9, rendezvous n2:15009"
    assert said.messages == [
        "run abc: took over the lease of SLURM job 7, rendezvous n1:15007 (host node7, pid 4242; renewed 40 s ago): "
        "its launch is gone"
    ]


def test_it_is_renewed_while_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "INTERVAL", 0.05)
    with Lease(tmp_path, "abc", "rendezvous n1:29500"):
        first = json.loads((tmp_path / lease.LEASE).read_text())["renewed"]
        time.sleep(0.3)
        assert json.loads((tmp_path / lease.LEASE).read_text())["renewed"] > first


@pytest.mark.parametrize("fault", ["taken over", "renewal fails"])
def test_a_launch_that_loses_its_lease_stops_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, said: pytest.LogCaptureFixture
) -> None:
    import os
    import signal

    monkeypatch.setattr(lease, "INTERVAL", 0.05)
    monkeypatch.setattr(lease, "STALE_AFTER", 0.15)
    stopped: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: stopped.append((pid, sig)))
    with Lease(tmp_path, "abc", "rendezvous n1:29500") as held:
        if fault == "taken over":
            _held(tmp_path, "rendezvous n2:29501", age=0)
        else:
            monkeypatch.setattr(held, "_write", lambda: (_ for _ in ()).throw(OSError(5, "Input/output error")))
        time.sleep(0.5)
        assert stopped == [(os.getpid(), signal.SIGTERM)]
    why = "taken over by rendezvous n2:29501" if fault == "taken over" else "could not be renewed for 0 s"
    assert why in said.messages[-1] and said.messages[-1].endswith("; stopping this launch")


def test_of_two_launches_that_take_it_at_once_the_later_writer_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def other_launch_writes(seconds: float) -> None:  # in the settle time, another launch takes it too
        _held(tmp_path, "rendezvous n5:29500", age=0)

    monkeypatch.setattr(lease.time, "sleep", other_launch_writes)
    with pytest.raises(UserError, match=r"^run abc is already running as rendezvous n5:29500 \(host node7"):
        Lease(tmp_path, "abc", "rendezvous n1:29500").__enter__()


def test_a_fresh_lease_reads_as_running_from_any_machine(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "abc")
    run.path.mkdir()
    assert running(run) is None and derive_status(run, {}) == "interrupted"
    _held(run.path, "SLURM job 7, rendezvous n1:15007", age=3)
    assert running(run) == "SLURM job 7, rendezvous n1:15007 (host node7, pid 4242; renewed 3 s ago)"
    assert derive_status(run, {}) == "running"
    _held(run.path, "SLURM job 7, rendezvous n1:15007", age=60)  # its launchers died without removing it
    assert running(run) is None and derive_status(run, {}) == "interrupted"
