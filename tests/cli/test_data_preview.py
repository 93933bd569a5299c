"""End to end through the real `fwk data preview` command."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.conftest import run_fwk

# Grid math (fwk/data/preview.py): a near-square grid, 2 px between tiles, each tile the
# image (upscaled by a whole factor to >= 32 px) over a 12 px label strip.
PAD, LABEL_H = 2, 12


def grid_px(n: int, side: int) -> tuple[int, int]:
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    return cols * (side + PAD) + PAD, rows * (side + LABEL_H + PAD) + PAD


def written(stdout: str, suffix: str) -> Path:
    match = re.search(rf"wrote (\S+{suffix})", stdout)
    assert match, stdout
    return Path(match.group(1))


def test_digits_png_then_train_the_same_run(runs: Path) -> None:
    from PIL import Image

    overrides = ["train.max_steps=3", "train.eval_every=3", "train.log_every=1"]
    out = run_fwk("data", "preview", *overrides, "--n", "10", runs=runs)
    assert out.returncode == 0, out.stderr
    png = written(out.stdout, ".png")
    run_id = png.parent.parent.name
    assert out.stdout.startswith(f"run {run_id}: ") and png.parent.parent.parent == runs.resolve()
    # 8x8 digits upscaled 4x to 32 px: 4 columns x 3 rows for 10 samples.
    with Image.open(png) as image:
        assert image.size == grid_px(10, 32) == (138, 140)
        assert image.mode == "RGB"
    assert f"({image.width}x{image.height} px)" in out.stdout
    assert sorted(p.name for p in png.parent.parent.iterdir()) == ["preview"]  # no config.yaml: not a run yet

    # The run dir holding only preview/ is a fresh run to `fwk train`, which trains it normally.
    train = run_fwk("train", *overrides, runs=runs)
    assert train.returncode == 0, train.stderr
    assert f"run {run_id} complete" in train.stdout  # the run id the preview was written under
    summary = json.loads((runs / run_id / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["final_step"] == 3
    assert png.exists()


@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_image_folder_png(runs: Path, tmp_path: Path) -> None:
    from PIL import Image

    from tests.data.test_imagefolder import write_tree

    root = write_tree(tmp_path / "imagenet")  # 3 classes x 4 train images
    out = run_fwk(
        "data",
        "preview",
        "recipe=resnet50_imagenet",
        f"data.root={root}",
        "model.num_classes=3",
        "data.image_size=40",
        "train.batch_size=4",
        "--n",
        "6",
        runs=runs,
    )
    assert out.returncode == 0, out.stderr
    with Image.open(written(out.stdout, ".png")) as image:
        assert image.size == grid_px(6, 40) == (128, 110)  # 40 px crops: not upscaled; 3 x 2 tiles
    assert "un-normalized" in out.stdout


def test_text_recipe_writes_decoded_samples(runs: Path) -> None:
    out = run_fwk("data", "preview", "recipe=gpt_stdlib", "data.max_bytes=65536", "--n", "5", runs=runs)
    assert out.returncode == 0, out.stderr
    assert "no PNG" in out.stdout
    text = written(out.stdout, ".txt").read_text()
    assert text.count("=== sample ") == 5
    assert text.count("--- input (128 tokens) ---") == 5 and text.count("--- target (128 tokens) ---") == 5


@pytest.mark.parametrize("n", ["0", "-3"])
def test_bad_n_is_one_line(runs: Path, n: str) -> None:
    out = run_fwk("data", "preview", "--n", n, runs=runs)
    assert out.returncode == 2
    assert out.stderr.strip() == f"fwk: error: --n {n} is not allowed: expected a number of samples >= 1 (e.g. --n 64)"
    assert not runs.exists()


def test_missing_image_folder_is_the_data_sets_error(runs: Path, tmp_path: Path) -> None:
    out = run_fwk("data", "preview", "recipe=resnet50_imagenet", f"data.root={tmp_path / 'nothing'}", runs=runs)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a folder" in lines[0] and "train/<class>" in lines[0], out.stderr
    assert not runs.exists()


def test_bad_override_is_one_line(runs: Path) -> None:
    out = run_fwk("data", "preview", "train.nope=3", runs=runs)  # composed as `fwk train` does
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "unknown key 'train.nope'" in out.stderr, out.stderr
    assert not runs.exists()
