"""Stage 6: the verdict, the recommendation, export_report.json and the table on screen.

The accuracy drop of a stage is measured against torch fp32, the checkpoint's model in
eval mode. For classification it is in accuracy points: 98.7% -> 97.9% is 0.8. For
language models it is the rise of the validation loss in percent of torch fp32's loss. The
first stage whose drop exceeds the limit is the stage that lost it. A folded or fp32
ONNX stage also fails when its outputs differ from the exported torch model's, torch fp32
or torch pruned, by more than ``export.fp32_rtol`` of the largest output. That is an
export bug, not a rounding effect.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fwk.track.store import versions

if TYPE_CHECKING:
    from fwk.export.job import Built, Job
    from fwk.export.settings import PrunePlan

REPORT = "export_report.json"
HISTORY = "pruning_history.json"  # fwk/export/prune.py: the removals, to replay on a fresh model
TORCH, PRUNED, FOLDED, ONNX_FP32 = "torch fp32", "torch pruned", "folded", "onnx fp32"
ONNX_QAT = "onnx int8 qat"  # --qat-steps: int8 after quantization-aware training, beside PTQ's "onnx int8"


PRUNED_WEIGHTS = "pruned.pt"  # the pruned torch model's weights: replay pruning_history.json, then load


def _torch_row(name: str, model: Any) -> dict[str, Any]:
    state = model.state_dict().values()
    return {
        "stage": name,
        "artifact": None,
        "size_bytes": int(sum(t.numel() * t.element_size() for t in state)),
        "weights": int(sum(p.numel() for p in model.parameters())),
    }


def _weights_onnx(path: Path) -> int:
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return int(sum(np.prod(t.dims, dtype=np.int64) for t in model.graph.initializer))


def _onnx_row(name: str, path: Path) -> dict[str, Any]:
    return {"stage": name, "artifact": path.name, "size_bytes": path.stat().st_size, "weights": _weights_onnx(path)}


def stage_rows(job: Job, built: Built, latencies: dict[str, Any]) -> list[dict[str, Any]]:
    """Build the report's table: one row per stage with its size, quality, drop and latency.

    With QAT the better of the PTQ and QAT int8 models becomes ``built.final_path`` and goes
    last. The other is marked superseded.
    """
    task = job.task
    rows = [_torch_row(TORCH, job.source.model)]
    if built.pruned is not None:
        rows.append(_torch_row(PRUNED, built.model) | {"artifact": PRUNED_WEIGHTS})
    rows += [_torch_row(FOLDED, built.folded.model), _onnx_row(ONNX_FP32, built.fp32_path)]
    if built.final_path != built.fp32_path:
        rows.append(_onnx_row(f"onnx {job.quantize}", built.final_path))
    if built.qat_path is not None:
        rows.append(_onnx_row(ONNX_QAT, built.qat_path))
    for s in rows:
        qual = built.qualities[s["stage"]]
        if task != "lm":
            s["val_acc"] = qual.metric
        s.update(
            val_loss=qual.loss,
            agreement=qual.agreement,
            max_abs_diff=qual.max_abs_diff,
            rel_diff=qual.rel_diff,
            samples=qual.samples,
        )
        s["drop"] = drop(task, rows[0], s) if s is not rows[0] else 0.0
        if s["stage"] in latencies:
            s["latency_ms"] = {
                str(b): {"p50": v.p50_ms, "p90": v.p90_ms, "min": v.min_ms, "max": v.max_ms}
                for b, v in latencies[s["stage"]].items()
            }
    if built.qat_report is not None and built.qat_path is not None:
        ptq, qat_stage = rows[-2], rows[-1]
        if qat_stage["drop"] <= ptq["drop"]:
            built.final_path = built.qat_path
        else:
            rows[-2:] = [qat_stage, ptq]
        rows[-2]["superseded"] = True
        built.qat_report.update(qat_summary(task, ptq, qat_stage), final=built.final_path.name)
    return rows


def assemble(
    job: Job, built: Built, stages: list[dict[str, Any]], threads: int, load: dict[str, float]
) -> dict[str, Any]:
    """Return export_report.json's contents, with its verdict and recommendation.

    ``load`` is the load average before and after timing: above the core count, the
    latencies are noisy.
    """
    source, quantize, exported = job.source, job.quantize, built.exported
    report: dict[str, Any] = {
        "export_id": job.eid,
        "parent_run": source.run.id,
        "run_dir": str(source.run.path),
        "checkpoint": source.checkpoint.name,
        "step": source.step,
        "recipe": source.config.recipe,
        "model": getattr(source.config.model, "name", None) or source.config.model.get("_target_"),
        "task": job.task,
        "quantize": quantize,
        "prune": pruning(job.plan, built.pruned),
        "reference": built.reference,
        "max_accuracy_drop": job.max_drop,
        "metric": "val_loss" if job.task == "lm" else "val_acc",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(job.cfg),
        "threads": threads,
        "cpu": built.cpu,
        "reduce_range": built.reduce if quantize in ("int8", "dynamic_int8") else None,
        "folded_batchnorms": built.folded.folded,
        "exits": source.exits,  # the exits and threshold the model carries (fwk.export.exits), or None
        "onnx": {
            "exporter": "torch.export (non-strict) + torch.onnx.export(dynamo=True)",
            "opset": exported.opset,
            "dynamic_axes": exported.dynamic_axes,
            "external_data": exported.external_data,
            "nodes_exported": exported.nodes,
            "nodes_optimized": built.optimized.nodes_after,
        },
        "quantize_notes": built.notes,
        "seconds": job.seconds,
        "load_average": load,
        "stages": stages,
        "qat": built.qat_report,
        "final": built.final_path.name,
        "versions": versions(("torch", "torch-pruning", "onnx", "onnxscript", "onnxruntime")),
    }
    report["verdict"] = verdict(report)
    report["recommendation"] = recommendation(report)
    return report


def drop(task: str, reference: dict[str, Any], stage: dict[str, Any]) -> float:
    """Return the points of accuracy lost for classification, or the percent of loss gained for
    lm. A value above 0 is worse."""
    if task == "lm":
        return (stage["val_loss"] - reference["val_loss"]) / reference["val_loss"] * 100.0
    return (reference["val_acc"] - stage["val_acc"]) * 100.0


def _fp32(stage: dict[str, Any]) -> bool:
    return stage["stage"] in (FOLDED, ONNX_FP32)


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Give the verdict as {'passed': bool, 'stage': the first stage that failed or None,
    'reason': one line}."""
    task, limit, rtol = report["task"], report["max_accuracy_drop"], report["settings"]["fp32_rtol"]
    stages = report["stages"]
    ref = stages[0]
    exported = report.get("reference", TORCH)
    for s in stages[1:]:
        if s.get("superseded"):  # PTQ int8 when QAT's int8 is better (or the reverse): not delivered
            continue
        if _fp32(s) and s["rel_diff"] > rtol:
            return {
                "passed": False,
                "stage": s["stage"],
                "reason": (
                    f"stage '{s['stage']}' differs from {exported}: max |diff| {s['max_abs_diff']:.3g} is "
                    f"{s['rel_diff']:.2g} of the largest output, above export.fp32_rtol={rtol:g}"
                ),
            }
        d = s["drop"]
        if d > limit:
            lost = f"raised the validation loss by {d:.2f}%" if task == "lm" else f"lost {d:.2f} points of accuracy"
            return {
                "passed": False,
                "stage": s["stage"],
                "reason": (
                    f"stage '{s['stage']}' {lost} ({_metric_text(task, ref)} -> {_metric_text(task, s)} "
                    f"vs torch fp32), more than --max-accuracy-drop {limit:g}"
                ),
            }
    points = "point" if limit == 1 else "points"
    within = f"loss within {limit:g}% of" if task == "lm" else f"accuracy within {limit:g} {points} of"
    return {"passed": True, "stage": None, "reason": f"every stage's {within} torch fp32"}


def pruning(plan: PrunePlan, pruned: Any) -> dict[str, Any] | None:
    """Build the pruning section of the report: sizes before and after, and each round's retrain."""
    if pruned is None:
        return None
    return {
        **asdict(plan),
        "round_to": pruned.round_to,
        "before": pruned.before,
        "after": pruned.after,
        "params_left": pruned.after["params"] / pruned.before["params"],
        "macs_left": pruned.after["macs"] / pruned.before["macs"],
        "rounds_run": pruned.rounds,
        "history": HISTORY,
    }


def _metric_text(task: str, s: dict[str, Any]) -> str:
    return f"loss {s['val_loss']:.4f}" if task == "lm" else f"{s['val_acc'] * 100:.2f}%"


def recommendation(report: dict[str, Any]) -> dict[str, Any]:
    """Say which artifact to deploy on this machine, and why: int8 is not faster on every CPU."""
    stages = {s["stage"]: s for s in report["stages"]}
    fp32 = stages[ONNX_FP32]
    final = report["stages"][-1]
    if final is fp32:
        return {"artifact": fp32["artifact"], "why": "no quantization asked (--quantize none)"}
    batches = sorted(fp32["latency_ms"], key=int)
    ratios = {b: fp32["latency_ms"][b]["p50"] / final["latency_ms"][b]["p50"] for b in batches}
    smaller = fp32["size_bytes"] / final["size_bytes"]
    name, method = final["artifact"], report["quantize"]
    speed = ", ".join(f"{r:.2f}x at batch {b}" for b, r in ratios.items())
    cpu = report["cpu"]
    units = [n for n in ("vnni", "avx512", "amx") if cpu.get(n)]
    cpu_text = f"{cpu['capability']}, " + (f"with {'/'.join(u.upper() for u in units)}" if units else "no VNNI")
    if method == "fp16":  # int8 units say nothing about fp16 speed
        cpu_text = str(cpu["capability"])
    if all(r >= 1 for r in ratios.values()):
        return {"artifact": name, "why": f"{method} is faster than ONNX fp32 ({speed}) and {smaller:.1f}x smaller"}
    if all(r < 1 for r in ratios.values()):
        return {
            "artifact": fp32["artifact"],
            "why": (
                f"{method} is slower than ONNX fp32 on this CPU ({cpu_text}): speed {speed}; "
                f"{fp32['artifact']} is faster here, {name} is {smaller:.1f}x smaller"
            ),
        }
    fast = [b for b, r in ratios.items() if r >= 1]
    slow = [b for b, r in ratios.items() if r < 1]
    return {
        "artifact": name,
        "why": (
            f"{method} is faster than ONNX fp32 at batch {', '.join(fast)} but slower at batch {', '.join(slow)} "
            f"on this CPU ({cpu_text}): speed {speed}; use {fp32['artifact']} for batch {', '.join(slow)}; "
            f"{name} is {smaller:.1f}x smaller"
        ),
    }


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} K" if n >= 1e3 else str(n)


def table(report: dict[str, Any]):  # -> rich.table.Table
    from rich.table import Table

    task = report["task"]
    metric = "val loss" if task == "lm" else "val acc"
    delta = "loss +%" if task == "lm" else "drop (pts)"
    t = Table(
        title=f"export {report['export_id']} of run {report['parent_run']} ({report['checkpoint']}), "
        f"{report['stages'][0]['samples']} validation samples, {report['threads']} threads; "
        f"agreement and |diff| against {report.get('reference', TORCH)}",
        title_justify="left",
    )
    for col in ("stage", "file", "size", "weights", metric, delta, "agree", "max |diff|"):
        t.add_column(col, justify="left" if col in ("stage", "file") else "right")
    batches = sorted(report["stages"][0].get("latency_ms", {}), key=int)
    for b in batches:
        t.add_column(f"batch {b}: p50 / p90 ms (vs torch)", justify="right")
    torch_ms = report["stages"][0].get("latency_ms", {})
    for s in report["stages"]:
        value = f"{s['val_loss']:.4f}" if task == "lm" else f"{s['val_acc'] * 100:.2f}%"
        lat = s.get("latency_ms")
        cells = [
            f"{lat[b]['p50']:.2f} / {lat[b]['p90']:.2f} ({torch_ms[b]['p50'] / lat[b]['p50']:.2f}x)" if lat else "-"
            for b in batches
        ]
        t.add_row(
            s["stage"] + (" (not final)" if s.get("superseded") else ""),
            s.get("artifact") or "-",
            _size(s["size_bytes"]),
            _count(s["weights"]),
            value,
            "-" if s is report["stages"][0] else f"{s['drop']:+.2f}",
            f"{s['agreement'] * 100:.1f}%",
            f"{s['max_abs_diff']:.2g}",
            *cells,
        )
    return t


def exits_line(exits: dict[str, Any] | None) -> str | None:
    """Say which exits an export carries (``fwk.export.exits``), and where held-out rows leave it, or None."""
    if not exits:
        return None
    after = ", ".join(str(b) for b in exits["after_blocks"])
    line = (
        f"exits after blocks {after} of {exits['blocks']}, entropy threshold {exits['threshold']:.4g} nats: "
        f"{exits['rule']}"
    )
    alone = exits.get("held_out_alone_leave_at")
    if alone:
        line += f"; held-out rows, one at a time, leave at the exits and the end: {', '.join(map(str, alone))}"
    return line


def summary_lines(report: dict[str, Any], where: str) -> list[str]:
    v, r = report["verdict"], report["recommendation"]
    lines = []
    p = report.get("prune")
    if p:
        b, a = p["before"], p["after"]
        lines.append(
            f"pruned ({p['method']}, ratio {p['ratio']:g}, {p['rounds']} round(s)): parameters {_count(b['params'])} "
            f"-> {_count(a['params'])} ({p['params_left']:.1%} left), MACs {_count(b['macs'])} -> "
            f"{_count(a['macs'])} ({p['macs_left']:.1%} left); history in {p['history']}"
        )
    lines += [
        f"onnx: {report['onnx']['exporter']}, opset {report['onnx']['opset']}, dynamic axes "
        f"{', '.join(report['onnx']['dynamic_axes'])}; graph {report['onnx']['nodes_exported']} -> "
        f"{report['onnx']['nodes_optimized']} nodes (onnxscript optimizer)"
        + (f"; {report['folded_batchnorms']} BatchNorms folded" if report["folded_batchnorms"] else ""),
        *filter(None, [qat_line(report), exits_line(report.get("exits"))]),
        f"{'passed' if v['passed'] else 'FAILED'}: {v['reason']}",
        f"recommended here: {r['artifact']} ({r['why']})",
        f"export dir: {where}",
    ]
    return lines


def qat_summary(task: str, ptq: dict[str, Any], qat: dict[str, Any]) -> dict[str, Any]:
    """Put PTQ and QAT int8 side by side: their metric and QAT's gain, in accuracy points or %
    less loss."""
    if task == "lm":
        return {"ptq_loss": ptq["val_loss"], "qat_loss": qat["val_loss"], "gain": ptq["drop"] - qat["drop"]}
    return {"ptq_acc": ptq["val_acc"], "qat_acc": qat["val_acc"], "gain": (qat["val_acc"] - ptq["val_acc"]) * 100}


def qat_line(report: dict[str, Any]) -> str | None:
    q = report.get("qat")
    if not q:
        return None
    if not q["steps"]:
        return f"qat: {q['why']}"
    if "ptq_acc" in q:
        side = f"int8 PTQ {q['ptq_acc'] * 100:.2f}% vs QAT {q['qat_acc'] * 100:.2f}% ({q['gain']:+.2f} pts)"
    else:
        side = f"int8 PTQ loss {q['ptq_loss']:.4f} vs QAT {q['qat_loss']:.4f}"
    return f"qat: {q['steps']} steps, {side}, ranges learned in training; final: {q['final']}"
