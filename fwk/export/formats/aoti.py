"""``--format aoti``: the folded model's ``torch.export`` program compiled ahead of time by
AOTInductor into ``model.aoti.pt2``, a package of native code and weights
(``torch._inductor.aoti_compile_and_package``). ``torch._inductor.aoti_load_package`` loads it
in Python, and ``torch::inductor::AOTIModelPackageLoader`` in C++, with no model code.

Compiling needs a C++ compiler (Inductor's ``cpp.cxx``: ``$CXX`` or ``g++``), checked before
any work."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.export.formats import FORMATS, Request
from fwk.export.program import Program


def compiler() -> str:
    """Return the path of the C++ compiler AOTInductor will run, or raise a one-line UserError."""
    name = os.environ.get("CXX") or "g++"
    found = shutil.which(name)
    if found is None:
        raise UserError(
            f"--format aoti compiles the model with a C++ compiler, and {name} is not on PATH: "
            "install one (apt-get install g++) or set CXX to its path"
        )
    return found


@dataclass(frozen=True)
class Aoti(Program):
    name: str = "aoti"
    file: str = "model.aoti.pt2"
    runtime: str = "aoti"

    def export(self, request: Request) -> None:
        compiler()
        super().export(request)

    def save(self, program: Any, out: Path, log: Path) -> None:
        import torch

        from fwk.export.capture import output_to

        # Inductor turns conv inputs channels-last, and a cond branch then reads its operand with the
        # strides of a contiguous one: wrong outputs (torch 2.14). A program that branches (exits) keeps the layout.
        branches = any(n.target is torch.ops.higher_order.cond for n in program.graph.nodes)
        configs = {"layout_optimization": False} if branches else {}
        with output_to(log):  # Inductor's compile chatter
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(out / self.file), inductor_configs=configs
            )


FORMATS.register(Aoti, name="aoti")(Aoti)
