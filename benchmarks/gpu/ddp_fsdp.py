"""DDP against FSDP on one device: step time (samples/s) and peak memory of the same
``fwk train``, as ratios; one part of ``make gpu-check``.

    python -m benchmarks.gpu.ddp_fsdp [--dry] [--reps 2]

Each rep runs ``fwk train recipe=gpt_stdlib`` (``--dry``: a 2-layer GPT on the CPU, gloo)
with ``parallel=ddp`` and with ``parallel=fsdp``, one process each, in alternating order,
each into a fresh runs root; samples/s and the peak device memory come from the run's
summary.json (``peak_memory_gib``: CUDA only). On one device FSDP has nothing to shard
across: it pays its all-gathers' bookkeeping for no memory back, so the expected answer is
FSDP <= DDP in samples/s and about the same peak; what the part checks is that both run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# jit=off: compiling is the jit part's subject; here it would only spend the budget twice
GPU = ["recipe=gpt_stdlib", "train.max_steps=60", "train.eval_every=0", "checkpoint.every=0", "train.device=cuda",
       "jit=off"]  # fmt: skip
DRY = ["recipe=gpt_stdlib", "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "data.seq_len=32",
       "train.batch_size=4", "train.max_steps=4", "train.eval_every=0", "checkpoint.every=0", "train.device=cpu",
       "jit=off"]  # fmt: skip


def one(overrides: list[str], parallel: str, runs: Path) -> dict:
    env = {**os.environ, "FWK_RUNS": str(runs)}
    argv = [sys.executable, "-m", "fwk", "train", *overrides, f"parallel={parallel}", "parallel.nproc_per_node=1"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-300:]
        raise RuntimeError(f"parallel={parallel}: exit {done.returncode}: {tail}")
    (summary,) = runs.glob("*/summary.json")
    return json.loads(summary.read_text())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    overrides = DRY if args.dry else GPU
    got: dict[str, list[dict]] = {"ddp": [], "fsdp": []}
    try:
        with tempfile.TemporaryDirectory(prefix="fwk-gpu-ddp-fsdp-") as tmp:
            for rep in range(args.reps):
                for k, name in enumerate(("ddp", "fsdp") if rep % 2 == 0 else ("fsdp", "ddp")):
                    got[name].append(one(overrides, name, Path(tmp) / f"runs-{rep}-{k}"))
    except RuntimeError as exc:
        print(f"FAILED: {exc}")
        return 1
    rate = {n: statistics.median(s["samples_per_s"] for s in got[n]) for n in got}
    peak = {n: [s.get("peak_memory_gib") for s in got[n]] for n in got}
    print(f"| side | samples/s (median of {args.reps}) | peak memory GiB |\n| --- | --- | --- |")
    for name in got:
        mem = "-" if None in peak[name] else f"{max(peak[name]):.2f}"
        print(f"| {name} | {rate[name]:.1f} | {mem} |")
    mem_ratio = ""
    if None not in peak["ddp"] + peak["fsdp"]:
        mem_ratio = f", peak memory fsdp/ddp {max(peak['fsdp']) / max(peak['ddp']):.2f}x"
    print(f"ok: fsdp/ddp samples/s {rate['fsdp'] / rate['ddp']:.2f}x{mem_ratio} ({' '.join(overrides)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
