"""Activation memory and step time of each memory strategy, as ratios to none.

    .venv/bin/python -m benchmarks.memory [--rounds 5] [--image-size 64] [--batch 16]
    .venv/bin/python -m benchmarks.memory --device cuda --image-size 224 --batch 128

Workloads: ResNet-50 on synthetic images and the gpt_stdlib GPT at 8 layers. Per strategy:
- saved: activation bytes autograd keeps for backward on the device (saved tensors counted
  once per storage with saved_tensors_hooks, the model's parameters left out, plus the
  inputs checkpointed blocks keep), the largest micro-batch's under microbatch;
- peak: a step's peak memory above what was held before it (after one warm-up step), each
  strategy in a fresh process: on CUDA the peak allocated memory, on CPU the resident set
  size polled by a thread, with glibc told to return every block over 64 KiB to the system
  on free (MALLOC_MMAP_THRESHOLD_), so that RSS follows live memory. It includes the
  gradients, the same for every strategy;
- ms/step: median of ``rounds`` interleaved steps, all strategies in one process.
Targets: checkpoint <= 0.5x the saved bytes of none at <= 1.35x the step time; microbatch
(n=4) <= 0.3x the saved bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

from benchmarks.common import (
    arguments,
    batch_for,
    config,
    device_arg,
    engine_step,
    interleaved_times,
    machine,
    peak_rss_during,
    rss,
)

STRATEGIES = {
    "none": ["memory=none"],
    "checkpoint": ["memory=checkpoint"],
    "offload": ["memory=offload"],
    "microbatch": ["memory=microbatch", "memory.micro_batches=4"],
}


def _setup(workload: str, strategy: str, args: argparse.Namespace):
    device = device_arg(args.device)
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    extra = [*STRATEGIES[strategy], "precision=fp32", f"train.device={device.type}"]
    cfg = config(workload, batch, args.image_size, extra)
    step, _, memory, *_ = engine_step(cfg, device, batch)
    return device, step, memory, batch_for(cfg, batch, device)


def peak(workload: str, strategy: str, args: argparse.Namespace) -> int:
    """In a fresh process: a step's peak memory above what was held before it."""
    device, step, memory, (x, y) = _setup(workload, strategy, args)
    step(0, [(x, y)])  # optimizer state exists from here on
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step(1, [(x, y)])
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    before = rss()
    return peak_rss_during(lambda: step(1, [(x, y)])) - before


def measure(workload: str, args: argparse.Namespace, argv: list[str]):
    """(per-round seconds, saved bytes, peak bytes) of each strategy; ``argv``: this script's
    options for the child that measures each peak."""
    steps, saved, peaks = {}, {}, {}
    for strategy in STRATEGIES:
        device, step, memory, (x, y) = _setup(workload, strategy, args)
        saved[strategy] = measure_saved(step, memory, x, y)
        step(0, [(x, y)])  # warm-up
        steps[strategy] = lambda step=step, x=x, y=y: step(1, [(x, y)])
        child = [sys.executable, "-m", "benchmarks.memory", "--peak-of", f"{workload}:{strategy}", *argv]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        out = subprocess.run(child, check=True, capture_output=True, text=True, env=env).stdout
        peaks[strategy] = json.loads(out)
    return interleaved_times(steps, args.rounds, device), saved, peaks


def bench(workload: str, args: argparse.Namespace) -> None:
    device = device_arg(args.device)
    times, saved, peaks = measure(workload, args, sys.argv[1:])
    medians = {s: statistics.median(ts) for s, ts in times.items()}
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    size = f"{args.image_size} px, batch {batch}" if workload == "resnet50" else f"8 layers, seq 128, batch {batch}"
    what = "peak alloc" if device.type == "cuda" else "peak RSS"
    print(f"\n{workload} ({size}), {machine(device)}; median of {args.rounds} interleaved steps")
    ratio = f"{'vs none':>8}"
    print(f"{'strategy':<11} {'saved MB':>9} {ratio} {what + ' MB':>14} {ratio} {'ms/step':>9} {ratio}")
    for s in STRATEGIES:
        print(
            f"{s:<11} {saved[s] / 1e6:9.1f} {saved[s] / saved['none']:7.2f}x {peaks[s] / 1e6:14.1f} "
            f"{peaks[s] / max(peaks['none'], 1):7.2f}x {medians[s] * 1000:9.1f} {medians[s] / medians['none']:7.2f}x"
        )


def measure_saved(step, memory, x, y) -> int:
    """Bytes kept for backward by one step (the largest micro-batch's), as memory=auto counts them."""
    memory.meter.take()
    inner = torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda) if memory.plan.offload else None
    for xs, ys in step.plan.pieces([(x, y)]):
        with memory.meter.counting(inner):
            logits = step.model(xs)
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ys.reshape(-1)).backward()
    step.optimizer.zero_grad(set_to_none=True)
    return memory.meter.take()


def rows(quick: bool) -> list:
    """For the harness (make bench): per strategy, saved activation bytes and step time vs none
    (saved bytes are exact counts, the same every rep: one figure, no spread)."""
    from benchmarks.harness import guarded

    # batch 8: microbatch splits it in 4, and BatchNorm needs > 1 image per piece
    size = (
        ["--image-size", "32", "--batch", "8", "--gpt-batch", "4", "--rounds", "3"]
        if quick
        else ["--image-size", "64", "--batch", "8", "--gpt-batch", "8", "--rounds", "5"]
    )
    args = arguments(gpt_batch=16, workloads="").parse_args(size)
    return [r for w in ("resnet50", "gpt8") for r in guarded("memory", w, lambda w=w: _rows(w, args, size))]


def _rows(workload: str, args: argparse.Namespace, size: list[str]) -> list:
    from benchmarks.common import option_rows
    from benchmarks.harness import Row, Side, check

    times, saved, peaks = measure(workload, args, size)
    what = (
        f"{workload} ({args.image_size} px, batch {args.batch})"
        if workload == "resnet50"
        else (f"{workload} (batch {args.gpt_batch})")
    )
    out = option_rows("memory", f"{what} step time", times, "none", "", {"checkpoint": "<= 1.35x"})
    for s in STRATEGIES:
        if s != "none":
            r = saved[s] / saved["none"]
            target = {"checkpoint": "<= 0.5x", "microbatch": "<= 0.3x"}.get(s, "")
            out.append(
                Row(
                    "memory",
                    f"{what} saved activations: {s}",
                    f"{s}/none saved bytes",
                    r,
                    r,
                    r,
                    Side(s, saved[s] / 1e6, "MB"),
                    Side("none", saved["none"] / 1e6, "MB"),
                    target,
                    check(r, target),
                    f"peak RSS {peaks[s] / 1e6:.0f} vs {peaks['none'] / 1e6:.0f} MB",
                )
            )
    return out


def main() -> None:
    parser = arguments(gpt_batch=16, workloads="resnet50,gpt8")
    parser.add_argument("--peak-of", default="", help=argparse.SUPPRESS)  # internal: one strategy's peak
    args = parser.parse_args()
    if args.peak_of:
        workload, strategy = args.peak_of.split(":")
        print(json.dumps(peak(workload, strategy, args)))
        return
    for workload in args.workloads.split(","):
        bench(workload, args)


if __name__ == "__main__":
    main()
