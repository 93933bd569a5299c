"""``--format onnx``: a model pruned, folded, quantized and verified by ``fwk.export.pipeline``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fwk.export.formats import FORMATS, Backend, Request


@dataclass(frozen=True)
class Onnx(Backend):
    name: str = "onnx"
    carries_exits: bool = True

    def writes(self) -> tuple[str, ...]:
        return ("*.onnx",)

    def export(self, request: Request) -> None:
        """Check the pruning, quantization and export.* settings, then run the ONNX pipeline."""
        from rich.console import Console

        from fwk.errors import UserError
        from fwk.export.exits import check_onnx_flags, recorded
        from fwk.export.pipeline import check_output, run_export
        from fwk.export.settings import PrunePlan, check_qat_steps, check_quantize, load_settings

        r = request
        plan = PrunePlan.checked(r.prune, r.ratio, r.rounds)
        check_quantize(r.quantize or "int8")
        qat = check_qat_steps(r.qat_steps, r.quantize or "int8")
        if r.max_accuracy_drop < 0:
            raise UserError(f"--max-accuracy-drop={r.max_accuracy_drop:g} is not allowed: expected a number >= 0")
        check_output(r.output, r.overwrite, self.writes())
        cfg = load_settings(r.overrides())
        run = r.run()
        exits = r.exits and recorded(run)  # its exits go into the graph, which int8's calibration cannot enter
        quantize = r.quantize or ("none" if exits else "int8")
        if exits:
            check_onnx_flags(plan.method, quantize, qat)
        logging.getLogger("torch").setLevel(logging.ERROR)  # the exporter's warnings go to export.log, not here
        console = Console(stderr=False, highlight=False, width=max(Console().width, 160))
        show = console.print
        run_export(
            run,
            plan,
            quantize,
            cfg,
            r.max_accuracy_drop,
            r.output,
            r.overwrite,
            show=show,
            qat_steps=qat,
            exits=exits,
        )


FORMATS.register(Onnx, name="onnx")(Onnx)
