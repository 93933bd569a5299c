"""`fwk export --format hf|safetensors|pt2|aoti`: a finished run's model, in the formats other tools read.

- ``safetensors``: ``model.safetensors``, the raw weights of any fwk model, under their
  state_dict names and with tied tensors stored once, with the run id and step in its
  metadata.
- ``hf``: a ``model=hf`` run as the folder ``save_pretrained`` writes: ``config.json``,
  ``generation_config.json`` for a generative model, ``model.safetensors``, sharded above
  ``fwk.export.formats.hf.SHARD``, and the tokenizer the run trained with. That is the
  data's, ``DataBundle.tokenizer``: a folder, or for bytes
  ``fwk.data.hf_tokens.byte_tokenizer``, whose ids are UTF-8 bytes. Otherwise it is
  ``model.path``'s, when it has one. ``AutoModelFor*`` and ``AutoTokenizer`` of transformers
  load it back.
- ``pt2`` and ``aoti``: the folded model's ``torch.export`` program, saved or compiled ahead of
  time (``fwk.export.program``), reloaded in a fresh process.

Both are verified before they count. The files are loaded back the way their users will
load them, as a fresh fwk model or with ``AutoModelFor*.from_pretrained``, run on held-out
validation inputs, and their outputs compared with the checkpoint's model. Beyond the
format's ``tolerance``, the max abs difference of the outputs, the export fails, its files kept.
The export is written to ``runs/<id>/exports/<export-id>/``, with ``weights_report.json``,
and renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from fwk.track.store import RunDir

logger = logging.getLogger(__name__)

HELD_OUT = 8  # validation samples the reloaded model is run on
REPORT = "weights_report.json"  # beside a weights export's files, never copied to --output
LOG = "export.log"  # the exporter's own output, for the formats that have one; never copied either


def _export_id(run: RunDir, checkpoint: Path, fmt: str, exits: bool) -> str:
    key = json.dumps({"run": run.id, "checkpoint": checkpoint.name, "format": fmt, "exits": exits}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:10]


def _held_out(source: Any) -> Any:
    import torch

    from fwk.data.build import example_input

    n = min(HELD_OUT, len(source.data.val))
    one = example_input(source.data)
    return torch.cat([one] + [torch.as_tensor(source.data.val[i][0]).unsqueeze(0).to(one.dtype) for i in range(1, n)])


def run_weights_export(
    run: RunDir, form: Any, output: Path | None, overwrite: bool, exits: bool = False, without: str = ""
) -> dict[str, Any]:
    """Write and verify ``form``'s export of ``run``, or show the existing one, and return its report.

    ``form`` is a ``fwk.export.formats.Format``: it writes and reloads, this checks and keeps.
    With ``exits`` a run's exits go in (``fwk.export.exits``); ``without`` names what leaves
    them out otherwise, for the line that says so. A model with exits is also checked one
    held-out row at a time, where a row can leave at an exit that a batch runs past.
    """
    import torch

    from fwk.export.pipeline import VerificationFailed, built_whole, check_output, made
    from fwk.export.source import check_exportable, load

    fmt = form.name
    check_output(output, overwrite, form.writes(), form.folder)
    checkpoint = check_exportable(run)
    eid = _export_id(run, checkpoint, fmt, exits)
    final_dir = run.path / "exports" / eid
    report = made(run, final_dir, REPORT)
    if report is None:
        source = load(run, carry_exits=exits, without=without)

        def build(tmp: Path, log: Path) -> dict[str, Any]:
            reloaded, files = form.write(source, tmp, log)
            x = _held_out(source)
            inputs = [x, *(x.split(1) if source.exits else [])]
            with torch.no_grad():
                expected, got = [source.model(b) for b in inputs], form.outputs(reloaded, inputs)
            diff = max(float((e.float() - g.float()).abs().max()) for e, g in zip(expected, got, strict=True))
            report = {
                "format": fmt,
                "run_id": run.id,
                "checkpoint": checkpoint.name,
                "step": source.step,
                "files": files,
                "held_out": int(x.shape[0]),
                "max_abs_diff": diff,
                "tolerance": form.tolerance,
                "passed": diff <= form.tolerance,
                **form.details(source),
                **(
                    {"exits": source.exits | {"held_out_alone_leave_at": source.model.alone(x)}} if source.exits else {}
                ),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n")
            return report

        report = built_whole(final_dir, REPORT, build)
    logger.info(
        f"{fmt}: {', '.join(report['files'])}; reloaded with {form.how}, on {report['held_out']} held-out inputs: "
        f"max abs diff {report['max_abs_diff']:.3g} (tolerance {report['tolerance']:g})"
    )
    from fwk.export.report import exits_line

    if exits_said := exits_line(report.get("exits")):
        logger.info(exits_said)
    logger.info(f"export dir: {final_dir}")
    if not report["passed"]:
        raise VerificationFailed(
            f"the reloaded {fmt} export differs from the checkpoint's model by {report['max_abs_diff']:.3g} "
            f"(> {report['tolerance']:g}); files kept in {final_dir}"
        )
    if output is not None:
        from fwk.export.replace import replace

        check_output(output, overwrite, form.writes(), form.folder)  # again: it may have appeared meanwhile
        replace(output, lambda tmp: form.copy(final_dir, tmp))
        logger.info(f"wrote {output}")
    return report
