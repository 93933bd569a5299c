"""A model lowered by ExecuTorch to a ``.pte`` program for phones and edge boards, with its
work delegated to XNNPACK (``fwk export --format pte``).

The steps are ExecuTorch's own: the folded model's ``torch.export`` program
(``fwk.export.capture``), for int8 first quantized through the PT2E flow
(``prepare_pt2e`` with the XNNPACK quantizer, calibrated on training batches,
``convert_pt2e``) and captured again; then ``to_edge_transform_and_lower`` with the XNNPACK
partitioner, and ``to_executorch``. What XNNPACK does not take runs on ExecuTorch's portable
kernels.

ExecuTorch plans a program's memory for the largest input it will see, so the batch axis has
an upper bound, ``export.max_batch``: a bigger batch is refused by the runtime. An op outside
the Core ATen set that ExecuTorch accepts is refused in one line naming it, except
``adaptive_max_pool2d`` where the input's size is a multiple of the output's: that is exactly a
``max_pool2d`` with kernel and stride the ratio, and is rewritten as one.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fwk.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

RUNTIME = "executorch"  # the runtime the report names, which fwk serve loads the program with


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import ExecuTorch's modules inside this block: one of them (the XNNPACK partitioner) calls
    ``logging.basicConfig``, which would print every fwk line twice, and torchao's import logs
    a deprecation warning of torch's pytree on each run."""
    root, pytree = logging.getLogger(), logging.getLogger("torch.utils._pytree")
    handlers, level = list(root.handlers), pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        pytree.setLevel(level)


def check_installed() -> None:
    """Refuse, in one line and before any work, a machine without the executorch package."""
    import importlib.util

    if importlib.util.find_spec("executorch") is None:
        raise UserError("--format pte needs the executorch package: pip install 'fwk[edge]' (or executorch)")


def _adaptive_max_pool2d(x: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    (h, w), (oh, ow) = x.shape[-2:], output_size
    if h % oh or w % ow:
        raise UserError(
            f"cannot lower the model to ExecuTorch: adaptive_max_pool2d from {h}x{w} to {oh}x{ow} has no "
            "ExecuTorch kernel (only sizes that are multiples of the output's become a max_pool2d)"
        )
    kernel = [h // oh, w // ow]
    return torch.ops.aten.max_pool2d_with_indices.default(x, kernel, kernel)


def _decomposed(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    import torch

    table = torch.export.default_decompositions()
    table[torch.ops.aten.adaptive_max_pool2d.default] = _adaptive_max_pool2d
    return program.run_decompositions(table)


def quantized(
    program: torch.export.ExportedProgram, calibration: Iterable[torch.Tensor], per_channel: bool
) -> nn.Module:
    """Return ``program`` quantized to int8 by PT2E with the XNNPACK quantizer, its activation
    ranges calibrated on the ``calibration`` batches: symmetric int8 weights (one scale per
    output channel with ``per_channel``) and asymmetric int8 activations, XNNPACK's scheme."""
    import torch

    with quiet_imports():
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel))
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        for x in calibration:
            prepared(x)
    return convert_pt2e(prepared)


def lower(program: torch.export.ExportedProgram, log: Path) -> bytes:
    """Lower ``program`` with the XNNPACK delegate and return the ``.pte`` file's bytes."""
    import torch

    with quiet_imports():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

    from fwk.export.capture import log_traceback, output_to

    try:
        # quiet_imports: lowering imports more of ExecuTorch as it goes. oneDNN and NNPACK off: the
        # XNNPACK passes re-trace each conv, asking which CPU kernel eager would pick, and their
        # rules on the batch size (>= 16) bound the batch axis to the example's side of it
        # (ExecuTorch then plans memory for 15 rows). Eager's kernel plays no part in the program.
        off = torch.backends.mkldnn.flags(enabled=False), torch.backends.nnpack.flags(enabled=False)
        with output_to(log), quiet_imports(), off[0], off[1]:
            edge = to_edge_transform_and_lower(_decomposed(program), partitioner=[XnnpackPartitioner()])
            return bytes(edge.to_executorch().buffer)
    except UserError:
        raise
    except Exception as exc:
        log_traceback(log)
        said = str(exc).strip()
        op = re.search(r"Operator (\S+) is not in Core ATen", said)
        what = f"{op.group(1)} is not an op ExecuTorch runs" if op else (said.splitlines() or [type(exc).__name__])[0]
        raise UserError(f"cannot lower the model to ExecuTorch: {what} (full log: {log})") from None


def loader(path: Path) -> Callable[[Any], Any]:
    """Return a callable running the ``.pte`` at ``path`` with ExecuTorch's Python runtime."""
    with quiet_imports():
        from executorch.runtime import Runtime

    forward = Runtime.get().load_program(path).load_method("forward")
    return lambda x: forward.execute([x.contiguous()])[0]
