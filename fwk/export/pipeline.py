"""The export pipeline: source -> prune -> fold -> ONNX -> optimize -> quantize -> verify -> report.

An export lives in ``runs/<run-id>/exports/<export-id>/``. It holds the fp32 and the quantized
ONNX files, ``export_report.json``, which names the parent run and checkpoint, and
``export.log``, the exporter's own output. After a failure that log stays beside the
export as ``<export-id>.export.log``. The export id is a hash of the parent run,
its checkpoint, the method, the settings, the accuracy limit and the code version: the
same command on the same code is the same export, shown again rather than redone.

It is built in a temp dir beside its final place and renamed when complete, so an
error leaves nothing half-written. A verification failure keeps every artifact, under
its final name, with the failed verdict in the report. ``--output`` gets a copy of the
final model only after it passed, written to a temp file and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fwk.config.export_schema import ExportConfig
from fwk.errors import UserError
from fwk.export import report as rep
from fwk.export.job import Built, Job
from fwk.export.settings import PrunePlan
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)


class VerificationFailed(UserError):
    """An error for an export that ran but lost more than the limit in a stage. It exits 1 and
    keeps the artifacts."""

    exit_code = 1


def check_output(output: Path | None, overwrite: bool, writes: tuple[str, ...], folder: bool = False) -> None:
    """Refuse an --output that exists, unless --overwrite is given and it is an earlier export
    (``fwk.export.replace``), or that cannot be written, before any work. ``writes`` holds the
    name patterns of what the format writes; ``folder`` says the output is a folder (--format hf)."""
    from fwk.export.replace import check_replaceable

    if output is None:
        return
    if output.is_dir() and not folder:
        raise UserError(f"--output {output} is a directory; give a file path, e.g. {output / 'model.onnx'}")
    if (output.exists() or output.is_symlink()) and not overwrite:
        raise UserError(f"--output {output} already exists; pass --overwrite to replace it, or choose another path")
    if output.exists() or output.is_symlink():
        check_replaceable(output, writes, folder)
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
    fmt: str = "onnx",
    exits: bool = False,
) -> str:
    from fwk.track.run_id import code_version

    payload = {
        "format": fmt,
        "run": run.id,
        "checkpoint": checkpoint.name,
        "prune": asdict(plan),
        "quantize": quantize,
        "settings": asdict(cfg),
        "max_accuracy_drop": max_drop,
        "qat_steps": qat_steps,
        "exits": exits,
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


def _build(job: Job) -> dict[str, Any]:
    """Run every stage, writing into ``job.out``, and return the report, also written there."""
    plan, quantize = job.plan, job.quantize
    how = f"--prune {plan.method} --ratio {plan.ratio:g} --rounds {plan.rounds} " if plan.method != "none" else ""
    what = f"run {job.source.run.id} ({job.source.config.recipe}, {job.source.checkpoint.name})"
    logger.info(f"exporting {what} with {how}--quantize {quantize}")
    from fwk.export import verify

    built = _convert(job)
    _quantize(job, built)
    threads = job.cfg.threads or verify.default_threads()
    runners = _runners(job, built, threads)
    _verify(job, built, runners)
    if quantize == "int8" and job.qat_steps != 0:
        _qat(job, built, runners, threads)
    timed = {k: v for k, v in runners.items() if k != rep.FOLDED}
    logger.info(f"timing {', '.join(timed)} at batch 1 and {job.cfg.latency_batch} ({threads} threads)")
    with job.stage("latency"):
        inputs = verify.latency_inputs(job.source.data.val, job.cfg.latency_batch)
        load_before = os.getloadavg()[0]
        latencies = verify.latency(timed, inputs, threads, job.cfg.warmup, job.cfg.iterations)
    load = {"before_timing": round(load_before, 2), "after_timing": round(os.getloadavg()[0], 2)}
    report = rep.assemble(job, built, rep.stage_rows(job, built, latencies), threads, load)
    if job.source.exits:
        report["exits"] = job.source.exits | {"held_out_alone_leave_at": _leaving_alone(job)}
    (job.out / rep.REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _leaving_alone(job: Job) -> list[int]:
    """How many validation samples, each sent alone, leave the exported graph at each exit and at the end."""
    import torch

    from fwk.export import verify

    counts = [0] * (len(job.source.exits["after_blocks"]) + 1)
    for x, _ in verify.batches(job.source.data.val, job.cfg.batch_size, job.cfg.val_batches):
        counts = [a + b for a, b in zip(counts, job.source.model.alone(torch.as_tensor(x)), strict=True)]
    return counts


def _convert(job: Job) -> Built:
    """Prune (when asked), fold the batch norms, export to ONNX and optimize the graph."""
    import torch

    from fwk.export import capture, fold, optimize, prune, to_onnx, verify
    from fwk.export import quantize as quant

    model, pruned = job.source.model, None
    if job.plan.method != "none":
        with job.stage("prune"):
            pruned = prune.prune(job.source, job.plan, job.cfg, job.out)
        model = pruned.model
        torch.save(model.state_dict(), job.out / rep.PRUNED_WEIGHTS)
    raw_path, fp32_path = job.out / "exported.onnx", job.out / "fp32.onnx"
    with job.stage("fold"):
        folded = fold.fold(model)
    with job.stage("onnx"):
        example = capture.example_input(job.source.data.val)
        exported = to_onnx.export_onnx(folded.model, example, job.task, raw_path, job.log)
    with job.stage("optimize"):
        optimized = optimize.optimize(raw_path, fp32_path)
    raw_path.unlink()  # the optimized file is the fp32 artifact
    cpu = verify.cpu_int8_features()
    reduce, why = quant.reduce_range(job.cfg.reduce_range, cpu)
    built = Built(model, pruned, folded, exported, optimized, fp32_path, fp32_path, cpu, reduce)
    if job.quantize in ("int8", "dynamic_int8"):
        logger.info(why)
        built.notes.append(why)
    return built


def _calibration(job: Job) -> Iterator[Any]:
    """Yield the int8 calibration batches: the same ones for PTQ and for QAT's starting ranges."""
    from fwk.export import verify
    from fwk.export.source import training_sample

    calib = training_sample(job.source, job.cfg.calib_batches * job.cfg.batch_size)
    return (x for x, _ in verify.batches(calib, job.cfg.batch_size))


def _quantize(job: Job, built: Built) -> None:
    """Write ``--quantize``'s model beside the fp32 one. It becomes the final model."""
    from fwk.export import quantize as quant

    if job.quantize == "none":
        return
    cfg, dst = job.cfg, job.out / f"{job.quantize}.onnx"
    with job.stage("quantize"):
        if job.quantize == "int8":
            logger.info(f"calibrating int8 ranges on {cfg.calib_batches} training batches of {cfg.batch_size}")
            q = quant.static_int8(built.fp32_path, dst, _calibration(job), cfg.per_channel, built.reduce)
        elif job.quantize == "dynamic_int8":
            q = quant.dynamic_int8(built.fp32_path, dst, cfg.per_channel, built.reduce)
        else:
            q = quant.fp16(built.fp32_path, dst)
    built.final_path = q.path
    built.notes += q.notes


def _runners(job: Job, built: Built, threads: int) -> dict[str, Callable[..., Any]]:
    """Return a runner for each stage's model, in the order of the report's table."""
    from fwk.export import verify

    runners = {rep.TORCH: verify.torch_runner(job.source.model)}
    if built.pruned is not None:
        runners[rep.PRUNED] = verify.torch_runner(built.model)
    runners |= {
        rep.FOLDED: verify.torch_runner(built.folded.model),
        rep.ONNX_FP32: verify.ort_runner(built.fp32_path, threads),
    }
    if built.final_path != built.fp32_path:
        runners[f"onnx {job.quantize}"] = verify.ort_runner(built.final_path, threads)
    return runners


def _verify(job: Job, built: Built, runners: dict[str, Callable[..., Any]]) -> None:
    """Measure every stage on the validation set.

    Output differences are measured against the model that was exported, which is the pruned
    one when pruned: pruning is meant to change the outputs, the later stages are not.
    """
    from fwk.export import verify

    logger.info(f"verifying {len(runners)} models on the validation set")
    with job.stage("verify"):
        val = verify.batches(job.source.data.val, job.cfg.batch_size, job.cfg.val_batches)
        built.reference = rep.TORCH if built.pruned is None else rep.PRUNED
        built.qualities = verify.quality(runners, built.reference, val, job.task)


def _qat(job: Job, built: Built, runners: dict[str, Callable[..., Any]], threads: int) -> None:
    """Train a second int8 model with quantization-aware training (--qat-steps), beside PTQ's."""
    from fwk.export import qat, verify

    source, cfg, reference = job.source, job.cfg, built.reference
    # what quantization lost: against the model it quantized (the pruned one, when pruned)
    ptq_drop = rep.drop(job.task, _measured(built.qualities[reference]), _measured(built.qualities["onnx int8"]))
    steps, why = qat.decide_steps(job.qat_steps, ptq_drop, job.max_drop, source.config.train.max_steps, cfg.qat_frac)
    logger.info(why)
    built.qat_report = {"asked": job.qat_steps, "steps": steps, "why": why}
    if not steps:
        return
    with job.stage("qat"):
        calibration = lambda: _calibration(job)  # noqa: E731
        trained = qat.train_and_quantize(
            source, built.folded.model, cfg, steps, built.reduce, calibration, job.out, job.log
        )
        built.qat_path = trained.path
    runners[rep.ONNX_QAT] = verify.ort_runner(built.qat_path, threads)
    with job.stage("verify qat"):
        val = verify.batches(source.data.val, cfg.batch_size, cfg.val_batches)
        fake = "torch fake-quant"  # the QAT model in torch: what the int8 model should compute
        pair = {name: runners[name] for name in {rep.TORCH, reference, rep.ONNX_QAT}}
        measured = verify.quality(pair | {fake: verify.torch_runner(trained.qat_model)}, reference, val, job.task)
        built.qualities[rep.ONNX_QAT] = measured[rep.ONNX_QAT]
    built.qat_report.update(
        ranges="learned: QAT's moving-average activation ranges as ORT TensorQuantOverrides",
        inputs_ranged=len(trained.learned.inputs),
        torch_fake_quant_metric=measured[fake].metric,
        retrain_eval=trained.summary.get("eval", {}),
    )


def _measured(q: Any) -> dict[str, float]:
    """Turn a verify.Quality into the fields of a report stage that rep.drop reads."""
    return {"val_loss": q.loss, "val_acc": q.metric}


def made(run: RunDir, final_dir: Path, name: str) -> dict[str, Any] | None:
    """Return the report of the export already made at ``final_dir``, read from file ``name``
    and said in a line. Return None when there is none yet. Exports appear whole, renamed from
    a temp dir, so a dir without its report was edited by hand: that is a UserError."""
    if (final_dir / name).is_file():
        report = json.loads((final_dir / name).read_text())
        logger.info(f"export {final_dir.name} of run {run.id} already exists ({report['created']}); showing its report")
        return report
    if final_dir.exists():
        raise UserError(f"{final_dir} exists but has no {name}; move it away and run the export again")
    return None


def built_whole(final_dir: Path, name: str, build: Callable[[Path, Path], dict[str, Any]]) -> dict[str, Any]:
    """Run ``build(tmp, log)``, which writes an export into the temp dir ``tmp`` and returns its
    report (file ``name``), then rename the dir to ``final_dir``, the exporter's log moved in as
    ``export.log``. The log is kept beside the export, not in the temp dir, so that after a
    failure the error line can point at it; an error removes the temp dir and nothing else."""
    eid = final_dir.name
    final_dir.parent.mkdir(exist_ok=True)
    tmp = final_dir.parent / f".tmp-{eid}-{os.getpid()}"
    tmp.mkdir()
    log = final_dir.parent / f"{eid}.export.log"
    log.unlink(missing_ok=True)  # an earlier attempt's
    try:
        report = build(tmp, log)
        if log.exists():
            os.replace(log, tmp / "export.log")
        try:
            os.rename(tmp, final_dir)
        except OSError:  # the same export, run at the same time, finished first: keep that one
            if not (final_dir / name).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir, after an error; gone after the rename
    return report


def write_output(src: Path, output: Path, overwrite: bool) -> None:
    """Copy the final model to --output: a temp file beside it, then one rename."""
    from fwk.export.replace import replace

    check_output(output, overwrite, (f"*{src.suffix}",))  # again: it may have appeared while the export ran
    replace(output, lambda tmp: shutil.copyfile(src, tmp))


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
    exits: bool = False,
) -> dict[str, Any]:
    """Export ``run``, or show its existing export. Raise VerificationFailed when a stage lost
    too much. With ``exits``, a run's exits and threshold go into the ONNX graph (``fwk.export.exits``)."""
    from fwk.components.best import BEST_DIR, read_best
    from fwk.export.source import check_exportable, load

    checkpoint = check_exportable(run)
    if checkpoint.parent.name == BEST_DIR:
        best = read_best(run.path) or {}
        logger.info(
            f"exporting run {run.id}'s best checkpoint: {best.get('metric')} {best.get('value', 0):.4g} "
            f"at {checkpoint.name}"
        )
    eid = export_id(run, checkpoint, plan, quantize, cfg, max_drop, qat_steps, exits=exits)
    final_dir = run.path / "exports" / eid
    report = made(run, final_dir, rep.REPORT)
    if report is None:
        source = load(run, carry_exits=exits, without="--no-exits")
        job = lambda tmp, log: Job(source, eid, plan, quantize, cfg, max_drop, tmp, log, qat_steps)  # noqa: E731
        report = built_whole(final_dir, rep.REPORT, lambda tmp, log: _build(job(tmp, log)))
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
