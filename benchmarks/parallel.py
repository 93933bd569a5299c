"""One process against two (gloo on CPU): throughput and the communication-wait share of
DDP with and without a compression hook, and of FSDP, measured side by side.

    .venv/bin/python -m benchmarks.parallel [--rounds 3] [--steps 150] [--recipe digits_cnn]

Each round runs every variant once as the real ``fwk train`` command (interleaved, so
machine drift hits all alike), each into a fresh runs root; the table shows medians, min
and max of samples/s from ``summary.json``, the ratio to one process, and the median
``comm_wait`` of the metrics rows (the share of step time ranks wait on collectives).
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

VARIANTS = {
    "1 process": ["parallel=none"],
    "2 x DDP": ["parallel=ddp", "parallel.nproc_per_node=2"],
    "2 x DDP + fp16 hook": ["parallel=ddp", "parallel.nproc_per_node=2", "parallel.comm_hook=fp16"],
    "2 x FSDP": ["parallel=fsdp", "parallel.nproc_per_node=2"],
}


def run(recipe: str, steps: int, extra: list[str]) -> tuple[float, float | None]:
    """(samples/s, median comm_wait or None) of one real ``fwk train``."""
    with tempfile.TemporaryDirectory() as runs:
        env = {**os.environ, "FWK_RUNS": runs}
        args = [f"recipe={recipe}", f"train.max_steps={steps}", "train.eval_every=0", "train.log_every=10"]
        out = subprocess.run(
            [sys.executable, "-m", "fwk", "train", *args, "checkpoint.every=0", *extra],
            env=env,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"fwk train {' '.join(extra)} failed: {(out.stderr or out.stdout).strip()[-300:]}")
        (run_dir,) = [p for p in Path(runs).iterdir() if (p / "summary.json").exists()]  # not the runs index
        summary = json.loads((run_dir / "summary.json").read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        waits = [r["comm_wait"] for r in rows if r["kind"] == "train" and "comm_wait" in r]
        return summary["samples_per_s"], statistics.median(waits) if waits else None


def measure(recipe: str, steps: int, rounds: int, variants: dict[str, list[str]]):
    """Per-round samples/s and comm-wait shares of each variant, in interleaved rounds (the
    order turns each round, so that no variant always runs first)."""
    speed: dict[str, list[float]] = {name: [] for name in variants}
    wait: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples, share = run(recipe, steps, variants[name])
            speed[name].append(samples)
            if share is not None:
                wait[name].append(share)
    return speed, wait


def rows(quick: bool) -> list:
    """For the harness (make bench): 1 process vs 2 x DDP and 2 x FSDP on digits_cnn (gloo on CPU)."""
    from benchmarks.harness import Side, ratio_row

    steps, rounds = (10, 1) if quick else (40, 5)
    variants = {k: v for k, v in VARIANTS.items() if k in ("1 process", "2 x DDP", "2 x FSDP")}
    speed, wait = measure("digits_cnn", steps, rounds, variants)
    out = []
    for name in ("2 x DDP", "2 x FSDP"):
        ratios = [a / b for a, b in zip(speed[name], speed["1 process"], strict=True)]
        share = f"; comm wait {statistics.median(wait[name]):.0%}" if wait[name] else ""
        out.append(
            ratio_row(
                "parallel",
                f"digits_cnn {steps} steps: {name}",
                ratios,
                Side(name, statistics.median(speed[name]), "samples/s"),
                Side("1 process", statistics.median(speed["1 process"]), "samples/s"),
                f"{name}/1 process samples/s",
                "",
                f"fwk train processes, {os.cpu_count()} cores{share}; a tiny model: communication dominates",
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--recipe", default="digits_cnn")
    args = parser.parse_args()
    speed, wait = measure(args.recipe, args.steps, args.rounds, VARIANTS)
    base = statistics.median(speed["1 process"])
    print(f"{args.recipe}, {args.steps} steps, {args.rounds} interleaved rounds, {os.cpu_count()} cores (CPU, gloo)")
    print("| variant | samples/s median (min-max) | vs 1 process | comm wait (median) |")
    print("| --- | --- | --- | --- |")
    for name in VARIANTS:
        s = speed[name]
        share = f"{statistics.median(wait[name]):.0%}" if wait[name] else "-"
        print(
            f"| {name} | {statistics.median(s):,.0f} ({min(s):,.0f}-{max(s):,.0f}) | "
            f"{statistics.median(s) / base:.2f}x | {share} |"
        )


if __name__ == "__main__":
    main()
