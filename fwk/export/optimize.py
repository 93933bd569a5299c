"""Stage 3: graph optimization with onnxscript's optimizer, offline and portable.

It does constant folding, dead-code removal, and removal of redundant Transpose/Reshape/Cast/
Identity chains. The result uses standard ONNX operators only, so it runs on any runtime and
the quantizer sees plain Conv/Gemm/MatMul nodes. onnxruntime's own fusions, done again at
session creation, would add contrib operators that the quantizer does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Optimized:
    path: Path
    nodes_before: int
    nodes_after: int


def optimize(src: Path, dst: Path) -> Optimized:
    import onnx
    import onnxscript.optimizer

    model = onnx.load(str(src))
    before = len(model.graph.node)
    optimized = onnxscript.optimizer.optimize(model)
    onnx.save(optimized, str(dst))
    onnx.checker.check_model(str(dst), full_check=True)
    return Optimized(path=dst, nodes_before=before, nodes_after=len(optimized.graph.node))
