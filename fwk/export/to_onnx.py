"""Stage 2: export the folded torch model to one ONNX file with the current, dynamo exporter.

``fwk.export.capture`` captures the graph first, then ``torch.onnx.export`` translates the
ExportedProgram. Doing the two steps apart lets a failure name what failed: the module
and line that torch.export could not capture, or the operator that has no ONNX function
and the module that called it. The exporter's own chatter goes to a log file beside the
model, not to the terminal.

The input's dynamic axes (``batch``, and ``seq`` for language models) keep their names in the
ONNX graph. The file is a single .onnx with the weights inside while they are under 2 GB
(protobuf's limit), and it passes ``onnx.checker.check_model``. Graph optimization is the next
stage, not the exporter's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fwk.errors import UserError
from fwk.export.capture import capture, first_line, log_traceback, output_to

INPUT, OUTPUT = "input", "logits"
_PROTOBUF_LIMIT = 2 * 1024**3


@dataclass
class Exported:
    path: Path
    opset: int
    nodes: int
    dynamic_axes: list[str]
    external_data: bool


def _name_dims(proto: object, task: str) -> dict[str, str]:
    """Name the input's symbolic dims (torch.export calls them s0, s1...): batch, seq."""
    names = ["batch", "seq"] if task == "lm" else ["batch"]
    dims = proto.graph.input[0].type.tensor_type.shape.dim  # type: ignore[attr-defined]
    mapping = {d.dim_param: names[i] for i, d in enumerate(dims) if d.dim_param and i < len(names)}
    g = proto.graph  # type: ignore[attr-defined]
    for value in [*g.input, *g.output, *g.value_info]:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in mapping:
                d.dim_param = mapping[d.dim_param]
    return mapping


def _op_and_module(exc: BaseException, program: torch.export.ExportedProgram) -> str:
    """Read `operator aten.x (called in module m)` from the exporter's "No ONNX function found" error."""
    found = re.search(r"OpOverload\(op='([\w.]+)'", str(exc))
    if not found:
        return first_line(exc)
    op = found.group(1)
    stem = op.split(".")[-1].lstrip("_")  # aten._linalg_svd -> linalg_svd (before decomposition: svdvals)
    for node in program.graph.nodes:
        if node.op == "call_function" and stem in str(node.target):
            stack = node.meta.get("nn_module_stack") or {}
            if stack:
                path, kind = list(stack.values())[-1]
                name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
                return f"operator {op} has no ONNX function (called in module {path or '(root)'} ({name}))"
    return f"operator {op} has no ONNX function"


def export_onnx(model: nn.Module, example: torch.Tensor, task: str, path: Path, log: Path) -> Exported:
    """Export ``model`` in eval mode to ``path``. On failure raise a UserError naming the
    module or operator."""
    import onnx

    program = capture(model, example, task, log, "ONNX")
    with output_to(log), torch.no_grad():
        try:
            onnx_program = torch.onnx.export(
                program, input_names=[INPUT], output_names=[OUTPUT], dynamo=True, optimize=False, verbose=False
            )
        except Exception as exc:
            log_traceback(log)
            raise UserError(
                f"cannot export the model to ONNX: {_op_and_module(exc, program)} (full log: {log})"
            ) from None
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    external = weight_bytes >= _PROTOBUF_LIMIT * 0.95  # a single file only while protobuf can hold it
    proto = onnx_program.model_proto
    _name_dims(proto, task)
    onnx.save(proto, str(path), save_as_external_data=external, location=f"{path.name}.data")
    onnx.checker.check_model(str(path), full_check=True)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    axes = [f"{d.dim_param}" for d in proto.graph.input[0].type.tensor_type.shape.dim if d.dim_param]
    return Exported(path=path, opset=opset, nodes=len(proto.graph.node), dynamic_axes=axes, external_data=external)
