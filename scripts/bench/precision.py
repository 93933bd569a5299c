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

from common import arguments, batch_for, config, device_arg, engine_step, interleaved, machine

OPTIONS = ["fp32", "bf16", "fp16", "staged", "auto"]


def bench(workload: str, args: argparse.Namespace) -> None:
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
    medians = interleaved(steps, args.rounds, device)
    size = f"{args.image_size} px, batch {batch}" if workload == "resnet50" else f"seq 128, batch {batch}"
    print(f"\n{workload} ({size}), {machine(device)}; median of {args.rounds} interleaved steps")
    print(f"{'option':<8} {'runs as':<8} {'ms/step':>9} {'vs fp32':>8}")
    for option in OPTIONS:
        ms = medians[option] * 1000
        print(f"{option:<8} {chosen[option]:<8} {ms:9.1f} {medians[option] / medians['fp32']:7.2f}x")


def main() -> None:
    parser = arguments(gpt_batch=32, workloads="resnet50,gpt")
    args = parser.parse_args()
    for workload in args.workloads.split(","):
        bench(workload, args)


if __name__ == "__main__":
    main()
