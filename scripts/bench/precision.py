"""Step time of each precision option, as ratios to fp32, measured side by side.

    .venv/bin/python scripts/bench/precision.py [--rounds 5] [--image-size 64] [--batch 16]
    .venv/bin/python scripts/bench/precision.py --device cuda --image-size 224 --batch 128

Workloads: ResNet-50 on synthetic images and the gpt_stdlib recipe's GPT. Each option
gets its own model (same init) and runs through fwk's own Precision and TrainStep; one
warm-up step each, then ``rounds`` interleaved timed steps; the median is reported.
``staged`` is timed in its main (AMP) phase, where it spends ~90% of a run's steps.
Target: ``auto`` is never slower than fp32 (ratio <= 1.00 within noise), on any machine.
"""

from __future__ import annotations

import argparse
import statistics

from common import arguments, batch_for, config, device_arg, engine_step, interleaved_times, machine, option_rows

OPTIONS = ["fp32", "bf16", "fp16", "staged", "auto"]


def measure(workload: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per-round seconds of each option's step, and the format each ran as."""
    device = device_arg(args.device)
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    steps, chosen = {}, {}
    for option in OPTIONS:
        extra = [f"precision={option}", "train.max_steps=1000", f"train.device={device.type}"]
        cfg = config(workload, batch, args.image_size, extra)
        step, precision, _ = engine_step(cfg, device, batch)
        x, y = batch_for(cfg, batch, device)
        at = 500 if option == "staged" else 100  # staged: a step in the main phase; auto: past its probe
        step(at, [(x, y)])  # warm-up (and for auto, the end of its range probe)
        steps[option] = lambda step=step, x=x, y=y, at=at: step(at, [(x, y)])
        chosen[option] = precision.format
    return interleaved_times(steps, args.rounds, device), chosen


def bench(workload: str, args: argparse.Namespace) -> None:
    device = device_arg(args.device)
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    times, chosen = measure(workload, args)
    medians = {option: statistics.median(ts) for option, ts in times.items()}
    size = f"{args.image_size} px, batch {batch}" if workload == "resnet50" else f"seq 128, batch {batch}"
    print(f"\n{workload} ({size}), {machine(device)}; median of {args.rounds} interleaved steps")
    print(f"{'option':<8} {'runs as':<8} {'ms/step':>9} {'vs fp32':>8}")
    for option in OPTIONS:
        ms = medians[option] * 1000
        print(f"{option:<8} {chosen[option]:<8} {ms:9.1f} {medians[option] / medians['fp32']:7.2f}x")


def rows(quick: bool) -> list:
    """For the harness (make bench): small sizes, so that bf16/fp16 on a CPU without native
    support (~10-20x slower there) fit its budget."""
    args = arguments(gpt_batch=32, workloads="").parse_args([])
    args.image_size, args.batch, args.gpt_batch, args.rounds = (32, 2, 2, 3) if quick else (32, 8, 8, 5)
    from harness import guarded

    def one(workload: str) -> list:
        times, chosen = measure(workload, args)
        size = f"{args.image_size} px, batch {args.batch}" if workload == "resnet50" else f"batch {args.gpt_batch}"
        note = "auto ran as " + chosen["auto"] + "; staged in its main phase"
        return option_rows("precision", f"{workload} ({size})", times, "fp32", note, {"auto": "<= 1.05x"})

    return [r for w in ("resnet50", "gpt") for r in guarded("precision", w, lambda w=w: one(w))]


def main() -> None:
    parser = arguments(gpt_batch=32, workloads="resnet50,gpt")
    args = parser.parse_args()
    for workload in args.workloads.split(","):
        bench(workload, args)


if __name__ == "__main__":
    main()
