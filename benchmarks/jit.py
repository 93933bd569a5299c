"""Steady-state step time with the JIT layer against eager, measured side by side.

    .venv/bin/python -m benchmarks.jit [--rounds 5] [--workloads gpt,resnet50]

For each workload three copies of the model (same init) run through fwk's TrainStep:
eager (jit=off), jit=compile (torch.compile inductor from the first step), and jit=auto
(eager until stable, then compiled; on CPU it keeps whichever is faster). Each is run
until settled (compiled, and auto decided), then timed in ``rounds`` interleaved steps;
medians are reported as ratios to eager, with the compile time (the first compiled step).
"""

from __future__ import annotations

import os
import tempfile

# the compile row is timed cold: a fresh inductor cache, and no graph caches (the auto row
# compiles the same kernels after it, so its time shows a warm compile)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fwk-bench-inductor-"))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    arguments,
    batch_for,
    config,
    device_arg,
    engine_step,
    interleaved_times,
    machine,
    option_rows,
)
from fwk.log import collected  # noqa: E402

MODES = {"eager": "off", "compile": "compile", "auto": "auto"}


def measure(workload: str, args):
    """Per-round seconds of each mode, compile seconds, and auto's verdict."""
    device = device_arg(args.device)
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    steps, compile_s, verdict = {}, {}, {}
    for label, mode in MODES.items():
        extra = [
            f"jit={mode}",
            "jit.min_remaining_s=0",
            "jit.max_trial_share=0",
            "precision=fp32",
            f"train.device={device.type}",
        ]
        cfg = config(workload, batch, args.image_size, extra)
        step, _, _, jit, _ = engine_step(cfg, device, batch, jit=True)
        x, y = batch_for(cfg, batch, device)
        i = 0
        with collected() as said:
            while i < 30 and (i < 2 or jit.state in ("eager", "trial")) and mode != "off":
                t0 = time.perf_counter()
                step(i, [(x, y)])
                if jit.compiled_at == i:
                    compile_s[label] = time.perf_counter() - t0
                i += 1
        verdict[label] = next((m for m in said if m.startswith("jit=auto keeps") or "back to eager" in m), "")
        steps[label] = lambda step=step, x=x, y=y, i=i: step(i, [(x, y)])
        steps[label]()  # one more warm-up step in the settled mode
    return interleaved_times(steps, args.rounds, device), compile_s, verdict


def bench(workload: str, args) -> None:
    device = device_arg(args.device)
    batch = args.batch if workload == "resnet50" else args.gpt_batch
    times, compile_s, verdict = measure(workload, args)
    medians = {label: statistics.median(ts) for label, ts in times.items()}
    size = f"{args.image_size} px, batch {batch}" if workload == "resnet50" else f"seq 128, batch {batch}"
    print(f"\n{workload} ({size}), {machine(device)}; median of {args.rounds} interleaved steps")
    print(f"{'mode':<8} {'ms/step':>9} {'vs eager':>9} {'compile s':>10}")
    for label in MODES:
        ratio = medians["eager"] / medians[label]
        spent = f"{compile_s[label]:10.1f}" if label in compile_s else f"{'-':>10}"
        print(f"{label:<8} {medians[label] * 1000:9.1f} {ratio:8.2f}x {spent}")
    if verdict["auto"]:
        print(f"auto said: {verdict['auto']}")
    print("(vs eager: eager time / mode time; > 1 is faster)")


def rows(quick: bool) -> list:
    """For the harness (make bench): the GPT only (ResNet-50's compile takes ~50 s on 2 cores)."""
    args = arguments(gpt_batch=32, workloads="").parse_args([])
    args.gpt_batch, args.rounds = (4, 3) if quick else (16, 5)
    torch._dynamo.config.recompile_limit = 16
    times, compile_s, verdict = measure("gpt", args)
    note = "; ".join(f"{k} compiled in {v:.0f} s" for k, v in compile_s.items()) + (
        f"; {verdict['auto']}" if verdict["auto"] else ""
    )
    return option_rows("jit", f"gpt (batch {args.gpt_batch})", times, "eager", note, {"auto": "<= 1.02x"})


def main() -> None:
    parser = arguments(gpt_batch=32, workloads="gpt,resnet50")
    parser.set_defaults(batch=8, image_size=64, rounds=7)
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = 16
    for workload in args.workloads.split(","):
        bench(workload, args)


if __name__ == "__main__":
    main()
