"""``--format pte``: the model lowered by ExecuTorch with the XNNPACK delegate, for phones and
edge boards (``fwk.export.edge_pipeline``); ``--prune`` and ``--quantize int8`` chain in front."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fwk.export.formats import FORMATS, Backend, Request

QUANTIZE = ("none", "int8")  # int8: PT2E with the XNNPACK quantizer; fp16 and dynamic int8 are not offered here


@dataclass(frozen=True)
class Pte(Backend):
    name: str = "pte"

    def writes(self) -> tuple[str, ...]:
        return ("*.pte",)

    def export(self, request: Request) -> None:
        """Check the flags and export.* settings before any work, then run the ExecuTorch pipeline."""
        from fwk.errors import UserError
        from fwk.export import edge
        from fwk.export.edge_pipeline import run_pte_export
        from fwk.export.pipeline import check_output
        from fwk.export.settings import PrunePlan, load_settings

        r, quantize = request, request.quantize or "none"
        plan = PrunePlan.checked(r.prune, r.ratio, r.rounds)
        if quantize not in QUANTIZE:
            raise UserError(f"--format pte takes --quantize {' or '.join(QUANTIZE)}, not {quantize}")
        if r.qat_steps != "0":
            raise UserError("--qat-steps applies to --format onnx; --format pte quantizes after training (PT2E)")
        if r.max_accuracy_drop < 0:
            raise UserError(f"--max-accuracy-drop={r.max_accuracy_drop:g} is not allowed: expected a number >= 0")
        check_output(r.output, r.overwrite, self.writes())
        cfg = load_settings(r.overrides())
        edge.check_installed()
        run = r.run()
        logging.getLogger("torch").setLevel(logging.ERROR)  # the lowering's warnings go to export.log
        run_pte_export(run, plan, quantize, cfg, r.max_accuracy_drop, r.output, r.overwrite)


FORMATS.register(Pte, name="pte")(Pte)
