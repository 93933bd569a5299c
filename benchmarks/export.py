"""What `fwk export` buys: pruned + int8 ONNX vs int8 vs fp32 ONNX vs the torch.export program
(pt2) vs its AOTInductor package (aoti) vs ExecuTorch programs (pte fp32 and int8, XNNPACK)
vs torch eager fp32.

    .venv/bin/python -m benchmarks.export [--recipes digits_cnn,resnet_digits] [--rounds 8]

For each recipe: trains it with `fwk train recipe=NAME` (or finds the finished run: the
same command is the same run), exports it twice with `fwk export`'s own pipeline
(--quantize int8; then --prune lottery_ticket --ratio R --quantize int8, the export
group's defaults) and as --format pt2, aoti and pte (fp32 and int8), then times torch eager
fp32, the four ONNX models in onnxruntime, the two programs in torch and the two .pte files in
ExecuTorch's runtime (loaded as a user loads them: no model code), with the same intra-op
threads, at batch 1 and batch N: ``rounds`` interleaved rounds, each model several calls in a
row per round (after an untimed one); the median over all timed calls is shown with the
fastest and slowest. Accuracies and sizes come from the exports' reports (the whole
validation set).

Then ResNet-50 at 224 px (torchvision's, untrained: latency only, accuracy needs
ImageNet): torch eager fp32 against the same pruning ratio (magnitude, one shot) + int8.

The issue's targets: int8 >= 3.9x smaller than fp32 ONNX; pruned 0.5 + int8 >= 8x smaller
than the original fp32 model and >= 3.8x faster than torch eager fp32, with <= 1 point of
accuracy lost. Int8 speed depends on the CPU: without VNNI (AVX2 only) onnxruntime's
u8*s8 kernels gain little.
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
from fwk.export.settings import PrunePlan, load_settings
from fwk.export.source import load
from fwk.log import show
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
        raise RuntimeError(f"fwk train recipe={recipe} failed: {(out.stderr or out.stdout).strip()[-300:]}")
    return RunDir(runs / found.group(1))


def _ms(lat: verify.Latency) -> str:
    return f"{lat.p50_ms:.2f} ({lat.min_ms:.2f}-{lat.max_ms:.2f})"


def _kept(recipe: str, runs: Path, method: str) -> tuple[RunDir, dict, dict]:
    """--retime: the newest run of ``recipe`` under ``runs`` with an int8 export and a ``method``-pruned one."""
    import json

    for run in sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        config = run / "config.yaml"
        if not config.is_file() or f"recipe: {recipe}\n" not in config.read_text():
            continue
        reports = [json.loads(p.read_text()) for p in run.glob("exports/*/export_report.json")]
        plain = [r for r in reports if not r.get("prune") and r["quantize"] == "int8"]
        pruned = [r for r in reports if (r.get("prune") or {}).get("method") == method and r["quantize"] == "int8"]
        if plain and pruned:
            return RunDir(run), plain[-1], pruned[-1]
    raise SystemExit(f"--retime: no run of {recipe} under {runs} has an int8 export and a {method} one")


PROGRAMS = {"pt2 (torch.export)": "pt2", "aoti": "aoti"}  # runner name -> fwk export --format


def program_exports(run: RunDir) -> dict[str, tuple[Path, dict]]:
    """Make (or find) the run's pt2 and aoti exports; return each runner name's file and report."""
    import json

    from fwk.export.formats import get
    from fwk.export.weights import REPORT, run_weights_export

    made = {}
    for name, fmt in PROGRAMS.items():
        report = run_weights_export(run, get(fmt), None, False)
        for path in run.path.glob(f"exports/*/{REPORT}"):
            if json.loads(path.read_text()) == report:
                made[name] = (path.parent / report["final"], report)
    return made


EDGE = {"pte fp32": "none", "pte int8": "int8"}  # runner name -> fwk export --format pte --quantize
EDGE_REF = {"pte fp32": "onnx fp32", "pte int8": "onnx int8"}  # the ONNX model of the same math


def edge_exports(run: RunDir, batch: int) -> dict[str, tuple[Path, dict]]:
    """Make (or find) the run's ExecuTorch exports, fp32 and int8, planned for batches up to ``batch``."""
    from fwk.export.edge_pipeline import PTE, run_pte_export

    cfg = load_settings([f"export.max_batch={max(batch, 64)}"])
    made = {}
    for name, quantize in EDGE.items():
        report = run_pte_export(run, PrunePlan(), quantize, cfg, 100.0, None, False)
        (path,) = [p for p in run.path.glob(f"exports/*/{PTE}") if _same(p.parent, report)]
        made[name] = (path, report)
    return made


def _same(export: Path, report: dict) -> bool:
    import json

    from fwk.export.weights import REPORT

    return (export / REPORT).is_file() and json.loads((export / REPORT).read_text()) == report


def edge_runner(path: Path) -> verify.Runner:
    """A runner of a .pte file, run by ExecuTorch's runtime (``fwk.export.edge.loader``)."""
    import torch

    from fwk.export.edge import loader

    forward = loader(path)
    return lambda x: forward(torch.from_numpy(x)).numpy()


def program_runner(fmt: str, path: Path) -> verify.Runner:
    """A runner of a pt2 or aoti file, loaded by torch alone (``fwk.export.reload``)."""
    import torch

    from fwk.export.reload import loader

    module = loader(fmt, path)

    def run(x):
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return run


def measure(recipe: str, args: argparse.Namespace):
    """Train (or find) the run, export it twice, time the five models: everything the table shows."""
    if args.retime:  # time the exports made by an earlier run of this script, on a quieter machine
        run, report, pruned = _kept(recipe, args.runs, args.prune)
    else:
        run = trained_run(recipe, args.runs)
        cfg = load_settings([f"export.latency_batch={args.batch}", *args.export])
        quiet = lambda _: None  # noqa: E731
        report = run_export(run, PrunePlan(), "int8", cfg, 100.0, None, False, show=quiet)
        plan = PrunePlan.checked(args.prune, args.ratio, None)
        pruned = run_export(run, plan, "int8", cfg, 100.0, None, False, show=quiet)
    export = run.path / "exports" / report["export_id"]
    pexport = run.path / "exports" / pruned["export_id"]
    stages = {s["stage"]: s for s in report["stages"]}
    pstages = {s["stage"]: s for s in pruned["stages"]}
    stages |= {f"pruned {name}": pstages[name] for name in ("onnx fp32", "onnx int8")}
    source = load(run)
    threads = args.threads or verify.default_threads()
    runners = {
        "torch eager fp32": verify.torch_runner(source.model),
        "onnx fp32": verify.ort_runner(export / "fp32.onnx", threads),
        "onnx int8": verify.ort_runner(export / "int8.onnx", threads),
        "pruned onnx fp32": verify.ort_runner(pexport / "fp32.onnx", threads),
        "pruned onnx int8": verify.ort_runner(pexport / "int8.onnx", threads),
    }
    programs = program_exports(run)
    runners |= {name: program_runner(PROGRAMS[name], path) for name, (path, _) in programs.items()}
    for name, (path, made) in programs.items():  # torch fp32's math: checked against it at export, not re-scored
        stages[name] = {"size_bytes": path.stat().st_size, "max_abs_diff": made["max_abs_diff"]}
    for name, (path, made) in edge_exports(run, args.batch).items():
        runners[name] = edge_runner(path)
        scored = made["quality"][name]
        stages[name] = {"size_bytes": path.stat().st_size, "val_acc": scored["val_acc"], "drop": made["drop"]}
        stages[name]["max_abs_diff"] = made["max_abs_diff"]
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
    return run, report, pruned, stages, runners, lat, threads, (load_before, load_after)


def bench(recipe: str, args: argparse.Namespace) -> list[str]:
    run, report, pruned, stages, runners, lat, threads, (load_before, load_after) = measure(recipe, args)
    fp32_size = stages["onnx fp32"]["size_bytes"]
    torch_ms = lat["torch eager fp32"]
    p = pruned["prune"]
    rows = [
        "",
        f"### {recipe} (run {run.id}, {report['checkpoint']}; exports {report['export_id']} and "
        f"{pruned['export_id']}; {stages['torch fp32']['samples']} validation samples)",
        "",
        f"pruned: --prune {p['method']} --ratio {p['ratio']:g} --rounds {p['rounds']}: parameters "
        f"{p['params_left']:.1%} left, MACs {p['macs_left']:.1%} left; "
        + "; ".join(f"round {r['round']}: {r['steps']} steps" for r in p["rounds_run"])
        + f"; export took {sum(pruned['seconds'].values()):.0f} s",
        "",
        f"| model | size | vs fp32 ONNX | val acc | drop (pts) | batch 1 ms p50 (min-max) | vs torch "
        f"| batch {args.batch} ms p50 (min-max) | vs torch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in runners:
        s = stages["torch fp32" if name == "torch eager fp32" else name]
        size = s["size_bytes"]
        b1, bn = lat[name][1], lat[name][args.batch]
        smaller = "-" if name.startswith("torch") else f"{fp32_size / size:.2f}x smaller"
        acc, drop = (
            (f"{s['val_acc'] * 100:.2f}%", f"{s['drop']:+.2f}")
            if "val_acc" in s
            else (f"torch's (max abs diff {s['max_abs_diff']:.1g})", "-")
        )
        rows.append(
            f"| {name} | {size / 1e6:.2f} MB | {smaller} | {acc} "
            f"| {drop} | {_ms(b1)} | {torch_ms[1].p50_ms / b1.p50_ms:.2f}x | {_ms(bn)} "
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


def resnet50(args: argparse.Namespace) -> list[str]:
    """Latency of ResNet-50 at 224 px: torch eager fp32 vs pruned (same ratio, magnitude) + int8 in onnxruntime."""
    import tempfile

    import numpy as np
    import torch
    import torchvision

    from fwk.export import fold, optimize, prune, quantize, to_onnx

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    x = torch.randn(2, 3, 224, 224)
    before = prune.count(model, x[:1])
    slim = torchvision.models.resnet50().eval()
    slim.load_state_dict(model.state_dict())
    prune.prune_round(slim, x[:1], "magnitude", args.ratio, 8)
    after = prune.count(slim, x[:1])
    threads = args.threads or verify.default_threads()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        to_onnx.export_onnx(fold.fold(slim).model, x, "classification", d / "raw.onnx", d / "log")
        optimize.optimize(d / "raw.onnx", d / "fp32.onnx")
        calib = (np.random.default_rng(i).standard_normal((4, 3, 224, 224), dtype=np.float32) for i in range(4))
        reduce, _ = quantize.reduce_range("auto", verify.cpu_int8_features())
        quantize.static_int8(d / "fp32.onnx", d / "int8.onnx", calib, True, reduce)
        sizes = {name: (d / f"{name}.onnx").stat().st_size for name in ("fp32", "int8")}
        runners = {
            "torch eager fp32": verify.torch_runner(model),
            "pruned onnx fp32": verify.ort_runner(d / "fp32.onnx", threads),
            "pruned onnx int8": verify.ort_runner(d / "int8.onnx", threads),
        }
        inputs = {
            b: np.random.default_rng(b).standard_normal((b, 3, 224, 224), dtype=np.float32)
            for b in (1, args.resnet50_batch)
        }
        rounds = max(2, args.rounds // 2)
        lat = verify.latency(runners, inputs, threads, warmup=1, iterations=rounds * 2, rounds=rounds)
    torch_size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    ref = lat["torch eager fp32"]
    rows = [
        "",
        f"### ResNet-50, 224 px (torchvision, untrained: latency only; --prune magnitude --ratio {args.ratio:g}: "
        f"parameters {after['params'] / before['params']:.1%} left, MACs {after['macs'] / before['macs']:.1%} left)",
        "",
        f"| model | size | vs torch fp32 | batch 1 ms p50 (min-max) | vs torch | batch {args.resnet50_batch} ms p50 "
        "(min-max) | vs torch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, size in (
        ("torch eager fp32", torch_size),
        ("pruned onnx fp32", sizes["fp32"]),
        ("pruned onnx int8", sizes["int8"]),
    ):
        b1, bn = lat[name][1], lat[name][args.resnet50_batch]
        rows.append(
            f"| {name} | {size / 1e6:.1f} MB | {torch_size / size:.2f}x smaller | {_ms(b1)} | "
            f"{ref[1].p50_ms / b1.p50_ms:.2f}x | {_ms(bn)} | {ref[args.resnet50_batch].p50_ms / bn.p50_ms:.2f}x |"
        )
    return rows


def rows(quick: bool) -> list:
    """For the harness (make bench): digits_cnn only (resnet_digits' lottery-ticket export takes
    minutes on 2 cores), trained and exported into a temporary runs root."""
    import tempfile

    from benchmarks.harness import Row, Side, check

    with tempfile.TemporaryDirectory(prefix="fwk-bench-export-") as tmp:
        args = parser().parse_args(["--runs", tmp, "--rounds", "3" if quick else "6", "--per-round", "3"])
        run, report, pruned, stages, runners, lat, threads, _ = measure("digits_cnn", args)
    torch_ms = lat["torch eager fp32"]
    out = []
    torch_size = stages["torch fp32"]["size_bytes"]

    def size(name: str, target: str) -> Row:
        s, r = stages[name], torch_size / stages[name]["size_bytes"]
        return Row(
            "export",
            f"digits_cnn {name} size",
            "torch fp32/model bytes",
            r,
            r,
            r,
            Side(name, s["size_bytes"] / 1e6, "MB"),
            Side("torch fp32", torch_size / 1e6, "MB"),
            target,
            check(r, target),
            f"val acc {s['val_acc'] * 100:.1f}% (drop {s['drop']:+.2f} pts)",
        )

    for name, target_speed in (("onnx int8", ""), ("pruned onnx int8", ">= 3.8x")):
        s = stages[name]
        for b in (1, args.batch):
            r = torch_ms[b].p50_ms / lat[name][b].p50_ms
            rounds = [t / m for t, m in zip(torch_ms[b].round_p50_ms, lat[name][b].round_p50_ms, strict=True)]
            tgt = target_speed if b == 1 else ""
            out.append(
                Row(
                    "export",
                    f"digits_cnn {name} vs torch eager fp32, batch {b}",
                    "torch ms/model ms (speed)",
                    r,
                    min(rounds),
                    max(rounds),
                    Side(name, lat[name][b].p50_ms, "ms p50"),
                    Side("torch fp32", torch_ms[b].p50_ms, "ms p50"),
                    tgt,
                    check(r, tgt),
                    f"{threads} threads; ratio of p50s over {len(rounds)} interleaved rounds [min, max of the rounds' "
                    f"ratios]; acc drop {s['drop']:+.2f} pts",
                )
            )
        out.append(size(name, ">= 8x" if name.startswith("pruned") else ""))

    def speed(name: str, ref: str, b: int, notes: str) -> Row:
        r = lat[ref][b].p50_ms / lat[name][b].p50_ms
        rounds = [t / m for t, m in zip(lat[ref][b].round_p50_ms, lat[name][b].round_p50_ms, strict=True)]
        return Row(
            "export",
            f"digits_cnn {name} vs {ref}, batch {b}",
            f"{ref} ms/{name} ms (speed)",
            r,
            min(rounds),
            max(rounds),
            Side(name, lat[name][b].p50_ms, "ms p50"),
            Side(ref, lat[ref][b].p50_ms, "ms p50"),
            "",
            None,
            f"{threads} threads; ratio of p50s over {len(rounds)} interleaved rounds; {notes}",
        )

    for name in PROGRAMS:  # the compiled programs against eager torch and the fp32 ONNX model of the same run
        for ref in ("torch eager fp32", "onnx fp32"):
            for b in (1, args.batch):
                out.append(speed(name, ref, b, f"outputs within {stages[name]['max_abs_diff']:.1g} of torch's"))
    for name in EDGE:  # ExecuTorch (XNNPACK) against eager torch and the ONNX model of the same math
        s = stages[name]
        scored = f"val acc {s['val_acc'] * 100:.1f}% (drop {s['drop']:+.2f} pts)"
        for ref in ("torch eager fp32", EDGE_REF[name]):
            for b in (1, args.batch):
                out.append(speed(name, ref, b, f"ExecuTorch's runtime; {scored}"))
        out.append(size(name, ""))
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="digits_cnn,resnet_digits")
    parser.add_argument("--runs", type=Path, default=Path(os.environ.get("FWK_RUNS") or "runs"))
    parser.add_argument("--batch", type=int, default=32, help="batch N of the second latency column")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--per-round", type=int, default=5, help="timed calls of each model per round")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads; 0 = the cores fwk may use")
    parser.add_argument("--prune", default="lottery_ticket", help="pruning method of the pruned export")
    parser.add_argument("--ratio", type=float, default=0.5, help="pruning ratio of the pruned export and ResNet-50")
    parser.add_argument("--export", nargs="*", default=[], help="export.KEY=VALUE settings of both exports")
    parser.add_argument("--retime", action="store_true", help="time the exports an earlier run of this made")
    parser.add_argument("--resnet50-batch", type=int, default=8, help="batch N of ResNet-50's latency (0 = skip)")
    return parser


def main() -> None:
    args = parser().parse_args()
    show("stderr")  # the export's progress lines; stdout holds the table
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
    if args.resnet50_batch:
        lines += resnet50(args)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
