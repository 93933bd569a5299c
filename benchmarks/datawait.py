"""The data-wait share of training on an image folder: loader=auto against DataLoader's
defaults (loader=manual: no workers, the data loaded in the training process).

``fwk train`` (ResNet-18 on a folder of real photos that the benchmark writes at 85x64 px,
10 classes: benchmarks/decode.py's ``write_photos``) runs with each loader setting in interleaved reps, each
into a fresh runs root; the share is summary.json's ``data_wait`` (the training time spent
waiting for the next batch). Target: < 5% with auto.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, Side, measure_pair, ratio_row

SETTINGS = {"auto": ["loader=auto"], "defaults": ["loader=manual"]}


def train(root: Path, runs: Path, size: int, steps: int, batch: int, loader: list[str]) -> float:
    """data_wait share of one ``fwk train`` on the folder."""
    if not (ROOT / "conf" / "loader" / "auto.yaml").exists():
        raise RuntimeError("needs the loader config group (loader=auto, the data pipeline's branch)")
    args = [
        "model=resnet18",
        "data=imagefolder",
        f"data.root={root}",
        f"data.image_size={size}",
        "model.num_classes=10",
        f"train.max_steps={steps}",
        f"train.batch_size={batch}",
        "train.eval_every=0",
        "train.log_every=5",
        "train.eval_batches=1",
        "checkpoint.every=0",
        "jit=off",
        "precision=fp32",
        "precision.keep_fp32=[fc]",  # the default recipe's island names digits_cnn's head
        *loader,
    ]
    env = {**os.environ, "FWK_RUNS": str(runs)}
    done = subprocess.run([sys.executable, "-m", "fwk", "train", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"fwk train {' '.join(loader)} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    (run_dir,) = [p for p in runs.iterdir() if (p / "summary.json").exists()]
    return json.loads((run_dir / "summary.json").read_text())["data_wait"]


def rows(quick: bool) -> list:
    from benchmarks.decode import write_photos

    size, steps, batch, reps = (64, 6, 8, 1) if quick else (64, 20, 16, 5)
    with tempfile.TemporaryDirectory(prefix="fwk-bench-datawait-") as tmp:
        root = Path(tmp) / "folder"
        write_photos(root, batch * 8, val_per_class=1, size=(round(size * 4 / 3), size))
        n = [0]

        def one(loader: list[str]) -> float:
            n[0] += 1
            return train(root, Path(tmp) / f"runs{n[0]}", size, steps, batch, loader)

        pair = measure_pair(lambda: one(SETTINGS["auto"]), lambda: one(SETTINGS["defaults"]), reps=reps, warmup=0)
    row = ratio_row(
        "datawait",
        f"resnet18 on {size} px JPEGs, {steps} steps, batch {batch}: data-wait share",
        pair.ratios(),
        Side("auto", 100 * statistics.median(pair.a), "%"),
        Side("defaults", 100 * statistics.median(pair.b), "%"),
        "auto/defaults data-wait share",
        "",
        "loader=auto vs loader=manual (num_workers=0); target on auto's share itself",
    )
    row.target, row.met = "auto < 5%", statistics.median(pair.a) < 0.05
    return [row]
