"""Capture the eval-mode model as one ``torch.export`` program, the graph every compiled format
starts from (ONNX, ``pt2``, ``aoti``).

The capture is non-strict: the model's Python runs, so an error points at the user's line. A
model that cannot be captured (control flow on a tensor's values, an op torch.export cannot
trace) is refused in one line naming the module, file and line where it was raised; the full
traceback goes to the export's log. The exporter's own chatter goes to that log too, not to the
terminal.

The batch axis is dynamic and named ``batch``. For language models the sequence axis is
dynamic too, named ``seq``, at most the length of the example (the length the model was
verified at).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from fwk.errors import UserError

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


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
    xs = [torch.as_tensor(val[i][0]) for i in range(min(2, len(val)))]
    return torch.stack(xs * (2 if len(xs) == 1 else 1))


def dynamic_shapes(x: torch.Tensor, task: str, max_batch: int | None = None) -> tuple[dict[int, torch.export.Dim], ...]:
    """The free axes of ``x``: the batch (at most ``max_batch`` when given) and, for token ids, the sequence."""
    axes = {0: torch.export.Dim("batch", max=max_batch) if max_batch else torch.export.Dim("batch")}
    if task == "lm" and x.dim() == 2 and x.shape[1] > 2:  # (B, T) token ids
        axes[1] = torch.export.Dim("seq", min=2, max=int(x.shape[1]))
    return (axes,)


def _module_path(model: nn.Module, module: nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name or "(the model itself)"
    return type(module).__name__


def user_frame(exc: BaseException, model: nn.Module) -> str:
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


def first_line(exc: BaseException) -> str:
    if "DataDependent" in type(exc).__name__:
        return "control flow depends on a tensor's values (write it with torch.where or torch.cond)"
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split()) if text else type(exc).__name__


def log_traceback(log: Path) -> None:
    with open(log, "a") as f:
        f.write(traceback.format_exc())


def capture(
    model: nn.Module,
    example: torch.Tensor,
    task: str,
    log: Path,
    target: str,
    max_batch: int | None = None,
) -> torch.export.ExportedProgram:
    """Return ``model``'s program (call it in eval mode), its batch (and sequence) axis dynamic,
    the batch at most ``max_batch`` when given. On failure raise a UserError naming the module
    and line; ``target`` names the format in it ("ONNX", "a pt2 program")."""
    with output_to(log), torch.no_grad():
        try:
            return torch.export.export(
                model, (example,), dynamic_shapes=dynamic_shapes(example, task, max_batch), strict=False
            )
        except Exception as exc:
            log_traceback(log)
            where = user_frame(exc, model)
            raise UserError(
                f"cannot export the model to {target}: torch.export failed {where}: {first_line(exc)} "
                f"(full log: {log})".replace("  ", " ")
            ) from None
