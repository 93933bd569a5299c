"""``--format tensorrt``: the folded model's ``torch.export`` program compiled by Torch-TensorRT
(``torch_tensorrt.dynamo.compile``, the dynamo IR) into TensorRT engines for the NVIDIA GPU it
runs on, saved as an ExportedProgram, ``model.ep`` (``torch_tensorrt.save``). It loads with
``torch.export.load(path).module()`` once ``torch_tensorrt`` is imported, with no model code.

The program captured on the CPU (``fwk.export.program``) is moved to the GPU
(``torch.export.passes.move_to_device_pass``) and compiled there; its batch axis is dynamic
from 1 to ``MAX_BATCH`` (TensorRT builds its engines for a range of shapes, tuned at the batch
it was captured at). On a machine without CUDA, or without the
``torch_tensorrt`` package, it is refused in one line before any work. It is verified like pt2
and aoti, in a fresh process, against the checkpoint's model on the CPU: fp32 on both sides,
TensorRT's kernels sum in their own order, hence ``tolerance``."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.export.formats import FORMATS, Request
from fwk.export.program import Program

MAX_BATCH = 256


def check_machine() -> None:
    """Refuse, in one line, a machine that cannot build TensorRT engines."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "--format tensorrt builds TensorRT engines for an NVIDIA GPU, and this machine has no CUDA device; "
            "export --format aoti or onnx for a CPU, or run this on the GPU machine that will serve it"
        )
    if importlib.util.find_spec("torch_tensorrt") is None:
        raise UserError(
            "--format tensorrt needs the torch-tensorrt package built for this torch: pip install torch-tensorrt"
        )


@dataclass(frozen=True)
class TensorRT(Program):
    name: str = "tensorrt"
    file: str = "model.ep"
    runtime: str = "tensorrt"
    tolerance: float = 1e-3
    carries_exits: bool = False  # not built on a GPU yet: the exits' branches are untried under TensorRT

    def export(self, request: Request) -> None:
        check_machine()
        super().export(request)

    def save(self, program: Any, out: Path, log: Path) -> None:
        import torch_tensorrt
        from torch.export.passes import move_to_device_pass

        from fwk.export.capture import output_to

        program = move_to_device_pass(program, "cuda")
        (x,) = program.example_inputs[0]
        shape = list(x.shape)
        given = torch_tensorrt.Input(
            min_shape=[1, *shape[1:]], opt_shape=shape, max_shape=[MAX_BATCH, *shape[1:]], dtype=x.dtype
        )
        with output_to(log):  # TensorRT's build log
            compiled = torch_tensorrt.dynamo.compile(program, arg_inputs=[given])
            torch_tensorrt.save(compiled, str(out / self.file), output_format="exported_program", arg_inputs=[x.cuda()])


FORMATS.register(TensorRT, name="tensorrt")(TensorRT)
