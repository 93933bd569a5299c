"""`fwk runs` end to end: list with filters, show, diff, plot, rm, bad ids, a real run, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fwk.track.store import RunLock
from tests.conftest import run_fwk
from tests.track.fake_runs import make_run


@pytest.fixture
def three(runs: Path) -> Path:
    now = time.time()
    make_run(runs, "a1b2c3d4e5", recipe="digits_cnn", tags=["base"], created=now - 300, eval_metrics={"val_acc": 0.90})
    make_run(
        runs,
        "a1ffff0000",
        recipe="digits_cnn",
        lr=3e-3,
        losses=(2.3, 1.5),
        tags=["base", "hi-lr"],
        created=now - 200,
        eval_metrics={"val_acc": 0.95},
    )
    make_run(runs, "9f00000000", recipe="gpt_tiny", created=now - 100, checkpoint=True)
    return runs


@pytest.mark.parametrize(
    "command", [["runs"], ["runs", "show"], ["runs", "diff"], ["runs", "plot"], ["runs", "rm"]], ids=" ".join
)
def test_help(command: list[str], runs: Path) -> None:
    out = run_fwk(*command, "--help", runs=runs)
    assert out.returncode == 0 and "Usage" in out.stdout, out.stderr


def test_list_table_and_filters(three: Path) -> None:
    out = run_fwk("runs", runs=three)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["9f00000000", "a1ffff0000", "a1b2c3d4e5"]  # newest first
    assert "interrupted" in lines[1] and "val_acc 0.95" in lines[2]
    assert "rebuilt" in out.stderr  # first look: one line, then silent
    assert run_fwk("runs", runs=three).stderr == ""

    def ids(*args: str) -> list[str]:
        out = run_fwk("runs", *args, "--json", runs=three)
        assert out.returncode == 0, out.stderr
        return [r["id"] for r in json.loads(out.stdout)]

    assert ids("--recipe", "digits_cnn") == ["a1ffff0000", "a1b2c3d4e5"]
    assert ids("--status", "interrupted") == ["9f00000000"]
    assert ids("--tag", "hi-lr") == ["a1ffff0000"]
    assert ids("--tag", "base", "--status", "complete") == ["a1ffff0000", "a1b2c3d4e5"]
    assert ids("--sweep", "nope") == []
    bad = run_fwk("runs", "--status", "done", runs=three)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "running, complete" in bad.stderr


def test_show(three: Path) -> None:
    out = run_fwk("runs", "show", "a1f", "--json", runs=three)
    data = json.loads(out.stdout)
    assert data["id"] == "a1ffff0000" and data["config"]["optim"]["lr"] == 3e-3
    assert data["summary"]["eval"]["val_acc"] == 0.95 and data["lineage"]["exports"] == []
    assert {f["name"] for f in data["files"]} >= {"config.yaml", "meta.json", "metrics.jsonl", "summary.json"}
    text = run_fwk("runs", "show", "a1f", runs=three).stdout
    assert "eval.val_acc" in text and "lr: 0.003" in text and "metrics.jsonl" in text


def test_diff(three: Path) -> None:
    out = run_fwk("runs", "diff", "a1b", "a1f", "--json", runs=three)
    data = json.loads(out.stdout)
    assert data["config"] == [
        {"key": "optim.lr", "a": 1e-3, "b": 3e-3},
        {"key": "tags", "a": ["base"], "b": ["base", "hi-lr"]},
    ]
    metrics = {m["name"]: m for m in data["metrics"]}
    assert metrics["val_acc"]["diff"] == pytest.approx(0.05) and metrics["train loss"]["diff"] == pytest.approx(-0.4)
    text = run_fwk("runs", "diff", "a1b", "a1f", runs=three).stdout
    row = next(line for line in text.splitlines() if line.startswith("optim.lr"))
    assert row.split() == ["optim.lr", "0.001", "0.003"]
    row = next(line for line in text.splitlines() if line.startswith("val_acc"))
    assert row.split() == ["val_acc", "0.9", "0.95", "+0.05"]


def test_unknown_or_ambiguous_prefix_is_one_line(three: Path) -> None:
    out = run_fwk("runs", "show", "a1c", runs=three)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "closest ids: a1b2c3d4e5" in out.stderr
    out = run_fwk("runs", "diff", "a1", "9f", runs=three)
    assert out.returncode == 2 and "matches 2 runs" in out.stderr and out.stderr.count("\n") == 1


@pytest.fixture
def curves(runs: Path) -> Path:
    """Two runs with train and eval rows (one still running: no summary), and one with no rows yet."""
    make_run(
        runs,
        "c0ffee0001",
        losses=(2.3, 1.9, 1.4, 1.1),
        evals={2: {"val_loss": 1.8, "val_acc": 0.5}, 4: {"val_loss": 1.2, "val_acc": 0.8}},
        eval_metrics={"val_loss": 1.2, "val_acc": 0.8},
    )
    make_run(runs, "d00d000002", lr=3e-3, tags=["hi-lr"], losses=(2.3, 1.6, 1.0), evals={2: {"val_loss": 1.5}})
    make_run(runs, "c0ffee9999", losses=())
    return runs


def test_plot_writes_a_png_and_prints_its_path(curves: Path) -> None:
    from matplotlib.image import imread

    out = run_fwk("runs", "plot", "c0ffee0001", "d00d000002", runs=curves)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    path = Path(out.stdout.strip())
    assert path == (curves / "plots" / "c0ffee0001+d00d000002.png").resolve()
    assert imread(path).shape == (750, 1000, 4)  # loss, val_loss, val_acc: a 2 x 2 grid and one legend row
    # the plots/ folder is no run: the list still has the three runs, and only them
    listed = json.loads(run_fwk("runs", "--json", runs=curves).stdout)
    assert sorted(r["id"] for r in listed) == ["c0ffee0001", "c0ffee9999", "d00d000002"]


def test_plot_json_out_and_prefixes(curves: Path, tmp_path: Path) -> None:
    target = tmp_path / "x" / "y.png"
    # a run named twice (by two prefixes) is plotted once, in the order given
    out = run_fwk("runs", "plot", "d00d", "d0", "c0ffee0", "--out", str(target), "--json", runs=curves)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "path": str(target.resolve()),
        "runs": ["d00d000002", "c0ffee0001"],
        "metrics": ["loss", "val_loss", "val_acc"],
        "skipped": [],
    }
    assert target.is_file() and not (curves / "plots").exists()


def test_plot_a_run_without_metrics(curves: Path) -> None:
    out = run_fwk("runs", "plot", "c0ffee9", runs=curves)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stdout == ""
    assert "run c0ffee9999 has no metrics yet" in out.stderr
    # beside a run that has some: one warning, and the other is plotted
    out = run_fwk("runs", "plot", "c0ffee9", "c0ffee0", "--json", runs=curves)
    assert out.returncode == 0 and out.stderr.count("\n") == 1 and "plotting the other 1" in out.stderr
    data = json.loads(out.stdout)
    assert data["runs"] == ["c0ffee0001"] and data["skipped"] == ["c0ffee9999"]
    assert data["path"] == str((curves / "plots" / "c0ffee0001.png").resolve())


def test_plot_bad_arguments_are_one_line(curves: Path) -> None:
    out = run_fwk("runs", "plot", "c0ffee0001", "zz", runs=curves)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no run 'zz'" in out.stderr
    out = run_fwk("runs", "plot", "c0ffee", runs=curves)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "matches 2 runs" in out.stderr
    out = run_fwk("runs", "plot", "c0ffee0001", "--out", "plot.pdf", runs=curves)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "give a name ending in .png" in out.stderr
    out = run_fwk("runs", "plot", "c0ffee0001", "--x", "epochs", runs=curves)
    assert out.returncode == 2
    assert out.stderr.strip() == "fwk: error: --x epochs is not an axis: expected step, time or samples"
    assert not (curves / "plots").exists()


def test_plot_name_of_many_runs_is_short() -> None:
    from fwk.cli.runs import _plot_name

    ids = [f"{i:010x}" for i in range(6)]
    name = _plot_name(ids)
    assert (
        name.startswith("0000000000+5-more-") and name.endswith(".png") and len(name) == len("0000000000+5-more-") + 12
    )
    assert _plot_name(ids[::-1]).split("-more-")[1] == name.split("-more-")[1]  # the hash is of the set


def test_rm_asks_first(three: Path) -> None:
    out = run_fwk("runs", "rm", "9f", runs=three, input="n\n")
    assert out.returncode == 1 and "Remove run 9f00000000" in out.stderr and (three / "9f00000000").is_dir()
    out = run_fwk("runs", "rm", "9f", runs=three, input="y\n")
    assert out.returncode == 0 and not (three / "9f00000000").exists()
    out = run_fwk("runs", "rm", "a1b", "--yes", "--json", runs=three)
    assert json.loads(out.stdout)["removed"] == "a1b2c3d4e5" and not (three / "a1b2c3d4e5").exists()
    assert [r["id"] for r in json.loads(run_fwk("runs", "--json", runs=three).stdout)] == ["a1ffff0000"]


def test_rm_refuses_a_running_run(three: Path) -> None:
    from fwk.track.store import RunDir

    with RunLock(RunDir(three / "9f00000000")):  # as a launcher holds it while training
        out = run_fwk("runs", "rm", "9f", "--yes", runs=three)
        listed = json.loads(run_fwk("runs", "--json", "--status", "running", runs=three).stdout)
    assert out.returncode == 2 and "is running" in out.stderr and (three / "9f00000000").is_dir()
    assert [r["id"] for r in listed] == ["9f00000000"]
    # the lock is free again: not running any more (it has a checkpoint and no summary)
    assert json.loads(run_fwk("runs", "--json", "--status", "interrupted", runs=three).stdout)[0]["id"] == "9f00000000"


def test_runs_commands_import_no_torch(three: Path) -> None:
    code = (
        "import sys\n"
        "from fwk.cli import app\n"
        f"root = {str(three)!r}\n"
        "for args in (['runs'], ['runs', '--json', '--tag', 'base'], ['runs', 'show', 'a1f'],\n"
        "             ['runs', 'diff', 'a1b', 'a1f', '--json'], ['runs', 'rm', '9f', '--yes']):\n"
        "    try:\n"
        "        app([*args, '--root', root] if len(args) == 1 or args[1].startswith('-') else\n"
        "            [args[0], args[1], '--root', root, *args[2:]], standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "TORCH False"
    assert not (three / "9f00000000").exists()


def test_a_real_run_is_recorded_complete(runs: Path) -> None:
    out = run_fwk("train", "train.max_steps=5", "jit=off", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "index" not in out.stderr  # the hooks wrote the index quietly
    listed = run_fwk("runs", "--json", runs=runs)
    assert listed.stderr == ""  # the index was there already: no rebuild
    [row] = json.loads(listed.stdout)
    assert row["status"] == "complete" and row["step"] == 5 and row["recipe"] == "digits_cnn"
    assert 0 < row["metrics"]["val_loss"] < 5 and "loss" in row["metrics"]
    meta = json.loads((runs / row["id"] / "meta.json").read_text())
    assert meta["launches"][-1]["outcome"] == "complete"
