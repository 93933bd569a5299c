"""Formats compiled from one ``torch.export`` program: ``pt2`` (the program itself) and ``aoti``
(the program compiled ahead of time by AOTInductor into a package of native code).

Both start alike: the checkpoint's model in eval mode with its Conv->BatchNorm pairs folded
(``fwk.export.fold``, as for ONNX), captured by ``fwk.export.capture`` with a dynamic batch
axis (and sequence axis for language models). A model that cannot be captured is refused in
one line naming the module and line; the export dir is then not written.

They are verified the way their users load them: in a fresh Python process that has no fwk
model code in it (``python -m fwk.export.reload``), which loads the file with
``torch.export.load`` or ``torch._inductor.aoti_load_package``, runs the held-out inputs at a
batch size other than the one captured, and hands the outputs back for fwk to compare with the
checkpoint's model (``fwk.export.weights``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.export.formats import Format

TOLERANCE = 1e-5  # max abs difference to the checkpoint's model, fp32: the same math, folded and compiled


@dataclass(frozen=True)
class FreshProcess:
    """Run a saved program on a batch in a new Python process: ``python -m fwk.export.reload``."""

    fmt: str
    path: Path

    def __call__(self, x: Any) -> Any:
        """Return the program's output for the batch ``x``, or the list of outputs for a list of batches."""
        import torch

        with tempfile.TemporaryDirectory(prefix="fwk-reload-") as tmp:
            inputs, outputs = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
            torch.save([b.detach().cpu() for b in x] if isinstance(x, list) else x.detach().cpu(), inputs)
            argv = [sys.executable, "-m", "fwk.export.reload", self.fmt, str(self.path), str(inputs), str(outputs)]
            done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if done.returncode != 0:
                said = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise UserError(f"the {self.fmt} export does not load in a fresh process: {said}")
            return torch.load(outputs, weights_only=True)


@dataclass(frozen=True)
class Program(Format):
    """A format made from the folded model's ``torch.export`` program, checked in a fresh process."""

    how: str = "a fresh process, without fwk's model code"
    tolerance: float = TOLERANCE

    carries_exits: bool = True
    file: str = ""  # the file it writes
    runtime: str = ""  # what fwk serve loads the file with: "torch.export", "aoti"

    def writes(self) -> tuple[str, ...]:
        return (f"*{Path(self.file).suffix}",)

    @abstractmethod
    def save(self, program: Any, out: Path, log: Path) -> None:
        """Write the program into ``out / self.file``, in this format."""

    def write(self, source: Any, out: Path, log: Path) -> tuple[Any, list[str]]:
        from fwk.export import capture, fold

        folded = fold.fold(source.model).model
        example = capture.example_input(source.data.val)
        program = capture.capture(folded, example, source.data.task, log, f"a {self.name} program")
        self.save(program, out, log)
        return FreshProcess(self.name, out / self.file), [self.file]

    def details(self, source: Any) -> dict[str, Any]:
        return details(source, self.runtime, self.file)

    def outputs(self, reloaded: Any, inputs: list[Any]) -> list[Any]:
        return reloaded(inputs)  # one fresh process for every batch


def details(source: Any, runtime: str, file: str, max_batch: int | None = None) -> dict[str, Any]:
    """What fwk serve needs to serve a program without the run: the runtime, the file, the
    input and output (-1: a dynamic axis) and, for token ids, the vocabulary and longest
    sequence (``fwk.serve.limits``' ids and longest); ``max_batch`` when the batch is bounded."""
    import torch

    from fwk.export import capture

    example = capture.example_input(source.data.val)
    dynamic = capture.dynamic_shapes(example, source.data.task)[0]
    with torch.no_grad():
        out = source.model(example)

    def shape(t: Any) -> list[int]:
        return [-1 if i in dynamic else int(n) for i, n in enumerate(t.shape)]

    given = {"dtype": str(example.dtype).removeprefix("torch."), "shape": shape(example)}
    if not example.dtype.is_floating_point and source.data.task == "lm":
        longest = [-1 if i == 0 else int(n) for i, n in enumerate(example.shape)]  # seq: at most the captured
        given |= {"ids": int(out.shape[-1]), "longest": longest}  # ids index the vocabulary the logits span
    return {
        "runtime": runtime,
        "final": file,
        "recipe": source.config.recipe,
        "task": source.data.task,
        "input": given,
        "output": {"dtype": str(out.dtype).removeprefix("torch."), "shape": shape(out)},
        **({"max_batch": max_batch} if max_batch else {}),
    }
