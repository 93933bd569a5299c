"""One GPT of 8 blocks on 4 gloo processes under every kind of layout, at the same global
batch: samples/s, the largest per-rank resident memory and the largest per-rank model state,
each layout against DDP (the plain PyTorch way), measured in one run.

    .venv/bin/python -m benchmarks --only layouts [--txt bench/cpu/parallel.txt]

Each round runs every layout once as the real ``fwk train`` (interleaved, the order turning
each round), each into a fresh runs root; samples/s, ``peak_rss_gib`` and
``state_gib_per_rank`` come from the run's summary.json. On 2 CPU cores the 4 processes share
2 cores, so samples/s says what the layout's communication and bubbles cost against DDP's
all-reduce, not what 4 GPUs would give; the model state per rank is what the layout divides
whatever the device.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = ["recipe=gpt_stdlib", "model.n_layer=8", "model.n_embd=256", "model.n_head=8", "model.block_size=64",
        "data.seq_len=64", "train.batch_size=16", "train.eval_every=0", "train.log_every=5", "checkpoint.every=0",
        "precision=fp32", "jit=off", "parallel.nproc_per_node=4"]  # fmt: skip
LAYOUTS = {
    "ddp": ["parallel=ddp"],
    "fsdp": ["parallel=fsdp"],
    "tp=4": ["parallel=tp"],
    "pp=4 1f1b": ["parallel=pp", "parallel.pp_microbatches=4"],
    "tp=2 x dp_shard=2": ["parallel=hybrid", "parallel.tp=2"],
    "pp=2 x tp=2": ["parallel=pp", "parallel.pp=2", "parallel.tp=2", "parallel.pp_microbatches=4"],
    "pp=2 x dp_replicate=2": ["parallel=pp", "parallel.pp=2", "parallel.dp_replicate=-1", "parallel.pp_microbatches=4"],
}


def run(steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as runs:
        env = {**os.environ, "FWK_RUNS": runs}
        argv = [sys.executable, "-m", "fwk", "train", *BASE, f"train.max_steps={steps}", *extra]
        out = subprocess.run(argv, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"fwk train {' '.join(extra)} failed: {(out.stderr or out.stdout).strip()[-300:]}")
        (summary,) = Path(runs).glob("*/summary.json")
        return json.loads(summary.read_text())


def rows(quick: bool) -> list:
    """For the harness (make bench): each layout against DDP, 4 processes."""
    from benchmarks.harness import Side, ratio_row

    steps, rounds = (4, 1) if quick else (20, 3)
    got: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    names = list(LAYOUTS)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name].append(run(steps, LAYOUTS[name]))
    speed = {n: [s["samples_per_s"] for s in got[n]] for n in names}
    out = []
    for name in names:
        ratios = [a / b for a, b in zip(speed[name], speed["ddp"], strict=True)]
        rss = max(s["peak_rss_gib"] for s in got[name])
        state = max(s["state_gib_per_rank"] for s in got[name])
        ddp_state = max(s["state_gib_per_rank"] for s in got["ddp"])
        notes = (
            f"per rank: peak RSS {rss:.2f} GiB, model state {state * 1024:.1f} MiB "
            f"({state / ddp_state:.2f}x ddp's); {steps} steps x {rounds} rounds"
        )
        out.append(
            ratio_row(
                "layouts", f"gpt 8 blocks, 4 processes: {name}", ratios,
                Side(name, statistics.median(speed[name]), "samples/s"),
                Side("ddp", statistics.median(speed["ddp"]), "samples/s"),
                "samples/s vs ddp", notes=notes,
            )
        )  # fmt: skip
    return out
