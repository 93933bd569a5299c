"""Run dirs: created once, reopened by the same config, locked while a launch runs."""

import json
import os
from pathlib import Path

import pytest
import yaml

from fwk.errors import UserError
from fwk.track.store import RunDir, RunLock, flock_holders, open_run


def test_open_and_reopen(tmp_path: Path) -> None:
    run = open_run(tmp_path, "abc123", "seed: 0\n", "git:x", 1)
    assert run.config.read_text() == "seed: 0\n"
    open_run(tmp_path, "abc123", "seed: 0\n", "git:x", 1)
    meta = json.loads(run.meta.read_text())
    assert meta["run_id"] == "abc123" and len(meta["launches"]) == 2


def test_edited_config_is_not_overwritten(tmp_path: Path) -> None:
    run = open_run(tmp_path, "abc123", "seed: 0\n", "git:x", 1)
    run.config.write_text("seed: 5\n")
    with pytest.raises(UserError, match="differs"):
        open_run(tmp_path, "abc123", "seed: 0\n", "git:x", 1)
    assert run.config.read_text() == "seed: 5\n"


def test_lock_refuses_a_second_launch_naming_the_holder(tmp_path: Path) -> None:
    run = open_run(tmp_path, "abc123", "seed: 0\n", "git:x", 1)
    with RunLock(run):
        assert flock_holders(run.path / ".lock") == [os.getpid()]
        with pytest.raises(UserError, match=rf"already running in process {os.getpid()} \(.*python"):
            with RunLock(RunDir(run.path)):
                pass
    assert flock_holders(run.path / ".lock") == []


def test_truncate_metrics(tmp_path: Path) -> None:
    run = open_run(tmp_path, "r", "x: 1\n", "git:x", 1)
    run.metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in (5, 10, 15)))
    assert run.truncate_metrics(after_step=10) is None
    assert [r["step"] for r in run.metrics_rows()] == [5, 10]


def test_a_torn_last_metrics_line_is_dropped_with_one_line_and_a_torn_middle_is_refused(tmp_path: Path) -> None:
    run = open_run(tmp_path, "r", "x: 1\n", "git:x", 1)
    whole = "".join(json.dumps({"step": s}) + "\n" for s in (5, 10))
    run.metrics.write_text(whole + '{"step": 15, "lo')  # the disk filled, or the power went, mid-write
    assert [r["step"] for r in run.metrics_rows()] == [5, 10]  # fwk runs, replay: read what is whole
    said = run.truncate_metrics(after_step=10)
    assert said == 'metrics.jsonl: dropped its torn last line (16 characters, cut off mid-write): \'{"step": 15, "lo\''
    assert run.metrics.read_text() == whole
    run.metrics.write_text('{"step": 5}\n{"st\n{"step": 10}\n')
    with pytest.raises(UserError, match=r"line 2 of 3 is not JSON .*only the last line can be torn by a crash"):
        run.truncate_metrics(after_step=10)


def test_reopened_on_another_rendezvous_host(tmp_path: Path) -> None:
    # what a SLURM job requeued onto other nodes does: same run, another rendezvous endpoint
    first = "parallel:\n  nnodes: 2\n  rdzv_endpoint: node0:15001\nseed: 0\n"
    run = open_run(tmp_path, "abc123", first, "git:x", 4)
    open_run(tmp_path, "abc123", first.replace("node0", "node3"), "git:x", 4)
    assert run.config.read_text() == first
    # requeued onto fewer nodes: the same run, and its workers read the node count as launched
    open_run(tmp_path, "abc123", first.replace("nnodes: 2", "nnodes: 1"), "git:x", 2)
    assert yaml.safe_load(run.config.read_text())["parallel"] == {"nnodes": 1, "rdzv_endpoint": "node0:15001"}
    with pytest.raises(UserError, match="differs"):
        open_run(tmp_path, "abc123", first.replace("seed: 0", "seed: 1"), "git:x", 4)


def test_reopened_with_other_relaunch_settings_takes_this_launchs(tmp_path: Path) -> None:
    # a job resubmitted with a longer collective timeout or another elastic range resumes the
    # same run, and its workers must wait as this launch says
    first = "parallel:\n  collective_timeout_s: 600\n  min_nnodes: 0\n  nnodes: 2\n  rdzv_last_call_s: 30\nseed: 0\n"
    run = open_run(tmp_path, "abc123", first, "git:x", 4)
    again = first.replace("600", "1800").replace("min_nnodes: 0", "min_nnodes: 1").replace("30\n", "5\n")
    open_run(tmp_path, "abc123", again, "git:x", 4)
    parallel = yaml.safe_load(run.config.read_text())["parallel"]
    assert parallel == {"collective_timeout_s": 1800, "min_nnodes": 1, "nnodes": 2, "rdzv_last_call_s": 5}


def test_reopened_with_another_tracking_tracks_as_launched(tmp_path: Path) -> None:
    # tracking says where results go, not what a run computes: the same run, resumed under
    # this launch's tracking (the workers read config.yaml); the rest stays as first launched
    first = "seed: 0\ntags:\n- a\ntracking:\n  mlflow: false\n  uri: ''\n"
    run = open_run(tmp_path, "abc123", first, "git:x", 1)
    launched = "seed: 0\ntags:\n- b\ntracking:\n  mlflow: true\n  uri: http://127.0.0.1:5000\n"
    open_run(tmp_path, "abc123", launched, "git:x", 1)
    assert yaml.safe_load(run.config.read_text()) == {
        "seed": 0,
        "tags": ["a"],
        "tracking": {"mlflow": True, "uri": "http://127.0.0.1:5000"},
    }
    open_run(tmp_path, "abc123", first, "git:x", 1)
    assert run.config.read_text() == first
