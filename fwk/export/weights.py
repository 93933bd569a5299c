"""`fwk export --format hf|safetensors`: a finished run's weights in the formats other tools read.

- ``safetensors``: ``model.safetensors``, the raw weights of any fwk model (state_dict names,
  tied tensors stored once), with the run id and step in its metadata.
- ``hf``: a ``model=hf`` run as the folder ``save_pretrained`` writes: ``config.json``,
  ``generation_config.json`` for a generative model, ``model.safetensors`` (sharded above
  ``SHARD``), and the tokenizer the run trained with (the data's, ``DataBundle.tokenizer``:
  a folder, or for bytes ``fwk.data.hf_tokens.byte_tokenizer``, ids = UTF-8 bytes; else
  ``model.path``'s when it has one). ``AutoModelFor*`` and ``AutoTokenizer`` of transformers load it back.

Both are verified before they count: the files are loaded back the way their users will load
them (a fresh fwk model, or ``AutoModelFor*.from_pretrained``), run on held-out validation
inputs, and their outputs compared with the checkpoint's model. Beyond ``TOLERANCE`` (max abs
difference of the outputs) the export fails, its files kept. Written to
``runs/<id>/exports/<export-id>/`` (with ``weights_report.json``), renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)

FORMATS = ("onnx", "hf", "safetensors")
REPORT = "weights_report.json"
TOLERANCE = 1e-4  # max abs difference of the outputs, fp32 on both sides: the same weights, the same math
SHARD = "2GB"  # hf: larger models are written as several model-0000N-of-0000M.safetensors
HELD_OUT = 8  # validation samples the reloaded model is run on


def _export_id(run: RunDir, checkpoint: Path, fmt: str) -> str:
    key = json.dumps({"run": run.id, "checkpoint": checkpoint.name, "format": fmt}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:10]


def _held_out(source: Any) -> Any:
    import torch

    from fwk.engine.build import example_input

    n = min(HELD_OUT, len(source.data.val))
    one = example_input(source.data)
    return torch.cat([one] + [torch.as_tensor(source.data.val[i][0]).unsqueeze(0).to(one.dtype) for i in range(1, n)])


def _write_safetensors(source: Any, out: Path) -> tuple[Any, list[str]]:
    from safetensors.torch import load_model, save_model

    from fwk.engine.build import build_model

    meta = {"fwk_run": source.run.id, "step": str(source.step), "model": type(source.model).__name__}
    save_model(source.model, str(out / "model.safetensors"), metadata=meta)
    fresh = build_model(source.config.model, source.data, init=False).float().eval()
    missing, unexpected = load_model(fresh, str(out / "model.safetensors"), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    return fresh, ["model.safetensors"]


def _write_hf(source: Any, out: Path) -> tuple[Any, list[str]]:
    from fwk.models.hf import AUTO, HFModel, folder, transformers

    model = source.model
    if not isinstance(model, HFModel):
        raise UserError(
            f"--format hf writes model=hf runs; run {source.run.id}'s model is {source.config.model.name}: "
            "use --format safetensors for its raw weights, or --format onnx"
        )
    model.hf.save_pretrained(out, max_shard_size=SHARD)
    # the tokenizer the run trained with: the data's (bytes, or a folder), else model.path's if it has one
    named, path = source.data.tokenizer, source.data.tokenizer or source.config.model.path
    tokenizer = None
    if named == "bytes":
        from fwk.data.hf_tokens import byte_tokenizer

        tokenizer = byte_tokenizer()
    elif path:
        try:
            tokenizer = transformers().AutoTokenizer.from_pretrained(
                folder(path, "tokenizer_config.json"), local_files_only=True
            )
        except (UserError, OSError, ValueError, TypeError):  # no tokenizer there (a config and weights alone)
            tokenizer = None
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    auto = getattr(transformers(), AUTO[model.task])
    reloaded = HFModel(auto.from_pretrained(out, local_files_only=True, dtype=model.hf.dtype), model.task).eval()
    return reloaded, sorted(p.name for p in out.iterdir())


def run_weights_export(run: RunDir, fmt: str, output: Path | None, overwrite: bool) -> dict[str, Any]:
    """Write and verify the ``fmt`` export of ``run`` (or show the existing one); its report."""
    import torch

    from fwk.export.pipeline import VerificationFailed, check_output, made
    from fwk.export.source import check_exportable, load

    check_output(output, overwrite, folder=fmt == "hf")
    checkpoint = check_exportable(run)
    eid = _export_id(run, checkpoint, fmt)
    final_dir = run.path / "exports" / eid
    report = made(run, final_dir, REPORT)
    if report is None:
        source = load(run)
        final_dir.parent.mkdir(exist_ok=True)
        tmp = final_dir.parent / f".tmp-{eid}-{os.getpid()}"
        tmp.mkdir()
        try:
            reloaded, files = (_write_hf if fmt == "hf" else _write_safetensors)(source, tmp)
            x = _held_out(source)
            with torch.no_grad():
                expected, got = source.model(x), reloaded(x)
            diff = float((expected.float() - got.float()).abs().max())
            report = {
                "format": fmt,
                "run_id": run.id,
                "checkpoint": checkpoint.name,
                "step": source.step,
                "files": files,
                "held_out": int(x.shape[0]),
                "max_abs_diff": diff,
                "tolerance": TOLERANCE,
                "passed": diff <= TOLERANCE,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n")
            os.rename(tmp, final_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    how = "AutoModel.from_pretrained" if fmt == "hf" else "a fresh model"
    logger.info(
        f"{fmt}: {', '.join(report['files'])}; reloaded with {how}, on {report['held_out']} held-out inputs: "
        f"max abs diff {report['max_abs_diff']:.3g} (tolerance {report['tolerance']:g})"
    )
    logger.info(f"export dir: {final_dir}")
    if not report["passed"]:
        raise VerificationFailed(
            f"the reloaded {fmt} export differs from the checkpoint's model by {report['max_abs_diff']:.3g} "
            f"(> {report['tolerance']:g}); files kept in {final_dir}"
        )
    if output is not None:
        if output.exists():  # check_output allowed it: --overwrite
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        if fmt == "hf":
            shutil.copytree(final_dir, output, ignore=shutil.ignore_patterns(REPORT))
        else:
            shutil.copyfile(final_dir / "model.safetensors", output)
        logger.info(f"wrote {output}")
    return report
