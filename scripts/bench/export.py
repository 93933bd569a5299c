"""What `fwk export` buys: int8 ONNX vs fp32 ONNX vs torch eager fp32, on two recipes.

    .venv/bin/python scripts/bench/export.py [--recipes digits_cnn,resnet_digits] [--rounds 8]

For each recipe: trains it with `fwk train recipe=NAME` (or finds the finished run: the
same command is the same run), exports it with `fwk export`'s own pipeline (--quantize
int8, the export group's defaults), then times torch eager fp32, the fp32 ONNX model and
the int8 ONNX model in onnxruntime, with the same intra-op threads, at batch 1 and batch
N: ``rounds`` interleaved rounds, each model several calls in a row per round (after an
untimed one); the median over all timed calls is shown with the fastest and slowest.
Accuracies and sizes come from the export's report (the whole validation set).

The issue's targets (with structured pruning, a later slice): int8 >= 3.9x smaller than
fp32 ONNX, >= 3.8x faster than torch eager fp32, <= 1 point of accuracy lost. Int8 speed
depends on the CPU: without VNNI (AVX2 only) onnxruntime's u8*s8 kernels gain little.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from fwk.export import report as rep
from fwk.export import verify
from fwk.export.pipeline import run_export
from fwk.export.settings import load_settings
from fwk.export.source import load
from fwk.track.store import RunDir


def trained_run(recipe: str, runs: Path) -> RunDir:
    """The finished run of `fwk train recipe=NAME` under ``runs`` (trained now if needed)."""
    env = {**os.environ, "FWK_RUNS": str(runs)}
    print(f"training (or finding) {recipe} under {runs} ...", file=sys.stderr, flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "fwk", "train", f"recipe={recipe}"], env=env, capture_output=True, text=True
    )
    found = re.search(r"run ([0-9a-f]{10}) (?:complete|is already complete)", out.stdout)
    if out.returncode != 0 or not found:
        raise SystemExit(f"fwk train recipe={recipe} failed:\n{out.stdout}\n{out.stderr}")
    return RunDir(runs / found.group(1))


def _ms(lat: verify.Latency) -> str:
    return f"{lat.p50_ms:.2f} ({lat.min_ms:.2f}-{lat.max_ms:.2f})"


def bench(recipe: str, args: argparse.Namespace) -> list[str]:
    run = trained_run(recipe, args.runs)
    cfg = load_settings([f"export.latency_batch={args.batch}"])
    quiet = lambda _: None  # noqa: E731
    report = run_export(run, "int8", cfg, 100.0, None, False, say=lambda s: print(s, file=sys.stderr), show=quiet)
    export = run.path / "exports" / report["export_id"]
    stages = {s["stage"]: s for s in report["stages"]}
    source = load(run)
    threads = args.threads or verify.default_threads()
    runners = {
        "torch eager fp32": verify.torch_runner(source.model),
        "onnx fp32": verify.ort_runner(export / "fp32.onnx", threads),
        "onnx int8": verify.ort_runner(export / "int8.onnx", threads),
    }
    load_before = os.getloadavg()[0]
    lat = verify.latency(
        runners,
        verify.latency_inputs(source.data.val, args.batch),
        threads,
        warmup=3,
        iterations=args.rounds * args.per_round,
        rounds=args.rounds,
    )
    load_after = os.getloadavg()[0]
    fp32_size = stages["onnx fp32"]["size_bytes"]
    torch_ms = lat["torch eager fp32"]
    rows = [
        "",
        f"### {recipe} (run {run.id}, {report['checkpoint']}; export {report['export_id']}; "
        f"{stages['torch fp32']['samples']} validation samples)",
        "",
        f"| model | size | vs fp32 ONNX | val acc | drop (pts) | batch 1 ms p50 (min-max) | vs torch "
        f"| batch {args.batch} ms p50 (min-max) | vs torch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, stage in (("torch eager fp32", "torch fp32"), ("onnx fp32", "onnx fp32"), ("onnx int8", "onnx int8")):
        s = stages[stage]
        size = s["size_bytes"]
        b1, bn = lat[name][1], lat[name][args.batch]
        smaller = "-" if name.startswith("torch") else f"{fp32_size / size:.2f}x smaller"
        rows.append(
            f"| {name} | {size / 1e6:.2f} MB | {smaller} | {s['val_acc'] * 100:.2f}% "
            f"| {s['drop']:+.2f} | {_ms(b1)} | {torch_ms[1].p50_ms / b1.p50_ms:.2f}x | {_ms(bn)} "
            f"| {torch_ms[args.batch].p50_ms / bn.p50_ms:.2f}x |"
        )
    for name, stage in (("onnx fp32", "onnx fp32"), ("onnx int8", "onnx int8")):  # this run's timings decide
        stages[stage]["latency_ms"] = {str(b): {"p50": v.p50_ms} for b, v in lat[name].items()}
    advice = rep.recommendation(report)
    rows += [
        "",
        f"{threads} threads; int8: {'; '.join(report['quantize_notes'])}; load average "
        f"{load_before:.2f} -> {load_after:.2f} while timing (other processes on the machine).",
        f"recommended here: {advice['artifact']} ({advice['why']})",
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="digits_cnn,resnet_digits")
    parser.add_argument("--runs", type=Path, default=Path(os.environ.get("FWK_RUNS") or "runs"))
    parser.add_argument("--batch", type=int, default=32, help="batch N of the second latency column")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--per-round", type=int, default=5, help="timed calls of each model per round")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads; 0 = the cores fwk may use")
    args = parser.parse_args()
    import onnxruntime
    import torch

    cpu = verify.cpu_int8_features()
    units = ", ".join(k.upper() for k in ("vnni", "avx512", "amx") if cpu[k]) or "no VNNI/AVX512/AMX"
    lines = [
        f"fwk export benchmark: CPU {cpu['capability']} ({units}), torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}; median of {args.rounds} interleaved rounds x {args.per_round} calls",
    ]
    for recipe in args.recipes.split(","):
        lines += bench(recipe, args)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
