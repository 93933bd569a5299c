"""``--format onnx``: pruned, folded, quantized and verified by ``fwk.export.pipeline``."""

from __future__ import annotations

from dataclasses import dataclass

from fwk.export.formats import FORMATS, Format


@dataclass(frozen=True)
class Onnx(Format):
    name: str = "onnx"
    settings: bool = True


FORMATS.register(Onnx, name="onnx")(Onnx)
