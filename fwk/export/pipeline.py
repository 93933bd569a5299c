"""The export pipeline: source -> prune -> fold -> ONNX -> optimize -> quantize -> verify -> report.

An export lives in ``runs/<run-id>/exports/<export-id>/``: the fp32 and the quantized
ONNX files, ``export_report.json`` (which names the parent run and checkpoint) and
``export.log`` (the exporter's own output; after a failure it stays beside the
export as ``<export-id>.export.log``). The export id is a hash of the parent run,
its checkpoint, the method, the settings, the accuracy limit and the code version: the
same command on the same code is the same export, shown again rather than redone.

It is built in a temp dir beside its final place and renamed when complete, so an
error leaves nothing half-written; a verification failure keeps every artifact, under
its final name, with the failed verdict in the report. ``--output`` gets a copy of the
final model only after it passed, written to a temp file and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fwk.config.schema import ExportConfig
from fwk.errors import UserError
from fwk.export import report as rep
from fwk.export.settings import PrunePlan
from fwk.track.store import RunDir, versions

logger = logging.getLogger(__name__)

PRUNED_WEIGHTS = "pruned.pt"  # the pruned torch model's weights: replay pruning_history.json, then load


class VerificationFailed(UserError):
    """The export ran, but a stage lost more than the limit: exit 1, artifacts kept."""

    exit_code = 1


def check_output(output: Path | None, overwrite: bool, folder: bool = False) -> None:
    """Refuse an --output that exists (unless --overwrite) or cannot be written, before any work;
    ``folder``: the output is a folder (--format hf), else a file."""
    if output is None:
        return
    if output.is_dir() and not folder:
        raise UserError(f"--output {output} is a directory; give a file path, e.g. {output / 'model.onnx'}")
    if output.exists() and not overwrite:
        raise UserError(f"--output {output} already exists; pass --overwrite to replace it, or choose another path")
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: folder {output.parent} does not exist; create it first")


def export_id(
    run: RunDir,
    checkpoint: Path,
    plan: PrunePlan,
    quantize: str,
    cfg: ExportConfig,
    max_drop: float,
    qat_steps: int | str = 0,
) -> str:
    from fwk.track.run_id import code_version

    payload = {
        "run": run.id,
        "checkpoint": checkpoint.name,
        "prune": asdict(plan),
        "quantize": quantize,
        "settings": asdict(cfg),
        "max_accuracy_drop": max_drop,
        "qat_steps": qat_steps,
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


def _weights_onnx(path: Path) -> int:
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return int(sum(np.prod(t.dims, dtype=np.int64) for t in model.graph.initializer))


def _build(
    source: Any,
    eid: str,
    plan: PrunePlan,
    quantize: str,
    cfg: ExportConfig,
    max_drop: float,
    out: Path,
    log: Path,
    qat_steps: int | str = 0,
) -> dict[str, Any]:
    """Every stage, writing into ``out``; returns the report (also written there)."""
    import numpy as np
    import torch

    from fwk.export import fold, optimize, prune, to_onnx, verify
    from fwk.export import quantize as quant
    from fwk.export.source import training_sample

    task = source.data.task
    seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        seconds[name] = round(time.perf_counter() - t0, 3)

    how = f"--prune {plan.method} --ratio {plan.ratio:g} --rounds {plan.rounds} " if plan.method != "none" else ""
    what = f"run {source.run.id} ({source.config.recipe}, {source.checkpoint.name})"
    logger.info(f"exporting {what} with {how}--quantize {quantize}")
    model, pruned = source.model, None
    if plan.method != "none":
        with stage("prune"):
            pruned = prune.prune(source, plan, cfg, out)
        model = pruned.model
        torch.save(model.state_dict(), out / PRUNED_WEIGHTS)
    raw_path, fp32_path = out / "exported.onnx", out / "fp32.onnx"
    with stage("fold"):
        folded = fold.fold(model)
    with stage("onnx"):
        exported = to_onnx.export_onnx(folded.model, to_onnx.example_input(source.data.val), task, raw_path, log)
    with stage("optimize"):
        optimized = optimize.optimize(raw_path, fp32_path)
    raw_path.unlink()  # the optimized file is the fp32 artifact

    final_path = fp32_path
    notes: list[str] = []
    cpu = verify.cpu_int8_features()
    reduce, why = quant.reduce_range(cfg.reduce_range, cpu)
    if quantize in ("int8", "dynamic_int8"):
        logger.info(why)
        notes.append(why)

    def calibration() -> Iterator[np.ndarray]:
        """The int8 calibration batches: the same ones for PTQ and for QAT's starting ranges."""
        calib = training_sample(source, cfg.calib_batches * cfg.batch_size)
        return (x for x, _ in verify.batches(calib, cfg.batch_size))

    if quantize != "none":
        dst = out / f"{quantize}.onnx"
        with stage("quantize"):
            if quantize == "int8":
                logger.info(f"calibrating int8 ranges on {cfg.calib_batches} training batches of {cfg.batch_size}")
                q = quant.static_int8(fp32_path, dst, calibration(), cfg.per_channel, reduce)
            elif quantize == "dynamic_int8":
                q = quant.dynamic_int8(fp32_path, dst, cfg.per_channel, reduce)
            else:
                q = quant.fp16(fp32_path, dst)
        final_path = q.path
        notes += q.notes

    threads = cfg.threads or verify.default_threads()
    onnx_name = f"onnx {quantize}"
    runners = {rep.TORCH: verify.torch_runner(source.model)}
    if pruned is not None:
        runners[rep.PRUNED] = verify.torch_runner(model)
    runners |= {
        rep.FOLDED: verify.torch_runner(folded.model),
        rep.ONNX_FP32: verify.ort_runner(fp32_path, threads),
    }
    if final_path != fp32_path:
        runners[onnx_name] = verify.ort_runner(final_path, threads)
    logger.info(f"verifying {len(runners)} models on the validation set")
    with stage("verify"):
        val = verify.batches(source.data.val, cfg.batch_size, cfg.val_batches)
        # output differences against the model that was exported: the pruned one, when pruned
        reference = rep.TORCH if pruned is None else rep.PRUNED
        qualities = verify.quality(runners, reference, val, task)

    # quantization-aware training (--qat-steps): a second int8 model, beside PTQ's
    qat_report, qat_path = None, None
    if quantize == "int8" and qat_steps != 0:
        from fwk.export import qat

        # what quantization lost: against the model it quantized (the pruned one, when pruned)
        ptq_drop = rep.drop(task, _measured(qualities[reference]), _measured(qualities[onnx_name]))
        steps, why = qat.decide_steps(qat_steps, ptq_drop, max_drop, source.config.train.max_steps, cfg.qat_frac)
        logger.info(why)
        qat_report = {"asked": qat_steps, "steps": steps, "why": why}
        if steps:
            with stage("qat"):
                trained = qat.train_and_quantize(source, folded.model, cfg, steps, reduce, calibration, out, log)
                qat_path = trained.path
            runners[rep.ONNX_QAT] = verify.ort_runner(qat_path, threads)
            with stage("verify qat"):
                val = verify.batches(source.data.val, cfg.batch_size, cfg.val_batches)
                fake = "torch fake-quant"  # the QAT model in torch: what the int8 model should compute
                pair = {name: runners[name] for name in {rep.TORCH, reference, rep.ONNX_QAT}}
                measured = verify.quality(pair | {fake: verify.torch_runner(trained.qat_model)}, reference, val, task)
                qualities[rep.ONNX_QAT] = measured[rep.ONNX_QAT]
            qat_report.update(
                ranges="learned: QAT's moving-average activation ranges as ORT TensorQuantOverrides",
                inputs_ranged=len(trained.learned.inputs),
                torch_fake_quant_metric=measured[fake].metric,
                retrain_eval=trained.summary.get("eval", {}),
            )
    timed = {k: v for k, v in runners.items() if k != rep.FOLDED}
    logger.info(f"timing {', '.join(timed)} at batch 1 and {cfg.latency_batch} ({threads} threads)")
    with stage("latency"):
        inputs = verify.latency_inputs(source.data.val, cfg.latency_batch)
        load_before = os.getloadavg()[0]
        lat = verify.latency(timed, inputs, threads, cfg.warmup, cfg.iterations)

    def torch_stage(name: str, model: torch.nn.Module) -> dict[str, Any]:
        state = model.state_dict().values()
        return {
            "stage": name,
            "artifact": None,
            "size_bytes": int(sum(t.numel() * t.element_size() for t in state)),
            "weights": int(sum(p.numel() for p in model.parameters())),
        }

    def onnx_stage(name: str, path: Path) -> dict[str, Any]:
        return {"stage": name, "artifact": path.name, "size_bytes": path.stat().st_size, "weights": _weights_onnx(path)}

    stages = [torch_stage(rep.TORCH, source.model)]
    if pruned is not None:
        stages.append(torch_stage(rep.PRUNED, model) | {"artifact": PRUNED_WEIGHTS})
    stages.append(torch_stage(rep.FOLDED, folded.model))
    stages.append(onnx_stage(rep.ONNX_FP32, fp32_path))
    if final_path != fp32_path:
        stages.append(onnx_stage(onnx_name, final_path))
    if qat_path is not None:
        stages.append(onnx_stage(rep.ONNX_QAT, qat_path))
    for s in stages:
        qual = qualities[s["stage"]]
        if task != "lm":
            s["val_acc"] = qual.metric
        s.update(
            val_loss=qual.loss,
            agreement=qual.agreement,
            max_abs_diff=qual.max_abs_diff,
            rel_diff=qual.rel_diff,
            samples=qual.samples,
        )
        s["drop"] = rep.drop(task, stages[0], s) if s is not stages[0] else 0.0
        if s["stage"] in lat:
            s["latency_ms"] = {
                str(b): {"p50": v.p50_ms, "p90": v.p90_ms, "min": v.min_ms, "max": v.max_ms}
                for b, v in lat[s["stage"]].items()
            }
    if qat_report is not None and qat_path is not None:
        # the better of PTQ and QAT int8 is the final model, last in the table; the other is superseded
        ptq, qat_stage = stages[-2], stages[-1]
        if qat_stage["drop"] <= ptq["drop"]:
            final_path = qat_path
        else:
            stages[-2:] = [qat_stage, ptq]
        stages[-2]["superseded"] = True
        qat_report.update(rep.qat_summary(task, ptq, qat_stage), final=final_path.name)

    report: dict[str, Any] = {
        "export_id": eid,
        "parent_run": source.run.id,
        "run_dir": str(source.run.path),
        "checkpoint": source.checkpoint.name,
        "step": source.step,
        "recipe": source.config.recipe,
        "model": getattr(source.config.model, "name", None) or source.config.model.get("_target_"),
        "task": task,
        "quantize": quantize,
        "prune": rep.pruning(plan, pruned),
        "reference": reference,
        "max_accuracy_drop": max_drop,
        "metric": "val_loss" if task == "lm" else "val_acc",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(cfg),
        "threads": threads,
        "cpu": cpu,
        "reduce_range": reduce if quantize in ("int8", "dynamic_int8") else None,
        "folded_batchnorms": folded.folded,
        "onnx": {
            "exporter": "torch.export (non-strict) + torch.onnx.export(dynamo=True)",
            "opset": exported.opset,
            "dynamic_axes": exported.dynamic_axes,
            "external_data": exported.external_data,
            "nodes_exported": exported.nodes,
            "nodes_optimized": optimized.nodes_after,
        },
        "quantize_notes": notes,
        "seconds": seconds,
        # other processes' load while timing: above the core count, latencies are noisy
        "load_average": {"before_timing": round(load_before, 2), "after_timing": round(os.getloadavg()[0], 2)},
        "stages": stages,
        "qat": qat_report,
        "final": final_path.name,
        "versions": versions(("torch", "torch-pruning", "onnx", "onnxscript", "onnxruntime")),
    }
    report["verdict"] = rep.verdict(report)
    report["recommendation"] = rep.recommendation(report)
    (out / rep.REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _measured(q: Any) -> dict[str, float]:
    """A verify.Quality as the fields of a report stage that rep.drop reads."""
    return {"val_loss": q.loss, "val_acc": q.metric}


def made(run: RunDir, final_dir: Path, name: str) -> dict[str, Any] | None:
    """The report (file ``name``) of the export already made at ``final_dir``, said in a line;
    None when there is none yet. Exports appear whole (renamed from a temp dir): a dir without
    its report was edited by hand, a UserError."""
    if (final_dir / name).is_file():
        report = json.loads((final_dir / name).read_text())
        logger.info(f"export {final_dir.name} of run {run.id} already exists ({report['created']}); showing its report")
        return report
    if final_dir.exists():
        raise UserError(f"{final_dir} exists but has no {name}; move it away and run the export again")
    return None


def write_output(src: Path, output: Path, overwrite: bool) -> None:
    """Copy the final model to --output: a temp file beside it, then one rename."""
    check_output(output, overwrite)  # again: it may have appeared while the export ran
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def run_export(
    run: RunDir,
    plan: PrunePlan,
    quantize: str,
    cfg: ExportConfig,
    max_drop: float,
    output: Path | None,
    overwrite: bool,
    show: Callable[[Any], None],
    qat_steps: int | str = 0,
) -> dict[str, Any]:
    """Export ``run`` (or show its existing export); raise VerificationFailed when a stage lost too much."""
    from fwk.components.best import BEST_DIR, read_best
    from fwk.export.source import check_exportable, load

    checkpoint = check_exportable(run)
    if checkpoint.parent.name == BEST_DIR:
        best = read_best(run.path) or {}
        logger.info(
            f"exporting run {run.id}'s best checkpoint: {best.get('metric')} {best.get('value', 0):.4g} "
            f"at {checkpoint.name}"
        )
    eid = export_id(run, checkpoint, plan, quantize, cfg, max_drop, qat_steps)
    final_dir = run.path / "exports" / eid
    report = made(run, final_dir, rep.REPORT)
    if report is None:
        source = load(run)
        final_dir.parent.mkdir(exist_ok=True)
        tmp = final_dir.parent / f".tmp-{eid}-{os.getpid()}"
        tmp.mkdir()
        # beside the export, not in the temp dir: after a failure the error line points at it
        log = final_dir.parent / f"{eid}.export.log"
        try:
            report = _build(source, eid, plan, quantize, cfg, max_drop, tmp, log, qat_steps)
            if log.exists():
                os.replace(log, tmp / "export.log")
            try:
                os.rename(tmp, final_dir)
            except OSError:  # the same export, run at the same time, finished first: keep that one
                if not (final_dir / rep.REPORT).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir, after an error; gone after the rename
    show(rep.table(report))
    for line in rep.summary_lines(report, str(final_dir)):
        logger.info(line)
    verdict = report["verdict"]
    if not verdict["passed"]:
        kept = ", ".join(sorted(p.name for p in final_dir.iterdir() if p.suffix in (".onnx", ".json", ".pt")))
        raise VerificationFailed(f"{verdict['reason']}; artifacts kept in {final_dir} ({kept})")
    if output is not None:
        if report["onnx"]["external_data"]:
            raise UserError(f"the model is over 2 GB and has its weights in a sidecar file; copy {final_dir} instead")
        write_output(final_dir / report["final"], output, overwrite)
        logger.info(f"wrote {output} ({report['final']} of export {eid})")
    return report
