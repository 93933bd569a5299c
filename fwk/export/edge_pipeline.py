"""``fwk export --format pte``: source -> prune -> fold -> capture -> int8 -> lower -> verify -> report.

The stages in front are the ONNX pipeline's own: ``--prune`` runs ``fwk.export.prune`` with the
same settings and retraining, and the Conv->BatchNorm pairs are folded (``fwk.export.fold``).
The back end is ExecuTorch (``fwk.export.edge``): with ``--quantize int8`` the program is
quantized by PT2E with the XNNPACK quantizer, calibrated on ``export.calib_batches`` training
batches, as ONNX's static int8 is.

The verification runs the ``.pte`` as a phone would, with ExecuTorch's runtime and no fwk
model code, in a fresh process (``python -m fwk.export.reload pte``), on the validation
split (``export.val_batches`` batches of ``export.batch_size``, at most ``export.max_batch``;
0: all of it). Against the
model it exported (the pruned one, when pruned) the accuracy (the loss, for language models)
may drop by ``--max-accuracy-drop`` at most, as ONNX's int8 may, and an fp32 program's outputs
may differ by ``TOLERANCE`` at most: XNNPACK's kernels sum in another order than torch's.

The export is ``runs/<id>/exports/<export-id>/`` with ``model.pte``, ``weights_report.json``
(which fwk serve reads) and ``export.log``, built in a temp dir and renamed into place whole;
a verification failure keeps the files, as ONNX's does.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from fwk.config.export_schema import ExportConfig
from fwk.export import report as rep
from fwk.export.job import Job
from fwk.export.settings import PrunePlan
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)

PTE = "model.pte"
TOLERANCE = 1e-4  # fp32: max abs difference of the outputs to the exported torch model


def _calibration(job: Job) -> Any:
    import torch

    from fwk.export import verify
    from fwk.export.source import training_sample

    rows = min(job.cfg.batch_size, job.cfg.max_batch)  # the captured program takes no more
    calib = training_sample(job.source, job.cfg.calib_batches * rows)
    return (torch.from_numpy(x) for x, _ in verify.batches(calib, rows))


def _program(job: Job) -> tuple[Any, Any]:
    """Prune (when asked), fold, capture and quantize (when asked); return the program and the pruning."""
    from fwk.export import capture, edge, fold, prune

    model, pruned, cfg = job.source.model, None, job.cfg
    if job.plan.method != "none":
        with job.stage("prune"):
            pruned = prune.prune(job.source, job.plan, cfg, job.out)
        model = pruned.model
    with job.stage("fold"):
        folded = fold.fold(model).model
    example = capture.example_input(job.source.data.val)
    target = "an ExecuTorch program"
    with job.stage("capture"):
        program = capture.capture(folded, example, job.task, job.log, target, max_batch=cfg.max_batch)
    if job.quantize == "int8":
        rows = min(cfg.batch_size, cfg.max_batch)
        logger.info(f"calibrating int8 ranges on {cfg.calib_batches} training batches of {rows}")
        with job.stage("quantize"):
            int8 = edge.quantized(program, _calibration(job), cfg.per_channel)
            program = capture.capture(int8, example, job.task, job.log, target, max_batch=cfg.max_batch)
    return program, pruned


def _verify(job: Job, path: Path, reference: Any) -> tuple[str, dict[str, Any]]:
    """Run the ``.pte`` in a fresh process on the validation batches; measure it and the torch
    model it was exported from on the same batches. Return the program's name and both measures."""
    import torch

    from fwk.export import verify
    from fwk.export.program import FreshProcess

    rows = min(job.cfg.batch_size, job.cfg.max_batch)  # the program takes no more
    val = list(verify.batches(job.source.data.val, rows, job.cfg.val_batches))
    outputs = FreshProcess("pte", path)([torch.from_numpy(x) for x, _ in val])
    # verify.quality calls each runner once per batch, in order: the program's outputs, replayed
    replayed = iter(o.numpy() for o in outputs)
    name = f"pte {job.quantize if job.quantize == 'int8' else 'fp32'}"
    runners = {"torch": verify.torch_runner(reference), name: lambda x: next(replayed)}
    measured = verify.quality(runners, "torch", iter(val), job.task)
    return name, {
        key: {
            **({"val_acc": q.metric} if job.task != "lm" else {}),
            "val_loss": q.loss,
            "agreement": q.agreement,
            "max_abs_diff": q.max_abs_diff,
            "samples": q.samples,
        }
        for key, q in measured.items()
    }


def failure(task: str, name: str, drop: float, max_drop: float, fp32_diff: float | None) -> str:
    """Return why the program fails its verification, or "" when it passes. ``drop`` is
    ``fwk.export.report.drop``'s; ``fp32_diff`` the max abs difference of an fp32 program, None for int8."""
    if drop > max_drop:
        unit = "% of the loss" if task == "lm" else " points of accuracy"
        return f"the {name} program lost {drop:.2f}{unit} (limit {max_drop:g}, --max-accuracy-drop)"
    if fp32_diff is not None and fp32_diff > TOLERANCE:
        return f"the fp32 program's outputs differ from torch's by {fp32_diff:.3g} (> {TOLERANCE:g})"
    return ""


def _build(job: Job) -> dict[str, Any]:
    """Run every stage, writing into ``job.out``, and return the report, also written there."""
    from fwk.export import edge
    from fwk.export.program import details
    from fwk.export.weights import REPORT

    with_what = f"--prune {job.plan.method} --ratio {job.plan.ratio:g} " if job.plan.method != "none" else ""
    source = job.source
    logger.info(
        f"exporting run {source.run.id} ({source.config.recipe}, {source.checkpoint.name}) to ExecuTorch "
        f"with {with_what}--quantize {job.quantize}"
    )
    program, pruned = _program(job)
    with job.stage("lower"):
        (job.out / PTE).write_bytes(edge.lower(program, job.log))
    reference = source.model if pruned is None else pruned.model
    logger.info("verifying the program with ExecuTorch's runtime in a fresh process, on the validation set")
    with job.stage("verify"):
        name, quality = _verify(job, job.out / PTE, reference)
    ref, got = quality["torch"], quality[name]
    drop, fp32, diff = rep.drop(job.task, ref, got), job.quantize != "int8", got["max_abs_diff"]
    reason = failure(job.task, name, drop, job.max_drop, diff if fp32 else None)
    files = [PTE] + ([rep.HISTORY] if pruned is not None else [])
    report = {
        "format": "pte",
        "run_id": source.run.id,
        "checkpoint": source.checkpoint.name,
        "step": source.step,
        "files": files,
        "quantize": job.quantize,
        "pruning": rep.pruning(job.plan, pruned),
        "reference": "torch pruned" if pruned is not None else "torch fp32",
        "quality": {"torch": ref, name: got},
        "drop": drop,
        "max_accuracy_drop": job.max_drop,
        "held_out": got["samples"],
        "max_abs_diff": diff,
        "tolerance": TOLERANCE if fp32 else None,
        "passed": not reason,
        "reason": reason,
        "size_bytes": (job.out / PTE).stat().st_size,
        "seconds": job.seconds,
        **details(source, edge.RUNTIME, PTE, job.cfg.max_batch),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (job.out / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def run_pte_export(
    run: RunDir,
    plan: PrunePlan,
    quantize: str,
    cfg: ExportConfig,
    max_drop: float,
    output: Path | None,
    overwrite: bool,
) -> dict[str, Any]:
    """Export ``run`` to ExecuTorch, or show its existing export. Raise VerificationFailed when
    the program lost too much."""
    from fwk.export.pipeline import VerificationFailed, built_whole, export_id, made, write_output
    from fwk.export.source import check_exportable, load
    from fwk.export.weights import REPORT

    checkpoint = check_exportable(run)
    eid = export_id(run, checkpoint, plan, quantize, cfg, max_drop, fmt="pte")
    final_dir = run.path / "exports" / eid
    report = made(run, final_dir, REPORT)
    if report is None:
        source = load(run, without="--format pte")
        build = lambda tmp, log: _build(Job(source, eid, plan, quantize, cfg, max_drop, tmp, log))  # noqa: E731
        report = built_whole(final_dir, REPORT, build)
    name = next(k for k in report["quality"] if k != "torch")
    ref, got = report["quality"]["torch"], report["quality"][name]
    what = "loss" if report["task"] == "lm" else "accuracy"
    key = "val_loss" if report["task"] == "lm" else "val_acc"
    logger.info(
        f"{name}: {PTE} ({report['size_bytes'] / 1e6:.2f} MB), run by ExecuTorch's runtime in a fresh process on "
        f"{report['held_out']} validation samples: {what} {got[key]:.4f} ({report['reference']} {ref[key]:.4f}), "
        f"max abs diff {report['max_abs_diff']:.3g}"
    )
    logger.info(f"export dir: {final_dir}")
    if not report["passed"]:
        raise VerificationFailed(f"{report['reason']}; files kept in {final_dir}")
    if output is not None:
        write_output(final_dir / PTE, output, overwrite)
        logger.info(f"wrote {output} ({PTE} of export {eid})")
    return report
