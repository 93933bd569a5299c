"""`fwk train -m`: a sweep expanded with Hydra's grammar, run one run after another, listed side by side."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from fwk.config.sweep import expand
from fwk.errors import UserError
from fwk.track.sweeps import sweep_rows
from tests.conftest import run_fwk

# digits_cnn, 4 steps, one evaluation at the end: each run trains in about a second
TINY = ["train.max_steps=4", "train.eval_every=0", "train.log_every=2", "jit=off"]
SWEEP = ["optim.lr=0.01,0.003", "seed=0,1"]


def _labels(overrides: list[str]) -> list[str]:
    return [c.label() for c in expand(overrides)[1]]


def test_expansion_follows_hydra_basic_sweeper_order() -> None:
    keys, combos = expand(["optim.lr=0.1,0.01", "precision=fp32,bf16", "train.max_steps=3"])
    assert keys == ["optim.lr", "precision"]
    # the last key varies fastest; an override that does not sweep is passed on as typed
    assert [c.overrides for c in combos] == [
        ("optim.lr=0.1", "precision=fp32", "train.max_steps=3"),
        ("optim.lr=0.1", "precision=bf16", "train.max_steps=3"),
        ("optim.lr=0.01", "precision=fp32", "train.max_steps=3"),
        ("optim.lr=0.01", "precision=bf16", "train.max_steps=3"),
    ]
    assert combos[1].label() == "optim.lr=0.1 precision=bf16"
    assert dict(combos[2].values) == {"optim.lr": "0.01", "precision": "fp32"}


def test_expansion_of_range_choice_glob_and_repeated_keys() -> None:
    assert _labels(["seed=range(1,4)", "optim=choice(sgd,adamw)"]) == [
        f"seed={s} optim={o}" for s in (1, 2, 3) for o in ("sgd", "adamw")
    ]
    # glob lists the group's options from conf/ (recipes/ for recipe=), sorted as Hydra does
    assert _labels(["precision=glob(fp*)"]) == ["precision=fp16", "precision=fp32"]
    recipes = _labels(["recipe=glob(*digits*)"])  # recipe= is Hydra's `recipes` group, as users write it
    assert len(recipes) >= 2 and recipes[0] == "recipe=digits_cnn" and all("digits" in r for r in recipes)
    # a key given twice keeps its first place and its last values (BasicSweeper's OrderedDict)
    keys, combos = expand(["seed=1,2", "optim.lr=0.1", "seed=7,8,9"])
    assert keys == ["seed"] and [c.overrides for c in combos] == [(f"seed={s}", "optim.lr=0.1") for s in (7, 8, 9)]
    keys, combos = expand(["+model.at=2,100", "~tags"])  # `+` and `~` kept; the swept key is model.at
    assert keys == ["model.at"] and combos[0].overrides == ("+model.at=2", "~tags")
    assert len(expand(["train.max_steps=3"])[1]) == 1  # -m without a sweep: one run


@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.lr=interval(0,1)", "is an interval, which cannot be listed"),
        ("precision=glob(zz*)", "sweeps over no values"),
        ("optim.lr=0.1,", "cannot parse override 'optim.lr=0.1,'"),
    ],
)
def test_expansion_errors_are_one_line(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        expand([override])
    assert "\n" not in str(caught.value)


def test_best_is_by_val_acc_else_val_loss_and_skips_unfinished_runs() -> None:
    def row(rid: str, status: str, **metrics: float) -> dict:
        return {"id": rid, "status": status, "metrics": metrics, "sweep": None}

    record = {"sweep_id": "s1", "members": [{"run_id": i, "values": {"seed": i}} for i in ("a", "b", "c", "d")]}
    rows = [
        row("a", "complete", val_acc=0.90, val_loss=0.3),
        row("b", "complete", val_acc=0.95, val_loss=0.4),
        row("c", "failed", val_acc=0.99),  # a failed run is never the best
        row("x", "complete", val_acc=1.0),  # not of this sweep
    ]
    members, metric = sweep_rows(record, rows)
    assert metric == ("val_acc", "max")
    assert [(r["id"], r["status"], r["best"]) for r in members] == [
        ("a", "complete", False),
        ("b", "complete", True),
        ("c", "failed", False),
        ("d", "pending", False),  # listed, not started
    ]
    rows = [row("a", "complete", val_loss=0.3), row("b", "complete", val_loss=math.nan)]
    members, metric = sweep_rows(record, rows, pending=False)
    assert metric == ("val_loss", "min") and [r["best"] for r in members] == [True, False]
    assert sweep_rows(record, [row("a", "interrupted", loss=1.0)])[1] is None
    # equal val_acc: the lower val_loss is the best
    rows = [row("a", "complete", val_acc=0.99, val_loss=0.07), row("b", "complete", val_acc=0.99, val_loss=0.04)]
    members, metric = sweep_rows(record, rows, pending=False)
    assert metric == ("val_acc", "max") and [r["best"] for r in members] == [False, True]


def test_four_run_sweep_lands_in_the_index(runs: Path) -> None:
    # one member trained on its own first: it keeps its lineage but is still a member of the sweep
    alone = run_fwk("train", "optim.lr=0.01", "seed=0", *TINY, runs=runs)
    assert alone.returncode == 0, alone.stderr
    (first,) = [p.name for p in runs.glob("*/")]

    out = run_fwk("train", "-m", *SWEEP, *TINY, runs=runs)
    assert out.returncode == 0, out.stdout + out.stderr
    (path,) = (runs / "sweeps").glob("*.json")
    record = json.loads(path.read_text())
    sid, ids = record["sweep_id"], [m["run_id"] for m in record["members"]]
    assert path.stem == sid and record["swept"] == ["optim.lr", "seed"]
    assert record["overrides"] == [*SWEEP, *TINY] and ids[0] == first and len(set(ids)) == 4
    assert [tuple(m["values"].values()) for m in record["members"]] == [
        ("0.01", "0"),
        ("0.01", "1"),
        ("0.003", "0"),
        ("0.003", "1"),
    ]
    assert record["members"][3]["overrides"] == ["optim.lr=0.003", "seed=1", *TINY]
    assert f"sweep {sid} run 2/4: optim.lr=0.01 seed=1 -> run {ids[1]}" in out.stdout
    assert f"run {first} is already complete" in out.stdout
    for rid in ids:
        meta = json.loads((runs / rid / "meta.json").read_text())
        assert meta["launches"][-1]["outcome"] == "complete"
        assert meta.get("sweep") == (None if rid == first else sid)
        assert meta.get("kind") == (None if rid == first else "sweep")

    listed = run_fwk("runs", "--sweep", sid[:4], "--json", runs=runs)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == ids and {r["status"] for r in rows} == {"complete"}
    assert [r["step"] for r in rows] == [4, 4, 4, 4] and [r["best"] for r in rows].count(True) == 1
    acc = [r["metrics"]["val_acc"] for r in rows]
    [best] = [r for r in rows if r["best"]]  # the highest val_acc; of equals, the lowest val_loss
    top = [r for r in rows if r["metrics"]["val_acc"] == max(acc)]
    assert all(0.0 <= a <= 1.0 for a in acc)
    assert best["metrics"]["val_loss"] == min(r["metrics"]["val_loss"] for r in top)
    for one, two in ((rows[0], rows[1]), (rows[2], rows[3])):  # another seed: other initial weights
        assert two["metrics"]["val_loss"] != one["metrics"]["val_loss"]
        assert two["swept"]["optim.lr"] == one["swept"]["optim.lr"]
    # 4 steps at lr 0.01 go further than at lr 0.003 (both warm up over the same steps)
    assert rows[0]["metrics"]["val_loss"] < rows[2]["metrics"]["val_loss"]
    assert "★ best by val_acc (max; ties by val_loss)" in out.stdout and f"sweep {sid}: 4 runs" in out.stdout
    assert len(json.loads(run_fwk("runs", "--json", runs=runs).stdout)) == 4  # sweeps/ is not a run dir

    lines = {rid: (runs / rid / "metrics.jsonl").read_text() for rid in ids}
    start = time.monotonic()
    again = run_fwk("train", "-m", *SWEEP, *TINY, runs=runs)
    took = time.monotonic() - start
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("is already complete") == 4 and "kernels:" not in again.stdout  # nothing trained
    assert sorted(p.name for p in runs.glob("*/")) == sorted([*ids, "sweeps"])
    assert [p.name for p in (runs / "sweeps").iterdir()] == [path.name]
    assert {rid: (runs / rid / "metrics.jsonl").read_text() for rid in ids} == lines
    print(f"sweep of 4 again: {took:.1f} s")


def test_a_bad_combination_fails_the_sweep_up_front(runs: Path) -> None:
    out = run_fwk("train", "-m", "optim.lr=0.01,0", "train.max_steps=1,2", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fwk: error: sweep run 3/4 (optim.lr=0 train.max_steps=1): optim.lr=0.0 is not allowed: "
        "expected a number > 0 (fix it with optim.lr=...)"
    ]
    assert not runs.exists()


def test_a_sweep_over_process_counts_is_one_run(runs: Path) -> None:
    # the global batch is train.batch_size on any number of processes: one run, resumable on any
    out = run_fwk("train", "-m", "parallel.nproc_per_node=1,2", *TINY, runs=runs)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert re.fullmatch(
        r"fwk: error: sweep runs 1 \(parallel.nproc_per_node=1\) and 2 \(parallel.nproc_per_node=2\) are the "
        r"same run [0-9a-f]{10} \(only tags, paths or process counts differ\); sweep a key that changes training",
        line,
    )
    assert not runs.exists()


def test_a_sweep_without_m_says_to_add_it(runs: Path) -> None:
    out = run_fwk("train", "optim.lr=0.1,0.01", runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fwk: error: 'optim.lr=0.1,0.01' sweeps over several values; add -m to train one run per value "
        "(fwk train -m ...), or write optim.lr=[0.1,0.01] for a list"
    ]
    assert not runs.exists()


def test_a_failed_member_does_not_stop_the_sweep(runs: Path) -> None:
    # the model emits NaN at its 2nd training step when model.at=2, and never in 4 steps when at=100
    poisoned = ["model=custom", "model._target_=tests.components.nan_models.PoisonedCNN", "diagnostics=stop"]
    out = run_fwk("train", "-m", *poisoned, "+model.at=2,100", *TINY, runs=runs)
    assert out.returncode == 1
    (path,) = (runs / "sweeps").glob("*.json")
    record = json.loads(path.read_text())
    bad, good = (m["run_id"] for m in record["members"])
    assert out.stderr.strip().splitlines()[-1] == (
        f"fwk: error: sweep {record['sweep_id']}: 1 of 2 runs failed: 1 (model.at=2, run {bad})"
    )
    assert "non-finite loss" in out.stderr and "diagnostics.on_nan=stop" in out.stderr
    assert f"run {good} complete: step 4" in out.stdout  # the next member ran after the failure
    rows = json.loads(run_fwk("runs", "--sweep", record["sweep_id"], "--json", runs=runs).stdout)
    assert [(r["status"], r["best"]) for r in rows] == [("failed", False), ("complete", True)]
    assert [r["swept"] for r in rows] == [{"model.at": "2"}, {"model.at": "100"}]
