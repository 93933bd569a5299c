"""Tensor, pipeline and hybrid parallel over NCCL train as one process does; one part of
``make gpu-check``.

    python -m benchmarks.gpu.layouts [--dry]

Runs ``fwk train recipe=gpt_stdlib`` (4 blocks, fp32, jit off, 8 steps) on one process and
under tp=2, pp=2 (1f1b) and, with 4 devices, tp=2 x dp_shard=2 (FSDP over tensor-parallel
pairs), each into a fresh runs root, and compares every logged training loss with the
one-process run's. NCCL runs one process per GPU: with fewer than 2 GPUs the part says it
is skipped; with 2 or 3 the hybrid is left out. ``--dry``: tp=2 and pp=2 on the CPU over
gloo, tiny sizes (``make test`` runs the 4-process hybrids itself). Tolerance 2e-3 on CUDA
(TF32 matmuls may be on; the layouts sum in another order) and 1e-4 on the CPU (fp32).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = 3  # check.py's exit status for "cannot run here"
BASE = ["recipe=gpt_stdlib", "model.n_layer=4", "model.n_head=4", "train.max_steps=8", "train.eval_every=0",
        "train.log_every=1", "checkpoint.every=0", "precision=fp32", "jit=off", "schedule.warmup_steps=2"]  # fmt: skip
GPU = [*BASE, "model.n_embd=256", "data.seq_len=128", "train.batch_size=32", "train.device=cuda"]
DRY = [*BASE, "model.n_embd=32", "model.block_size=32", "data.seq_len=32", "train.batch_size=8", "train.device=cpu"]
LAYOUTS = {  # name -> (processes, overrides)
    "tp=2": (2, ["parallel=tp"]),
    "pp=2 1f1b": (2, ["parallel=pp", "parallel.pp_schedule=1f1b", "parallel.pp_microbatches=4"]),
    "tp=2 x dp_shard=2": (4, ["parallel=hybrid", "parallel.tp=2"]),
}


def losses(overrides: list[str], procs: int, runs: Path) -> list[float]:
    env = {**os.environ, "FWK_RUNS": str(runs)}
    argv = [sys.executable, "-m", "fwk", "train", *overrides, f"parallel.nproc_per_node={procs}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-300:]
        raise RuntimeError(f"{' '.join(overrides)}: exit {done.returncode}: {tail}")
    (metrics,) = runs.glob("*/metrics.jsonl")
    return [r["loss"] for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    if args.dry:
        overrides, devices, tol = DRY, 2, 1e-4  # (the 4-process hybrid: tests/strategies/test_layouts_train.py)
    else:
        import torch

        devices, overrides, tol = torch.cuda.device_count(), GPU, 2e-3
        if devices < 2:
            print(f"skipped: needs 2 GPUs ({devices} visible): NCCL runs one process per GPU")
            return SKIPPED
    chosen = {k: v for k, v in LAYOUTS.items() if v[0] <= devices}
    print(f"| layout | processes | largest loss difference over {overrides[4].split('=')[1]} steps |")
    print("| --- | --- | --- |")
    worst = 0.0
    try:
        with tempfile.TemporaryDirectory(prefix="fwk-gpu-layouts-") as tmp:
            one = losses([*overrides, "parallel=none"], 1, Path(tmp) / "one")
            for k, (name, (procs, extra)) in enumerate(chosen.items()):
                got = losses([*overrides, *extra], procs, Path(tmp) / f"layout-{k}")
                diff = max(abs(a - b) for a, b in zip(got, one, strict=True))
                worst = max(worst, diff)
                print(f"| {name} | {procs} | {diff:.2e} |")
    except RuntimeError as exc:
        print(f"FAILED: {exc}")
        return 1
    if worst > tol:
        print(f"FAILED: a layout's loss differs from one process's by {worst:.2e} (> {tol:g})")
        return 1
    missing = sorted(set(LAYOUTS) - set(chosen))
    left = f"; left out (too few devices): {', '.join(missing)}" if missing else ""
    print(f"ok: {', '.join(chosen)} equal one process within {worst:.1e} (tolerance {tol:g}){left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
