"""fwk/launch/run.py is the one launch path: `fwk train`, each member of a sweep and
`fwk replay` record the index, meta.json and summary.json the same way, a run that is
already complete included."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from fwk.track.index import forget, index_path
from tests.conftest import run_fwk

TINY = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "data.val_size=40", "jit=off"]


def _index_rows(root: Path) -> dict[str, dict]:
    """The index as stored (read raw: `fwk runs` would first square it with the run dirs)."""
    con = sqlite3.connect(index_path(root))
    con.row_factory = sqlite3.Row
    try:
        return {r["id"]: dict(r) for r in con.execute("SELECT id, status, step, parent, sweep FROM runs")}
    finally:
        con.close()


def _meta(root: Path, run_id: str) -> dict:
    return json.loads((root / run_id / "meta.json").read_text())


def _ids(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("run ") and " complete" in line]


def test_train_sweep_and_replay_record_a_run_alike(runs: Path) -> None:
    commands = {
        "train": ["train", *TINY],
        "sweep": ["train", "-m", "seed=1,2", *TINY],
    }
    out = {name: run_fwk(*args, runs=runs) for name, args in commands.items()}
    for name, done in out.items():
        assert done.returncode == 0, (name, done.stdout + done.stderr)
    (trained,) = _ids(out["train"].stdout)
    members = _ids(out["sweep"].stdout)
    assert len(members) == 2
    replay = run_fwk("replay", trained, runs=runs)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    (replayed,) = _ids(replay.stderr)  # replay reports on stderr; its verdict is on stdout
    sweep_id = _meta(runs, members[0])["sweep"]
    expected = {  # run id -> (parent, sweep, kind) in meta.json and the index
        trained: (None, None, None),
        members[0]: (None, sweep_id, "sweep"),
        members[1]: (None, sweep_id, "sweep"),
        replayed: (trained, None, "replay"),
    }

    def check_all() -> None:
        rows = _index_rows(runs)
        for run_id, (parent, sweep, kind) in expected.items():
            meta, summary = _meta(runs, run_id), json.loads((runs / run_id / "summary.json").read_text())
            assert (meta.get("parent"), meta.get("sweep"), meta.get("kind")) == (parent, sweep, kind), run_id
            assert meta["data"]["digest"] and meta["launches"][0]["outcome"] == "complete"
            assert summary["run_id"] == run_id and summary["final_step"] == 2 and summary["status"] == "complete"
            row = rows[run_id]
            assert (row["status"], row["step"], row["parent"], row["sweep"]) == ("complete", 2, parent, sweep)

    check_all()
    # already complete: each command says so, trains nothing, and puts its run back in an
    # index that lost it (a copied or rebuilt index)
    for run_id in expected:
        forget(runs, run_id)
    assert _index_rows(runs) == {}
    metrics = {run_id: (runs / run_id / "metrics.jsonl").read_text() for run_id in expected}
    again = {name: run_fwk(*args, runs=runs) for name, args in commands.items()}
    again["replay"] = run_fwk("replay", trained, runs=runs)
    assert again["train"].stdout.count("is already complete") == 1
    assert again["sweep"].stdout.count("is already complete") == 2
    assert f"replay {replayed} of run {trained} is already complete" in again["replay"].stderr
    for name, done in again.items():
        assert done.returncode == 0, (name, done.stdout + done.stderr)
    assert set(_index_rows(runs)) == set(expected)
    check_all()
    assert {run_id: (runs / run_id / "metrics.jsonl").read_text() for run_id in expected} == metrics
    assert len(_meta(runs, trained)["launches"]) == 1  # an already-complete run is not launched again


def test_a_launchs_orders_reach_its_workers_through_the_run_dir_and_end_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--redecide and a replay's decisions are written to the run dir for the launch that
    gives them; the next launch of the same run (a resume) writes its own, none here."""
    from fwk.config.resolve import resolve
    from fwk.launch import worker
    from fwk.launch.launcher import launch, plan
    from fwk.track.store import RunDir

    seen: list[dict] = []
    monkeypatch.setattr(worker, "run_worker", lambda path, cfg=None: seen.append(RunDir(path).read_orders()) or 0)
    resolved = resolve([*TINY, f"paths.runs={tmp_path}"])
    p = plan(resolved)
    for orders in ({"redecide": True}, None, {"replay": {"jit": {"choice": "eager"}}}):
        status, _ = launch(p, resolved.as_yaml, 1, orders=orders)
        assert status == 0
    assert seen == [{"redecide": True}, {}, {"replay": {"jit": {"choice": "eager"}}}]
    launch(p, resolved.as_yaml, 1)
    assert not (p.run_dir / "orders.json").exists()  # a plain launch leaves no orders behind


def test_the_worker_in_this_process_gets_the_typed_config_unless_the_record_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-process launch hands its typed config to the worker, which then need not read
    config.yaml back; a copy, so the engine cannot change the launcher's. A run dir whose
    record is not this launch's YAML makes the worker read the record."""
    import yaml

    from fwk.config.resolve import resolve
    from fwk.config.validate import to_typed
    from fwk.launch import worker
    from fwk.launch.launcher import launch, plan

    given: list = []
    monkeypatch.setattr(worker, "run_worker", lambda path, cfg=None: given.append(cfg) or 0)
    resolved = resolve([*TINY, f"paths.runs={tmp_path}"])
    p = plan(resolved)
    launch(p, resolved.as_yaml, 1, typed=resolved.config)
    assert given[0] == resolved.config and given[0] is not resolved.config
    assert given[0] == to_typed(yaml.safe_load((p.run_dir / "config.yaml").read_text()))  # as the worker reads it
    monkeypatch.setattr("fwk.launch.launcher.open_run", lambda *a, **k: _with_record(p.run_dir, "seed: 1\n"))
    launch(p, resolved.as_yaml, 1, typed=resolved.config)
    assert given[1] is None


def _with_record(run_dir: Path, text: str):
    from fwk.track.store import RunDir

    run = RunDir(run_dir)
    run.config.write_text(text)
    return run


def test_unreadable_orders_are_one_line(tmp_path: Path) -> None:
    from fwk.errors import UserError
    from fwk.track.store import RunDir

    run = RunDir(tmp_path)
    run.orders.write_text("{half")
    with pytest.raises(UserError, match=r"orders.json is not valid JSON; delete it"):
        run.read_orders()
