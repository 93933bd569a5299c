"""Stage 2: export the folded torch model to one ONNX file with the current, dynamo exporter.

``torch.export.export`` captures the graph first, then ``torch.onnx.export`` translates the
ExportedProgram. The capture is non-strict: the model's Python runs, so an error points at
the user's line. Doing the two steps apart lets a failure name what failed: the module
and line that torch.export could not capture, or the operator that has no ONNX function
and the module that called it. The exporter's own chatter goes to a log file beside the
model, not to the terminal.

The batch axis is dynamic and named ``batch``. For language models the sequence axis is
dynamic too, named ``seq``, at most the length the model was verified at. The file is a
single .onnx with the weights inside while they are under 2 GB (protobuf's limit), and it
passes ``onnx.checker.check_model``. Graph optimization is the next stage, not the
exporter's.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fwk.errors import UserError

INPUT, OUTPUT = "input", "logits"
_PROTOBUF_LIMIT = 2 * 1024**3
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


@dataclass
class Exported:
    path: Path
    opset: int
    nodes: int
    dynamic_axes: list[str]
    external_data: bool


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (the file descriptors: C++ and Python alike) to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def example_input(val: torch.utils.data.Dataset) -> torch.Tensor:
    """Return two validation samples, (2, ...). A batch of 1 would let torch.export fix the
    batch size."""
    xs = [val[i][0] for i in range(min(2, len(val)))]
    return torch.stack(xs * (2 if len(xs) == 1 else 1))


def _dynamic_shapes(x: torch.Tensor, task: str) -> tuple[dict[int, torch.export.Dim], ...]:
    axes = {0: torch.export.Dim("batch")}
    if task == "lm" and x.dim() == 2 and x.shape[1] > 2:  # (B, T) token ids
        axes[1] = torch.export.Dim("seq", min=2, max=int(x.shape[1]))
    return (axes,)


def _module_path(model: nn.Module, module: nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name or "(the model itself)"
    return type(module).__name__


def _user_frame(exc: BaseException, model: nn.Module) -> str:
    """Say where in the model's own code the capture failed: `module (Class) at file:line: code`."""
    tb = exc.__traceback__
    for (frame, _), summary in reversed(list(zip(traceback.walk_tb(tb), traceback.extract_tb(tb), strict=True))):
        if summary.filename.startswith(_TORCH_DIR) or "<" in summary.filename:
            continue
        code = (summary.line or "").strip()
        where = f"{Path(summary.filename).name}:{summary.lineno}" + (f": `{code}`" if code else "")
        args = frame.f_code.co_varnames[: frame.f_code.co_argcount]
        owner = frame.f_locals.get(args[0]) if args else None  # `self` of a method, whatever its name
        if isinstance(owner, nn.Module):
            return f"in module {_module_path(model, owner)} ({type(owner).__name__}) at {where}"
        return f"at {where}"
    return ""


def _first_line(exc: BaseException) -> str:
    if "DataDependent" in type(exc).__name__:
        return "control flow depends on a tensor's values (write it with torch.where or torch.cond)"
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split()) if text else type(exc).__name__


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
        return _first_line(exc)
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


def _log_traceback(log: Path) -> None:
    with open(log, "a") as f:
        f.write(traceback.format_exc())


def export_onnx(model: nn.Module, example: torch.Tensor, task: str, path: Path, log: Path) -> Exported:
    """Export ``model`` in eval mode to ``path``. On failure raise a UserError naming the
    module or operator."""
    import onnx

    dynamic = _dynamic_shapes(example, task)
    with output_to(log), torch.no_grad():
        try:
            program = torch.export.export(model, (example,), dynamic_shapes=dynamic, strict=False)
        except Exception as exc:
            _log_traceback(log)
            where = _user_frame(exc, model)
            raise UserError(
                f"cannot export the model to ONNX: torch.export failed {where}: {_first_line(exc)} "
                f"(full log: {log})".replace("  ", " ")
            ) from None
        try:
            onnx_program = torch.onnx.export(
                program, input_names=[INPUT], output_names=[OUTPUT], dynamo=True, optimize=False, verbose=False
            )
        except Exception as exc:
            _log_traceback(log)
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
