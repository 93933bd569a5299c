"""Step time of each precision option, as ratios to fp32, measured side by side.

    .venv/bin/python -m benchmarks.precision [--rounds 5] [--image-size 64] [--batch 16]
    .venv/bin/python -m benchmarks.precision --device cuda --image-size 224 --batch 128

Workloads: ResNet-50 on synthetic images, the gpt_stdlib recipe's GPT and the default
recipe's digits CNN. Each option gets its own model (same init) and runs through fwk's own
Precision and TrainStep; one warm-up step each, then ``rounds`` interleaved timed steps;
the median is reported. ``staged`` is timed in its main (AMP) phase, where it spends ~90%
of a run's steps. ``auto`` first runs its range probe and trial steps, so it is timed in
the format it measured faster, as a first run on this machine chooses (no cache);
``auto@units`` does the same as on a CPU that reports bf16 units (``FWK_CPU_BF16=1``):
where they are emulated, as on a CPU without them, it must find bf16 slower and keep fp32.
Targets, on every machine: ``auto`` <= 1.02x fp32, and within 5% of the fastest fixed
format (fp32, bf16, fp16, staged) measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator

from benchmarks.common import (
    arguments,
    batch_for,
    config,
    device_arg,
    engine_step,
    interleaved_times,
    machine,
    option_rows,
)

OPTIONS = ["fp32", "bf16", "fp16", "staged", "auto", "auto@units"]


def measure(workload: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per-round seconds of each option's step, and the format each ran as."""
    device = device_arg(args.device)
    batch = _batch(workload, args)
    steps, chosen = {}, {}
    for option in OPTIONS:
        name, _, units = option.partition("@")
        extra = [f"precision={name}", "train.max_steps=1000", f"train.device={device.type}"]
        cfg = config(workload, batch, args.image_size, extra)  # digits: the recipe's 8 px
        with _cpu_bf16_units(bool(units)):
            step, precision, *_ = engine_step(cfg, device, batch)
        x, y = batch_for(cfg, batch, device)
        for at in range(precision.trial_end):  # auto: its range probe and trial steps, deciding as a run does
            step(at, [(x, y)])
        at = 500 if option == "staged" else 100  # staged: a step in the main phase; auto: past its decision
        step(at, [(x, y)])  # warm-up
        steps[option] = lambda step=step, x=x, y=y, at=at: step(at, [(x, y)])
        chosen[option] = precision.format
    return interleaved_times(steps, args.rounds, device), chosen


FIXED = ["fp32", "bf16", "fp16", "staged"]


@contextlib.contextmanager
def _cpu_bf16_units(on: bool) -> Iterator[None]:
    """The CPU probe as on a CPU that reports bf16 units (``on``), while a Precision is built."""
    before = os.environ.get("FWK_CPU_BF16")
    if on:
        os.environ["FWK_CPU_BF16"] = "1"
    try:
        yield
    finally:
        if on and before is None:
            del os.environ["FWK_CPU_BF16"]
        elif on:
            os.environ["FWK_CPU_BF16"] = before


def _batch(workload: str, args: argparse.Namespace) -> int:
    return {"resnet50": args.batch, "digits": args.digits_batch}.get(workload, args.gpt_batch)


def _size(workload: str, args: argparse.Namespace) -> str:
    if workload == "resnet50":
        return f"{args.image_size} px, batch {args.batch}"
    return f"8 px, batch {args.digits_batch}" if workload == "digits" else f"seq 128, batch {args.gpt_batch}"


def fastest_fixed(times: dict[str, list[float]]) -> str:
    return min(FIXED, key=lambda option: statistics.median(times[option]))


def bench(workload: str, args: argparse.Namespace) -> None:
    device = device_arg(args.device)
    times, chosen = measure(workload, args)
    medians = {option: statistics.median(ts) for option, ts in times.items()}
    best = fastest_fixed(times)
    print(f"\n{workload} ({_size(workload, args)}), {machine(device)}; median of {args.rounds} interleaved steps")
    print(f"{'option':<10} {'runs as':<8} {'ms/step':>9} {'vs fp32':>8} {'vs ' + best:>10}")
    for option in OPTIONS:
        ms = medians[option] * 1000
        print(
            f"{option:<10} {chosen[option]:<8} {ms:9.1f} {medians[option] / medians['fp32']:7.2f}x "
            f"{medians[option] / medians[best]:9.2f}x"
        )


def rows(quick: bool) -> list:
    """For the harness (make bench): small sizes, so that bf16/fp16 on a CPU without native
    support (~10-20x slower there) fit its budget. Per workload: each option against fp32,
    and auto against the fastest fixed format of the same run."""
    args = arguments(gpt_batch=32, workloads="").parse_args([])
    args.image_size, args.batch, args.gpt_batch, args.rounds = (32, 2, 2, 3) if quick else (32, 8, 8, 5)
    args.digits_batch = 16 if quick else 64
    from benchmarks.harness import Side, guarded, ratio_row

    def one(workload: str) -> list:
        times, chosen = measure(workload, args)
        what = f"{workload} ({_size(workload, args)})"
        note = f"auto ran as {chosen['auto']}, auto@units as {chosen['auto@units']}; staged in its main phase"
        targets = {"auto": "<= 1.02x", "auto@units": "<= 1.02x"}
        out = option_rows("precision", what, times, "fp32", note, targets)
        best = fastest_fixed(times)
        for option in ("auto", "auto@units"):
            ratios = [a / b for a, b in zip(times[option], times[best], strict=True)]
            auto, fixed = (Side(n, 1000 * statistics.median(times[n]), "ms") for n in (option, best))
            out.append(
                ratio_row(
                    "precision",
                    f"{what}: {option} vs fastest fixed",
                    ratios,
                    auto,
                    fixed,
                    f"{option}/{best} step time",
                    "<= 1.05x",
                    f"{option} ran as {chosen[option]}; fastest fixed format here: {best}",
                )
            )
        return out

    return [r for w in ("resnet50", "gpt", "digits") for r in guarded("precision", w, lambda w=w: one(w))]


def main() -> None:
    parser = arguments(gpt_batch=32, workloads="resnet50,gpt,digits")
    parser.add_argument("--digits-batch", type=int, default=64, help="digits CNN batch (the recipe's)")
    args = parser.parse_args()
    for workload in args.workloads.split(","):
        bench(workload, args)


if __name__ == "__main__":
    main()
