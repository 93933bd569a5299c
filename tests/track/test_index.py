"""The run index: statuses read from run dirs, upserts, filters, rebuilds, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from fwk.track import index, status
from fwk.track.store import RunDir, RunLock
from tests.track.fake_runs import make_run


def test_status_comes_from_the_run_dir(tmp_path: Path) -> None:
    done = make_run(tmp_path, "aaa", eval_metrics={"val_acc": 0.9})
    stopped = make_run(tmp_path, "bbb", checkpoint=True)
    failed = make_run(tmp_path, "ccc", outcome="failed")
    running = make_run(tmp_path, "ddd")
    assert status.derive_status(done) == "complete"
    assert status.derive_status(stopped) == "interrupted"
    assert status.derive_status(failed) == "failed"
    with RunLock(running):
        assert status.lock_holder(running)
        assert status.derive_status(running) == "running"
    assert not status.lock_holder(running)
    assert status.derive_status(running) == "interrupted"


def test_row_reads_recipe_tags_step_and_metrics(tmp_path: Path) -> None:
    run = make_run(tmp_path, "aaa", recipe="gpt_tiny", tags=["base", "lr"], eval_metrics={"val_loss": 1.5})
    row = status.row_from_dir(run)
    assert row["recipe"] == "gpt_tiny" and row["tags"] == ["base", "lr"]
    assert row["step"] == 10 and row["max_steps"] == 10
    assert row["metrics"] == {"loss": 1.9, "val_loss": 1.5}
    # a config from before the `tags` field: no tags, no error
    assert status.row_from_dir(make_run(tmp_path, "bbb"))["tags"] == []


def test_query_filters_newest_first(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    now = time.time()
    make_run(tmp_path, "r1", recipe="a", tags=["x"], created=now - 300, eval_metrics={"val_acc": 0.5})
    make_run(tmp_path, "r2", recipe="b", tags=["x", "y"], created=now - 200, checkpoint=True)
    make_run(tmp_path, "r3", recipe="a", created=now - 100, outcome="failed")
    assert [r["id"] for r in index.query(tmp_path)] == ["r3", "r2", "r1"]
    lines = said.messages
    assert len(lines) == 1 and "missing" in lines[0]  # the first look builds the index, saying so
    assert [r["id"] for r in index.query(tmp_path, recipe="a")] == ["r3", "r1"]
    assert [r["id"] for r in index.query(tmp_path, status="interrupted")] == ["r2"]
    assert [r["id"] for r in index.query(tmp_path, tags=["x"])] == ["r2", "r1"]
    assert [r["id"] for r in index.query(tmp_path, tags=["x", "y"])] == ["r2"]
    assert index.query(tmp_path, sweep="s1") == []
    assert said.messages == lines  # later looks use it silently


def test_record_upserts_and_keeps_created(tmp_path: Path) -> None:
    run = make_run(tmp_path, "aaa")
    with RunLock(run):  # a launcher records its run as running once it holds the lock
        index.record(run, "running")
        first = index.query(tmp_path)[0]
        assert index.query(tmp_path)[0]["status"] == "running"  # still running: the lock says so
    run.write_summary({"final_step": 10, "eval": {"val_acc": 0.8}})
    index.record(run, "complete")
    [row] = index.query(tmp_path)
    assert row["status"] == "complete" and row["metrics"]["val_acc"] == 0.8
    assert row["created"] == first["created"]


def test_a_stale_running_row_is_squared_with_the_dir(tmp_path: Path) -> None:
    run = make_run(tmp_path, "aaa", checkpoint=True)
    with RunLock(run):
        index.record(run, "running")
    # the launcher was killed (no ending written): the lock is free, so it is not running
    assert index.query(tmp_path)[0]["status"] == "interrupted"


def test_index_follows_dirs_added_and_removed_by_hand(tmp_path: Path) -> None:
    make_run(tmp_path, "aaa")
    index.query(tmp_path)
    make_run(tmp_path, "bbb")
    assert {r["id"] for r in index.query(tmp_path)} == {"aaa", "bbb"}
    import shutil

    shutil.rmtree(tmp_path / "aaa")
    assert [r["id"] for r in index.query(tmp_path)] == ["bbb"]


def test_corrupt_index_is_rebuilt_with_one_line(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    make_run(tmp_path, "aaa", eval_metrics={"val_acc": 0.9})
    make_run(tmp_path, "bbb")
    index.index_path(tmp_path).write_bytes(b"this is not a database" * 100)
    rows = index.query(tmp_path)
    assert {r["id"]: r["status"] for r in rows} == {"aaa": "complete", "bbb": "interrupted"}
    lines = said.messages
    assert len(lines) == 1 and "corrupt" in lines[0] and "2 run dirs" in lines[0]
    index.query(tmp_path)
    assert said.messages == lines


def test_the_first_run_under_a_new_root_is_no_news(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    index.record(make_run(tmp_path, "aaa"), "running")
    assert said.messages == []


def test_an_index_error_is_one_warning_not_a_failed_run(tmp_path: Path, said: pytest.LogCaptureFixture) -> None:
    run = make_run(tmp_path, "aaa")
    index.index_path(tmp_path).mkdir()  # sqlite cannot open a folder
    index.record_quietly(run, "running")
    (record,) = said.records
    assert record.levelname == "WARNING" and record.getMessage().startswith(
        "fwk: warning: run index not updated for aaa"
    )


def _write_many(root: str, prefix: str, n: int) -> None:
    for i in range(n):
        run = RunDir(Path(root) / f"{prefix}{i:03d}")
        index.record(run, "running", recipe=prefix)


def test_concurrent_writers_lose_no_rows(tmp_path: Path) -> None:
    n = 30
    for prefix in ("p", "q"):
        for i in range(n):
            make_run(tmp_path, f"{prefix}{i:03d}")
    # two processes, as two `fwk train` would be; both race to create the index too
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), p, n)) for p in ("p", "q")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    import sqlite3

    con = sqlite3.connect(index.index_path(tmp_path))
    rows = dict(con.execute("SELECT id, recipe FROM runs").fetchall())
    assert len(rows) == 2 * n
    assert all(recipe == rid[0] for rid, recipe in rows.items())  # every process's own write landed
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_outcome_is_noted_in_meta(tmp_path: Path) -> None:
    run = make_run(tmp_path, "aaa")
    status.record_outcome(run, "failed", 1)
    assert json.loads(run.meta.read_text())["launches"][-1]["outcome"] == "failed"
    assert status.derive_status(run) == "failed"
