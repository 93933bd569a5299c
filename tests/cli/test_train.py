"""End to end through the real `fwk train` command."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.config.test_effect import REFUSED as EFFECTLESS
from tests.conftest import both_cpus, run_fwk

FAST = ["train.max_steps=150", "train.eval_every=75", "train.log_every=25"]


@both_cpus
def test_digits_trains_and_second_run_does_not_retrain(runs: Path, cpu_bf16: bool) -> None:
    out = run_fwk("train", *FAST, runs=runs)
    assert out.returncode == 0, out.stderr
    # the default recipe as on either CPU: with bf16 units, bf16 (and channels-last, which
    # follows the units), untimed in a run this short (8 trial steps, redone, are 5.3% of 150);
    # without, fp32 untimed. A run of the recipe's own 300 steps times bf16 (the next test)
    if cpu_bf16:
        assert "precision=auto chose bf16: CPU" in out.stdout
        assert "untimed: the 8 trial steps, redone once decided, would be 5% of this run's 150 steps" in out.stdout
    else:
        assert "precision=auto chose fp32: CPU" in out.stdout
    assert ("channels_last" in out.stdout) is cpu_bf16
    run_dirs = list(runs.glob("*/"))  # run dirs, not the index
    assert len(run_dirs) == 1
    run = run_dirs[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run_id"] == run.name
    assert summary["final_step"] == 150
    assert summary["eval"]["val_acc"] >= 0.95
    assert summary["samples_per_s"] > 0
    assert f"run {run.name} complete" in out.stdout
    for name in ("config.yaml", "meta.json", "metrics.jsonl"):
        assert (run / name).exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["world_size"] == 1 and "torch" in meta["versions"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] / 5
    assert {"lr", "samples_per_s", "data_wait"} <= set(train_rows[0])
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [75, 150]

    again = run_fwk("train", *FAST, runs=runs)
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stdout
    assert (run / "metrics.jsonl").read_text().count("\n") == len(rows)  # nothing retrained


def test_recipe_nope_lists_recipes_and_exits_2(runs: Path) -> None:
    out = run_fwk("train", "recipe=nope", runs=runs)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "digits_cnn, gpt_stdlib, gpt_stdlib_fast, hf_llama_stdlib, resnet50_imagenet" in lines[0]
    assert not runs.exists()  # nothing written for a bad command


@pytest.mark.parametrize("override", ["optim.lr=0", "train.nope=3", "seed=[1", "seed=-1", "seed=4294967296"])
def test_bad_override_exits_2_without_traceback(runs: Path, override: str) -> None:
    out = run_fwk("train", override, runs=runs)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_cfg_prints_resolved_config(runs: Path) -> None:
    out = run_fwk("train", "--cfg", "optim.lr=0.01", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "lr: 0.01" in out.stdout and "recipe: digits_cnn" in out.stdout
    assert not runs.exists()


def test_dry_run_shows_torchrun_command(runs: Path) -> None:
    out = run_fwk("train", "--dry-run", "parallel.nproc_per_node=2", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "torch.distributed.run --nproc-per-node=2 --standalone -m fwk.launch.worker" in out.stdout
    assert not runs.exists()


def test_image_folder_missing_root_is_one_line(runs: Path, tmp_path: Path) -> None:
    out = run_fwk("train", "recipe=resnet50_imagenet", f"data.root={tmp_path / 'nothing'}", runs=runs)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "train/<class>" in lines[0], out.stderr


def test_resnet50_recipe_on_a_tiny_jpeg_tree(runs: Path, tmp_path: Path) -> None:
    from tests.data.test_imagefolder import write_tree

    root = write_tree(tmp_path / "imagenet")
    out = run_fwk(
        "train",
        "recipe=resnet50_imagenet",
        f"data.root={root}",
        "model.num_classes=3",
        "data.image_size=32",
        "data.val_resize=36",
        "train.batch_size=4",
        "train.max_steps=2",
        "schedule.warmup_steps=1",
        "loader.num_workers=2",
        "precision=fp32",
        runs=runs,
    )
    assert out.returncode == 0, out.stderr
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 2 and 0.0 <= summary["eval"]["val_acc"] <= 1.0


def test_class_count_mismatch_is_one_line(runs: Path, tmp_path: Path) -> None:
    from tests.data.test_imagefolder import write_tree

    root = write_tree(tmp_path / "imagenet")
    out = run_fwk("train", "recipe=resnet50_imagenet", f"data.root={root}", "train.max_steps=1", runs=runs)
    assert out.returncode == 2
    assert (
        out.stderr.strip() == "fwk: error: model.num_classes=1000 but the data has 3 classes; set model.num_classes=3"
    )


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["precision.keep_fp32=[head.9]"],
            "precision.keep_fp32: 'head.9' matches no module of the model; closest: head",
        ),
        (["memory=checkpoint", "memory.modules=[layer9]"], "memory.modules: 'layer9' matches no module"),
        (["memory=microbatch", "memory.micro_batches=5"], "memory.micro_batches=5 is not allowed"),
        (
            ["recipe=gpt_stdlib", "model.n_embd=130", "model.n_head=4"],
            "model.n_embd=130 must be divisible by model.n_head=4 (each head gets n_embd / n_head features); "
            "use model.n_embd=128, or a model.n_head that divides 130",
        ),
        (["recipe=gpt_stdlib", "model.n_layer=0"], "model.n_layer=0 is not allowed: expected an integer >= 1"),
    ],
)
def test_bad_strategy_settings_fail_before_any_run_dir(runs: Path, overrides: list[str], expected: str) -> None:
    out = run_fwk("train", *overrides, runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip().startswith(f"fwk: error: {expected}")
    assert len(out.stderr.strip().splitlines()) == 1
    assert not runs.exists()


def test_gpt_with_jit_auto_switches_to_compiled(runs: Path) -> None:
    """The real inductor compile, on a GPT small enough to compile in seconds."""
    out = run_fwk(
        "train",
        "recipe=gpt_stdlib",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "data.max_bytes=20000",
        "data.val_max_bytes=4096",
        "train.batch_size=8",
        "train.max_steps=12",
        "train.eval_every=0",
        "train.log_every=4",
        "precision.probe_steps=2",
        "jit=auto",
        "jit.stable_steps=2",
        "jit.min_remaining_s=0",
        "jit.max_trial_share=0",
        "jit.trial_steps=2",
        runs=runs,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # fp32 is decided at step 0 (no bf16 units, no range probe): 2 stable steps, then compiled
    assert "jit=auto: 2 steps with one signature; compiling from step 2 (torch.compile inductor" in out.stdout
    assert "step 2: compiled in" in out.stdout
    assert "jit=auto keeps compiled" in out.stdout or "jit=auto goes back to eager" in out.stdout
    (run,) = runs.glob("*/")  # run dirs, not the index
    summary = json.loads((run / "summary.json").read_text())
    assert summary["jit"] in ("compiled", "off") and summary["final_step"] == 12


def test_the_default_recipe_times_bf16_against_fp32_on_a_cpu_with_bf16_units(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default command, all 300 steps: its 8 trial steps are 2.7% of them, within
    precision.max_trial_share, so the formats are timed and the faster kept."""
    monkeypatch.setenv("FWK_CPU_BF16", "1")
    out = run_fwk("train", "checkpoint.every=0", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "timing bf16 against fp32 on steps 0-7 (3 steps each, interleaved)" in out.stdout
    assert re.search(r"precision=auto chose (bf16|fp32): .*ms/step, 3 steps each\)", out.stdout), out.stdout
    assert "steps 1-8 were trial steps: redone as decided" in out.stdout


MEASURED = [
    "train.max_steps=40",
    "train.eval_every=0",
    "train.log_every=10",
    "precision.max_trial_share=1",  # a short run that times its formats all the same
]


def test_the_same_command_reuses_its_measured_decisions_and_computes_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run of a model on a machine times bf16 against fp32 and caches what it
    found; the same command after that (here in other runs roots) reuses it untimed, and
    so computes the same weights every time; --redecide measures again."""
    from fwk.components.checkpoint import model_weights

    monkeypatch.setenv("FWK_CPU_BF16", "1")  # a CPU with bf16 units: auto has a format to time
    first = run_fwk("train", *MEASURED, runs=tmp_path / "first")
    assert first.returncode == 0, first.stderr
    assert "timing bf16 against fp32 on steps 0-7" in first.stdout
    (run,) = (tmp_path / "first").glob("*/")
    launch = json.loads((run / "env.json").read_text())["launches"][0]
    assert launch["decisions"]["precision"]["source"] == "measured"  # env.json has it as soon as it is made
    measured = launch["decisions"]["precision"]

    weights = []
    for name in ("second", "third"):
        out = run_fwk("train", *MEASURED, runs=tmp_path / name)
        assert out.returncode == 0, out.stderr
        assert f"precision=auto chose {measured['choice']} as measured before for this model on this machine" in (
            out.stdout
        )
        assert "timing bf16" not in out.stdout
        (run,) = (tmp_path / name).glob("*/")
        summary = json.loads((run / "summary.json").read_text())
        decision = summary["decisions"]["precision"]
        assert (decision["source"], decision["trial"], decision["ms"]) == ("cached", None, measured["ms"])
        assert summary["decisions"]["jit"]["source"] == "cached"
        weights.append(model_weights(run / "checkpoints" / "step-00000040"))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])

    again = run_fwk("train", "--redecide", *MEASURED, runs=tmp_path / "redecided")
    assert again.returncode == 0, again.stderr
    assert "timing bf16 against fp32 on steps 0-7" in again.stdout


def test_an_explicit_slow_format_says_so_first(runs: Path) -> None:
    out = run_fwk("train", "precision=fp16", "train.max_steps=2", "train.eval_every=0", runs=runs)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        "precision=fp16 is slow here: a CPU emulates fp16 (tens of times slower than fp32); "
        "precision=auto measures what is fastest"
    )


def test_stop_at_ends_at_the_first_evaluation_that_reaches_it_and_keeps_the_best(runs: Path) -> None:
    args = ["train.stop_at=val_acc>=0.95", "train.eval_every=10", "train.log_every=10", "checkpoint.best=val_acc"]
    out = run_fwk("train", *args, runs=runs)
    assert out.returncode == 0, out.stderr
    (run,) = runs.glob("*/")
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    first = next(r for r in evals if r["val_acc"] >= 0.95)
    assert evals[-1] == first  # no evaluation after the target
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == first["step"] < 300
    assert summary["target"]["stop_at"] == "val_acc>=0.95" and summary["target"]["step"] == first["step"]
    assert f"step {first['step']}: val_acc>=0.95 reached in" in out.stdout
    top = max(evals, key=lambda r: r["val_acc"])  # the first of the best: a tie is no improvement
    best = json.loads((run / "checkpoints-best" / "best.json").read_text())
    assert (best["step"], best["value"]) == (top["step"], top["val_acc"])
    listed = {r["id"]: r for r in json.loads(run_fwk("runs", "--json", runs=runs).stdout)}
    assert listed[run.name]["metrics"]["to_target_s"] == round(summary["target"]["train_time_s"], 2)


@pytest.mark.parametrize(("overrides", "line"), EFFECTLESS, ids=[" ".join(o) for o, _ in EFFECTLESS])
def test_a_setting_that_cannot_take_effect_is_one_line_before_any_run_dir(
    runs: Path, overrides: list[str], line: str
) -> None:
    out = run_fwk("train", *overrides, runs=runs)
    assert (out.returncode, out.stderr, out.stdout) == (2, f"fwk: error: {line}\n", "")
    assert not runs.exists()


def test_a_dry_run_refuses_them_without_torch(runs: Path) -> None:
    from tests.cli.test_fast_paths import probe_each

    said, loaded = probe_each([["train", "--dry-run", *overrides] for overrides, _ in EFFECTLESS], runs=runs)
    assert loaded == []
    for (overrides, line), (code, err) in zip(EFFECTLESS, said, strict=True):
        assert (code, err.splitlines()[0]) == (2, f"fwk: error: {line}"), overrides
    assert not runs.exists()


# settings that failed only once the run started (a traceback from numpy's seeding or the first
# batch), or never (a run waiting for machines): each one line from the config check, --dry-run too
OUT_OF_RANGE = [
    (
        ["seed=-1"],
        "seed=-1 is not allowed: expected an integer in [0, 4294967295] (numpy seeds take 0 to 2**32 - 1) "
        "(fix it with seed=...)",
    ),
    (
        ["seed=4294967296"],
        "seed=4294967296 is not allowed: expected an integer in [0, 4294967295] (numpy seeds take 0 to 2**32 - 1) "
        "(fix it with seed=...)",
    ),
    (
        ["data=synthetic", "data.num_classes=0"],
        "data.num_classes=0 is not allowed: expected an integer >= 1 (labels are 0..num_classes-1) "
        "(fix it with data.num_classes=...)",
    ),
    (
        ["data=synthetic", "data.image_size=0"],
        "data.image_size=0 is not allowed: expected an integer >= 1 (the side of a square image, in pixels) "
        "(fix it with data.image_size=...)",
    ),
    (
        ["data.image_size=0"],
        "data.image_size=0 is not allowed: expected an integer >= 8 (the digits are 8x8 px; larger sizes upscale "
        "them) (fix it with data.image_size=...)",
    ),
    (
        ["parallel.nnodes=0:2"],
        "parallel.nnodes=0:2 is not an elastic range: expected MIN:MAX with 1 <= MIN <= MAX machines "
        "(fix it with parallel.nnodes=1:2, or parallel.nnodes=N for a fixed count)",
    ),
    (
        ["parallel.nnodes=0"],
        "parallel.nnodes=0 is not allowed: expected an integer >= 1 (fix it with parallel.nnodes=...)",
    ),
]


def test_a_dry_run_refuses_out_of_range_settings_in_one_line_without_torch(runs: Path) -> None:
    from tests.cli.test_fast_paths import probe_each

    said, loaded = probe_each([["train", "--dry-run", *overrides] for overrides, _ in OUT_OF_RANGE], runs=runs)
    assert loaded == []
    for (overrides, line), (code, err) in zip(OUT_OF_RANGE, said, strict=True):
        assert (code, err) == (2, f"fwk: error: {line}\n"), overrides
    assert not runs.exists()


def test_a_target_class_that_is_not_there_is_one_line(runs: Path) -> None:
    # the module is there (torch.nn), the class is not: only the build, importing torch, can tell
    out = run_fwk("train", "model._target_=torch.nn.NoSuchLayer", runs=runs)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        "fwk: error: cannot build torch.nn.NoSuchLayer: ImportError: Error loading 'torch.nn.NoSuchLayer': "
        """ModuleNotFoundError("No module named 'torch.nn.NoSuchLayer'") """
        "Are you sure that 'NoSuchLayer' is importable from module 'torch.nn'?\n"
    )
    assert not runs.exists()


def test_a_target_class_in_the_working_folder_trains_in_one_process(runs: Path, tmp_path: Path) -> None:
    # torchrun's workers import from the working folder (``python -m``), and the ``fwk`` script,
    # whose sys.path lacks it, must find the same file: run the script itself, not a fork
    (tmp_path / "my_model.py").write_text(
        "import torch.nn as nn\n\n\n"
        "class Net(nn.Sequential):\n"
        "    def __init__(self, num_classes: int = 10) -> None:\n"
        "        super().__init__(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes))\n"
    )
    overrides = ["model._target_=my_model.Net", "train.max_steps=4", "train.eval_every=4"]
    script = Path(sys.executable).with_name("fwk")
    env = {**os.environ, "FWK_RUNS": str(runs)}
    out = subprocess.run([script, "train", *overrides], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (summary,) = runs.glob("*/summary.json")
    assert json.loads(summary.read_text())["final_step"] == 4
    state = torch.load(next(runs.glob("*/checkpoints/step-*/state.pt")), weights_only=True)
    assert state["model"]["1.weight"].shape == (16, 64)
